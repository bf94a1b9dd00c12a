"""specrag's SDK worker launcher: Beam's container contract for PROCESS and EXTERNAL
environments, so that every worker runs with the job's pipeline options.

Why: the apache-beam wheel ships no boot executable (Beam's Go boot lives in its SDK container
images), and Beam's worker pool, without one, starts an ``SdkHarness`` directly: that worker
never asks the runner's provision service for the job's options, so Beam's filesystems have
none (``s3://`` fails with "Must provide one of client or options", ``gs://`` has no project or
endpoint). This launcher does the part of the container's boot that a machine with specrag
installed needs: it asks the provision service for the options and endpoints, then runs Beam's
own ``sdk_worker_main`` with them. Staged artifacts are not installed: the worker's Python must
already have this specrag (a PROCESS environment runs the launcher's own installation).

How:
  Flink, Prism (PROCESS):  --environment_type=PROCESS
                           --environment_config='{"command": "/path/to/.venv/bin/specrag-worker"}'
  a worker pool (EXTERNAL): specrag-worker pool --port 50000
                           then --environment_type=EXTERNAL --environment_config=127.0.0.1:50000
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import sys
from pathlib import Path

SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def executable() -> str:
    """The path of this launcher's console script (the command runners and pools start)."""
    beside = Path(sys.executable).with_name("specrag-worker")
    found = str(beside) if beside.is_file() else shutil.which("specrag-worker")
    if not found:
        raise SystemExit("specrag-worker is not installed beside this Python: reinstall specrag")
    return found


def process_environment() -> list[str]:
    """The Beam flags that start each SDK worker with this launcher in a PROCESS environment."""
    import json
    return ["--environment_type=PROCESS", "--environment_config=" + json.dumps({"command": executable()})]


def _descriptor(url: str) -> str:
    from apache_beam.portability.api import endpoints_pb2
    from google.protobuf import text_format
    return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))


def worker_environment(args: argparse.Namespace) -> dict[str, str]:
    """The environment ``sdk_worker_main`` reads, from the runner's provision service: the
    job's pipeline options, the control and logging endpoints, the runner's capabilities."""
    import grpc
    from apache_beam.portability.api import beam_provision_api_pb2 as provision
    from apache_beam.portability.api import beam_provision_api_pb2_grpc as provision_grpc
    from google.protobuf import json_format
    worker_id = args.id.strip("'\"")  # Prism passes --id='<id>' with the quotes in the value
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = provision_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            provision.GetProvisionInfoRequest(), metadata=[("worker_id", worker_id)], timeout=60).info
    env = dict(os.environ, WORKER_ID=worker_id,
               PIPELINE_OPTIONS=json_format.MessageToJson(info.pipeline_options),
               CONTROL_API_SERVICE_DESCRIPTOR=_descriptor(args.control_endpoint or info.control_endpoint.url),
               RUNNER_CAPABILITIES=" ".join(info.runner_capabilities))
    logging_url = args.logging_endpoint or info.logging_endpoint.url
    if logging_url:
        env["LOGGING_API_SERVICE_DESCRIPTOR"] = _descriptor(logging_url)
    if info.status_endpoint.url:
        env["STATUS_API_SERVICE_DESCRIPTOR"] = _descriptor(info.status_endpoint.url)
    if args.semi_persist_dir:
        env["SEMI_PERSISTENT_DIRECTORY"] = args.semi_persist_dir
    return env


def boot(argv: list[str]) -> None:
    """Beam's boot contract: ``--id --provision_endpoint`` (and, from a pool, the control,
    logging and artifact endpoints); replaces this process with the SDK worker."""
    parser = argparse.ArgumentParser(prog="specrag-worker")
    for flag in ("id", "provision_endpoint", "control_endpoint", "logging_endpoint", "artifact_endpoint",
                 "semi_persist_dir"):
        parser.add_argument(f"--{flag}", default="")
    args, _ = parser.parse_known_args(argv)
    if not args.provision_endpoint:
        parser.error("--provision_endpoint is required: a Beam runner or worker pool starts this command")
    env = worker_environment(args)
    # Beam's pool gives its workers a stdout pipe it never reads: a worker that logs to stdout
    # would block once the pipe fills, so stdout goes where stderr goes
    os.dup2(2, 1)
    os.execve(sys.executable, [sys.executable, "-m", SDK_WORKER_MAIN], env)


def serve_pool(port: int, host: str = "127.0.0.1") -> None:
    """A worker pool (Beam's EXTERNAL environment) on ``host:port`` whose workers start
    through this launcher; Beam's own ``worker_pool_main`` binds every interface."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer, kill_process_gracefully
    from apache_beam.utils import thread_pool_executor
    pool = BeamFnExternalWorkerPoolServicer(use_process=True, container_executable=executable())
    server = grpc.server(thread_pool_executor.shared_unbounded_instance())
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise SystemExit(f"specrag-worker pool: cannot listen on {host}:{port}")

    def stop(*_):
        for process in list(pool._worker_processes.values()):
            kill_process_gracefully(process)
        server.stop(0)

    atexit.register(stop)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.start()
    print(f"specrag worker pool listening on {host}:{bound}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> None:
    """``specrag-worker pool --port N`` serves a worker pool; anything else is a runner
    starting one worker (Beam's boot flags)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pool"]:
        parser = argparse.ArgumentParser(prog="specrag-worker pool",
                                         description="A Beam worker pool (EXTERNAL environment) on 127.0.0.1.")
        parser.add_argument("--port", type=int, required=True)
        serve_pool(parser.parse_args(argv[1:]).port)
    else:
        boot(argv)


if __name__ == "__main__":
    main()

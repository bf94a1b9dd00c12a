#!/usr/bin/env python3
"""A Kafka broker and Beam's Java Kafka IO beside the local Flink cluster, all on 127.0.0.1.

``specrag answer --streaming --queries kafka://HOST:PORT/TOPIC`` reads with Beam's
``ReadFromKafka``, a cross-language transform: a Java expansion service turns it into Java's
KafkaIO when the job is built, and a Java SDK harness runs it when the job runs. This starts,
from jars resolved from Maven Central and checked against ``kafka/*.sha256`` (no Docker):

- a single-node broker in KRaft mode (its own controller), its log folder formatted on start;
- Beam's expansion service, which gives the Kafka read an EXTERNAL environment;
- that environment: a Java worker pool (``ExternalWorkerService``) the TaskManagers ask for a
  Java SDK worker, as they ask specrag-worker for Python ones.

Standard library only, like launch.py::

    python deploy/flink/kafka_services.py install
    python deploy/flink/kafka_services.py start               # detached; prints the broker and the flags
    specrag answer --streaming --queries kafka://127.0.0.1:9092/queries ... \\
        $(python deploy/flink/launch.py flags) $(python deploy/flink/kafka_services.py flags)
    python deploy/flink/kafka_services.py stop

``flags`` prints ``--beam_services={"sdks:java:io:expansion-service:shadowJar":"127.0.0.1:P"}``:
Beam's own option for a pre-started expansion service, which ReadFromKafka then uses instead of
downloading Beam's expansion service jar and running Kafka in Docker.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path



def _launch():
    """launch.py beside this file, by path (a script folder on sys.path would shadow the
    `kafka` package of the tests' producer)."""
    import importlib.util
    name = "specrag_flink_launch"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "launch.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


_L = _launch()
ENGINE, HERE, JarSet, free_port, _listening = _L.ENGINE, _L.HERE, _L.JarSet, _L.free_port, _L._listening

BROKER = JarSet("kafka broker", HERE / "kafka" / "broker.pom.xml", HERE / "kafka" / "broker.sha256",
                ENGINE / "kafka-broker.classpath")
JAVA_IO = JarSet("Beam's Java Kafka IO", HERE / "kafka" / "java-io.pom.xml", HERE / "kafka" / "java-io.sha256",
                 ENGINE / "kafka-java-io.classpath")
KAFKA_FOLDER = ENGINE / "kafka"
EXPANSION_TARGET = "sdks:java:io:expansion-service:shadowJar"  # the key Beam's ReadFromKafka looks up
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
EXPANSION_MAIN = "org.apache.beam.sdk.expansion.service.ExpansionService"
WORKER_POOL_MAIN = "org.apache.beam.fn.harness.ExternalWorkerService"


def install(quiet: bool = True) -> None:
    BROKER.install(quiet)
    JAVA_IO.install(quiet)


class Kafka:
    """A broker, an expansion service and a Java worker pool, each its own JVM bound to
    127.0.0.1 (Beam's two gRPC services bind every interface: see the deployment guide), with
    their configuration, data and logs in ``folder``."""

    def __init__(self, folder: Path = KAFKA_FOLDER, port: int = 0, env: dict[str, str] | None = None):
        self.folder = Path(folder)
        self.port, self.controller_port = port or free_port(), free_port()
        self.expansion_port, self.pool_port = free_port(), free_port()
        self.env = dict(os.environ if env is None else env)
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def write_config(self) -> Path:
        data = self.folder / "data"
        settings = {
            "process.roles": "broker,controller", "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data), "num.partitions": 2, "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1, "group.initial.rebalance.delay.ms": 0,
        }
        path = self.folder / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _java(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        return _L.start_java(self.folder, name, args, env or self.env, self.processes)

    def start(self, timeout: float = 120) -> "Kafka":
        broker, java_io = BROKER.classpath(), JAVA_IO.classpath()
        if _L.stages_no_jars():  # a job of launch.py's cluster names StageNoJars: these read its options too
            java_io += os.pathsep + str(_L.STAGE_NO_JARS_JAR)
        (self.folder / "log").mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        if not (self.folder / "data" / "meta.properties").is_file():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            subprocess.run(["java", "-cp", broker, STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(config)],
                           check=True, capture_output=True, env=self.env)
        self._java("broker", ["-Xmx512m", "-cp", broker, BROKER_MAIN, str(config)])
        options = {"beam:option:environment_options:v1": [f"external_service_address=127.0.0.1:{self.pool_port}"]}
        self._java("java-worker-pool", ["-Xmx512m", "-cp", java_io, WORKER_POOL_MAIN],
                   env=dict(self.env, PIPELINE_OPTIONS=json.dumps(options)))
        self._java("expansion-service", ["-Xmx256m", "-cp", java_io, EXPANSION_MAIN, str(self.expansion_port),
                                         "--defaultEnvironmentType=EXTERNAL",
                                         f"--defaultEnvironmentConfig=127.0.0.1:{self.pool_port}"])
        deadline = time.time() + timeout
        for name, port in (("broker", self.port), ("java-worker-pool", self.pool_port),
                           ("expansion-service", self.expansion_port)):
            while not _listening(port):
                if self.processes[name].poll() is not None:
                    raise RuntimeError(f"Kafka's {name} exited ({self.processes[name].returncode}); "
                                       f"see {self.folder}/log/{name}.log")
                if time.time() > deadline:
                    raise RuntimeError(f"Kafka's {name} did not listen within {timeout:.0f} s; see {self.folder}/log")
                time.sleep(0.3)
        (self.folder / "kafka.json").write_text(json.dumps(self.describe(), indent=2))
        return self

    def kill(self, name: str) -> None:
        _L.kill(self.processes, name)

    def stop(self) -> None:
        _L.stop_all(self.processes)
        (self.folder / "kafka.json").unlink(missing_ok=True)

    def describe(self) -> dict:
        return {"bootstrap": self.bootstrap, "expansion_service": f"127.0.0.1:{self.expansion_port}",
                "java_worker_pool": f"127.0.0.1:{self.pool_port}",
                "pids": {name: proc.pid for name, proc in self.processes.items()}}

    def flags(self) -> list[str]:
        return job_flags(self.describe())

    def __enter__(self) -> "Kafka":
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()


def job_flags(described: dict) -> list[str]:
    """Beam's option naming a pre-started expansion service for ReadFromKafka."""
    return ["--beam_services=" + json.dumps({EXPANSION_TARGET: described["expansion_service"]},
                                            separators=(",", ":"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="resolve and check the broker's and Beam's Java Kafka IO's jars (idempotent)")
    start = sub.add_parser("start", help="start a detached broker, expansion service and Java worker pool")
    start.add_argument("--port", type=int, default=9092, help="the broker's port on 127.0.0.1")
    sub.add_parser("stop", help="stop what `start` started")
    flags = sub.add_parser("flags", help="print the flags that let a job read Kafka through the running services")
    for command in (start, sub.choices["stop"], flags):
        command.add_argument("--folder", type=Path, default=KAFKA_FOLDER, help="the broker's data and the logs")
    args = parser.parse_args(argv)
    state = args.folder / "kafka.json" if args.command != "install" else None
    if args.command == "install":
        install(quiet=False)
    elif args.command == "start":
        if state.is_file():
            raise SystemExit(f"Kafka is running (see {state}); `kafka_services.py stop` first")
        install()
        kafka = Kafka(args.folder, args.port).start()
        print(f"Kafka broker on {kafka.bootstrap}: --queries kafka://{kafka.bootstrap}/TOPIC "
              f"{' '.join(kafka.flags())}")
    elif args.command == "stop":
        _L.stop_recorded(state, "Kafka is not running")
    elif args.command == "flags":
        if not state.is_file():
            raise SystemExit("Kafka is not running: `python deploy/flink/kafka_services.py start`")
        print(" ".join(job_flags(json.loads(state.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Install and run a real Triton Inference Server on this machine's CPU, on ``model_repo/``.

The server is the ``tritonserver`` binary bundled in ``nvidia-pytriton`` (with its Python
backend), in a virtualenv of its own (``.venv-triton``: pytriton pins numpy<2). Standard
library only, so any Python can drive it; tests import it, operators run it:

    python deploy/triton/launch.py install          # idempotent
    python deploy/triton/launch.py serve            # foreground, 127.0.0.1:8000/8001/8002
    python deploy/triton/launch.py check            # install, start, list models, stop

How the bundled server is made to run (each learnt the hard way): a backend folder holding
``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub built for the venv's
Python version; ``PATH`` starting with the venv's ``bin`` so the embedded interpreter takes
the venv as ``sys.prefix``; ``LD_LIBRARY_PATH`` = the bundled libs + the Python ``LIBDIR``
(else the stub loads the system libpython and crashes); addresses bound to 127.0.0.1.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL_REPO = ROOT / "model_repo"


def default_venv() -> Path:
    return Path(os.environ.get("SPECRAG_TRITON_VENV", ROOT / ".venv-triton"))


class TritonStartError(RuntimeError):
    """The server exited or never became ready; the message carries its log."""


def install(venv: Path | None = None, quiet: bool = True) -> Path:
    """The server's virtualenv, from its hash lock (``deploy/triton/install.py``, as every engine
    venv: ``deploy/locked_venv.py``); a no-op when installed from this lock already."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("specrag_triton_install", HERE / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    venv = Path(venv or default_venv())
    if quiet:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            return module.TRITON.install(venv)
    return module.TRITON.install(venv)


def _venv_facts(venv: Path) -> dict:
    code = ("import json, sys, sysconfig, pathlib, pytriton;"
            "print(json.dumps({'version': f'{sys.version_info[0]}.{sys.version_info[1]}',"
            "'libdir': sysconfig.get_config_var('LIBDIR'),"
            "'pytriton': str(pathlib.Path(pytriton.__file__).parent)}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise TritonStartError(f"{venv} is not an installed Triton venv (run `launch.py install`):\n{out.stderr}")
    return json.loads(out.stdout)


def backend_dir(venv: Path, facts: dict) -> Path:
    """A backends folder with the Python backend and the stub for the venv's Python."""
    bundled = Path(facts["pytriton"]) / "tritonserver"
    target = venv / "specrag-backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    stub = bundled / "python_backend_stubs" / facts["version"] / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonStartError(f"pytriton bundles no Python-backend stub for Python {facts['version']}")
    for src in [*sorted((bundled / "backends" / "python").glob("*.*")), stub]:
        if src.is_file():
            dst = target / src.name
            if not dst.exists() or dst.stat().st_size != src.stat().st_size:
                shutil.copy2(src, dst)
    return target.parent


def _server_process():
    """``inference/server_process.py``, the one launcher of specrag's engine servers, loaded by its
    path: this script runs under any Python, specrag installed or not."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("specrag_server_process", ROOT / "inference" / "server_process.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_launcher = _server_process()
free_port = _launcher.free_port


class TritonServer:
    """One tritonserver process on 127.0.0.1; a context manager that stops it on exit."""

    def __init__(self, model_repo: Path = MODEL_REPO, venv: Path | None = None, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, threads: int = 1,
                 log_path: Path | None = None, extra_args: tuple[str, ...] = (), env: dict | None = None):
        self.model_repo = Path(model_repo).resolve()
        self.venv = Path(venv or default_venv())
        self.host = "127.0.0.1"
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.threads = threads
        self.log_path = Path(log_path) if log_path else self.venv / "logs" / f"tritonserver-{self.grpc_port}.log"
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(env or {})
        self._server = None  # the server's process group (inference/server_process.py)

    @property
    def grpc_url(self) -> str:
        return f"grpc://{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, facts: dict) -> list[str]:
        binary = Path(facts["pytriton"]) / "tritonserver" / "bin" / "tritonserver"
        return [str(binary), f"--model-repository={self.model_repo}",
                f"--backend-directory={backend_dir(self.venv, facts)}",
                f"--http-address={self.host}", f"--http-port={self.http_port}",
                f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
                f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                "--exit-timeout-secs=10", *self.extra_args]

    def environment(self, facts: dict) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        libs = Path(facts["pytriton"]).parent / "nvidia_pytriton.libs"
        env.update({
            "PATH": f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            "LD_LIBRARY_PATH": ":".join(p for p in (str(libs), facts["libdir"], env.get("LD_LIBRARY_PATH")) if p),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
            "SPECRAG_TRITON_THREADS": str(self.threads),
        })
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 600.0) -> "TritonServer":
        if not self.model_repo.is_dir():
            raise TritonStartError(f"model repository {self.model_repo} does not exist")
        facts = _venv_facts(self.venv)
        self._server = _launcher.ServerProcess("tritonserver", self.command(facts), self.environment(facts),
                                               self.log_path, self.is_ready, TritonStartError)
        self._server.start(timeout_s)
        return self

    @property
    def process(self):
        return self._server.process if self._server else None

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 60) -> str:
        return self._server.log_tail(lines) if self._server else "(not started)"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Triton finishes in-flight requests), then SIGKILL to whatever of it lingers."""
        if self._server:
            self._server.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL the server and its model stubs at once (what a crash looks like)."""
        if self._server:
            self._server.kill()

    def __enter__(self) -> "TritonServer":
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


TEMPLATES = Path(__file__).resolve().parent
# trained models served from templates: Triton model name -> (what trains one, placeholder)
TRAINED = {"utility": ("specrag train-utility", "UTILITY_MODEL_FOLDER"),
           "denoiser": ("specrag train-denoiser", "DENOISER_MODEL_FOLDER")}


def with_trained_models(model_repo: Path, trained: dict[str, Path], out_dir: Path) -> Path:
    """A repository serving ``model_repo``'s models plus trained ones (``utility``: AED-RAG's
    predictor, ``rerank``; ``denoiser``: SARDI's, ``denoise``): model folders are linked, each
    trained model's config is its template with the weights' folder filled in (clients name
    the same folder)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, weights in trained.items():
        if name not in TRAINED:
            raise TritonStartError(f"no template for a trained model {name!r}; known: {', '.join(TRAINED)}")
        folder = Path(weights).resolve()
        if not (folder / "specrag_model.json").is_file():
            raise TritonStartError(f"{folder} is not a model specrag trained (no specrag_model.json); "
                                   f"train one with `{TRAINED[name][0]}`")
    for model in sorted(Path(model_repo).iterdir()):
        if model.is_dir() and model.name not in trained and not (out_dir / model.name).exists():
            (out_dir / model.name).symlink_to(model.resolve(), target_is_directory=True)
    for name, weights in trained.items():
        target = out_dir / name
        if target.exists() or target.is_symlink():
            shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        shutil.copytree(TEMPLATES / name, target)
        config = target / "config.pbtxt"
        config.write_text(config.read_text().replace(TRAINED[name][1], str(Path(weights).resolve())))
    return out_dir


# what a Triton model of each specrag model kind serves, and the config each op's model is made from
KIND_OPS = {"causal-lm": ("generate", "score", "fused_decode"), "encoder": ("embed",),
            "cross-encoder": ("rerank",), "masked-diffusion": ("denoise",)}
OP_TEMPLATES = {"generate": MODEL_REPO / "generator", "score": MODEL_REPO / "scorer",
                "fused_decode": MODEL_REPO / "fused_decoder", "embed": MODEL_REPO / "embedder",
                "rerank": TEMPLATES / "utility", "denoise": TEMPLATES / "denoiser"}


def model_kind(spec: str, venv: Path | None = None) -> str:
    """A --model SPEC's kind, read by specrag in the server's venv (this file stays stdlib-only)."""
    python = (venv or default_venv()) / "bin" / "python"
    code = "import sys; from specrag.inference.models import model_spec; print(model_spec(sys.argv[1]).kind)"
    out = subprocess.run([str(python if python.exists() else sys.executable), "-c", code, spec],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise TritonStartError(f"model {spec!r}: {(out.stderr.strip().splitlines() or ['unreadable'])[-1]}")
    return out.stdout.strip()


def _pairs(config: Path) -> tuple[str, str] | None:
    """A model config's (specrag_op, specrag_model), or None."""
    import re
    values = dict(re.findall(r'key: "(specrag_op|specrag_model)" value: \{ string_value: "([^"]*)" \}',
                             config.read_text()))
    return (values["specrag_op"], values["specrag_model"]) if len(values) == 2 else None


def served_pairs(repo: Path) -> set[tuple[str, str]]:
    """(specrag_op, specrag_model) of every model config in a repository."""
    return {pair for config in Path(repo).glob("*/config.pbtxt") if (pair := _pairs(config)) is not None}


def with_models(model_repo: Path, specs: list[str], out_dir: Path, kinds: dict[str, str] | None = None,
                venv: Path | None = None) -> Path:
    """A repository serving ``model_repo``'s models plus one Triton model per operation of each
    model a run names (``--model ROLE=SPEC``: a registered name, a folder, a GGUF file, a cached
    hub id), each made from its operation's template with ``specrag_model`` set to the spec (a
    path made absolute: clients' paths are compared resolved)."""
    import re
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in sorted(Path(model_repo).iterdir()):
        if model.is_dir() and not (out_dir / model.name).exists():
            (out_dir / model.name).symlink_to(model.resolve(), target_is_directory=True)
    served = served_pairs(out_dir)
    for spec in specs:
        spec = str(Path(spec).resolve()) if Path(spec).exists() else spec
        kind = (kinds or {}).get(spec) or model_kind(spec, venv)
        if kind not in KIND_OPS:
            raise TritonStartError(f"model {spec!r} is of kind {kind!r}; Triton serves {', '.join(KIND_OPS)}")
        for op in KIND_OPS[kind]:
            if (op, spec) in served:
                continue
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(spec).name)[:48]
            name = f"{op}-{slug}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"
            target = out_dir / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(OP_TEMPLATES[op], target, ignore=shutil.ignore_patterns("__pycache__"))
            config = target / "config.pbtxt"
            text = re.sub(r'^name: "[^"]*"', f'name: "{name}"', config.read_text(), flags=re.M)
            text = re.sub(r'(key: "specrag_model" value: \{ string_value: )"[^"]*"', lambda m: f'{m.group(1)}"{spec}"',
                          text)
            config.write_text(text)
            served.add((op, spec))
    return out_dir


def with_vllm_generator(model_repo: Path, spec: str, out_dir: Path, eager: bool = False, kv_cache_gb: int = 1) -> Path:
    """``model_repo`` with generate() for the weights ``spec`` served by vLLM's engine
    (deploy/triton/vllm_generator) instead of the local one; every other model as it was. The
    vLLM server it starts comes from ``.venv-vllm`` (``make install-vllm``)."""
    spec = str(Path(spec).resolve()) if Path(spec).exists() else spec
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in sorted(Path(model_repo).iterdir()):
        config = model / "config.pbtxt"
        if model.is_dir() and config.is_file() and _pairs(config) != ("generate", spec) \
                and not (out_dir / model.name).exists():
            (out_dir / model.name).symlink_to(model.resolve(), target_is_directory=True)
    target = out_dir / "generator_vllm"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(TEMPLATES / "vllm_generator", target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    text = config.read_text().replace("VLLM_MODEL", spec).replace(
        'key: "vllm_eager" value: { string_value: "false" }', f'key: "vllm_eager" value: {{ string_value: "{str(eager).lower()}" }}')
    config.write_text(text.replace('key: "vllm_kv_cache_gb" value: { string_value: "1" }',
                                   f'key: "vllm_kv_cache_gb" value: {{ string_value: "{kv_cache_gb}" }}'))
    return out_dir


def with_utility_model(model_repo: Path, utility_folder: Path, out_dir: Path) -> Path:
    """``model_repo`` plus AED-RAG's trained utility predictor (see ``with_trained_models``)."""
    return with_trained_models(model_repo, {"utility": utility_folder}, out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["install", "serve", "check"])
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--model-repo", type=Path, default=MODEL_REPO)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")),
                    help="torch threads per model instance")
    ap.add_argument("--utility-model", type=Path, default=None,
                    help="also serve AED-RAG's utility predictor from this `specrag train-utility` folder")
    ap.add_argument("--denoiser-model", type=Path, default=None,
                    help="also serve SARDI's denoiser from this `specrag train-denoiser` folder")
    ap.add_argument("--model", action="append", default=[], metavar="SPEC",
                    help="also serve this model (a registered name, a transformers folder, a GGUF file or a "
                         "cached hub id), one Triton model per operation its kind serves; repeatable")
    ap.add_argument("--vllm-generator", default=None, metavar="SPEC",
                    help="serve generate() for this model through vLLM's engine (its own vLLM server from "
                         ".venv-vllm: `make install-vllm`) instead of the local one")
    ap.add_argument("--verbose", action="store_true")
    args, extra = ap.parse_known_args(argv)
    venv = install(args.venv, quiet=not args.verbose)
    trained = {name: folder for name, folder in (("utility", args.utility_model), ("denoiser", args.denoiser_model))
               if folder is not None}
    if trained:
        import tempfile
        args.model_repo = with_trained_models(args.model_repo, trained,
                                              Path(tempfile.mkdtemp(prefix="specrag-model-repo-")))
    if args.model:
        import tempfile
        args.model_repo = with_models(args.model_repo, args.model, Path(tempfile.mkdtemp(prefix="specrag-model-repo-")),
                                      venv=venv)
    if args.vllm_generator:
        import tempfile
        args.model_repo = with_vllm_generator(args.model_repo, args.vllm_generator,
                                              Path(tempfile.mkdtemp(prefix="specrag-model-repo-")))
    if args.command == "install":
        print(f"Triton server venv ready: {venv}")
        return 0
    ports = {} if args.command == "check" else dict(http_port=args.http_port, grpc_port=args.grpc_port,
                                                    metrics_port=args.metrics_port)
    server = TritonServer(args.model_repo, venv, threads=args.threads, extra_args=tuple(extra), **ports)
    stop = lambda *_: (server.stop(), sys.exit(0))  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    with server:
        with urllib.request.urlopen(f"{server.http_url}/v2/repository/index", data=b"{}") as r:
            models = json.loads(r.read())
        print(f"tritonserver ready: {server.grpc_url} (gRPC), {server.http_url} (HTTP), metrics "
              f"{server.metrics_url}; models: {', '.join(m['name'] + ' ' + m.get('state', '') for m in models)}",
              flush=True)
        if args.command == "serve":
            try:
                server.process.wait()
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

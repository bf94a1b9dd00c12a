"""vLLM's OpenAI-compatible server for one model, started from vLLM's own virtualenv.

The ``vllm`` backend (``inference/vllm.py``) runs one such server per worker process and model:
vLLM cannot be imported beside specrag (``deploy/vllm/install.py`` says why), and its engine
already runs as a front end feeding an engine-core process; the OpenAI server is that front end
over HTTP, the way vLLM is deployed and the way Beam's own vLLM model handler runs it. The
server binds 127.0.0.1 only, and exits with the process that started it (``PR_SET_PDEATHSIG``),
so a killed worker leaves no engine computing. It runs in a process group of its own, which
``stop()`` ends whole: vLLM's engine-core and worker processes outlive a server killed with
SIGKILL (2.5 GB each for SmolLM2; the tests' OOM of 2026-12-05 was such orphans).

    with VllmServer(VllmServerConfig("smollm2-135m-instruct", "/path/to/folder")) as server:
        print(server.url)   # http://127.0.0.1:PORT
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


class VllmStartError(RuntimeError):
    """The server exited or never became ready; the message carries its log's tail."""


def vllm_python() -> Path:
    """The vLLM venv's interpreter: ``$SPECRAG_VLLM_VENV`` or the checkout's ``.venv-vllm``
    (``make install-vllm``)."""
    venv = os.environ.get("SPECRAG_VLLM_VENV")
    root = Path(__file__).resolve().parents[1]
    python = Path(venv or root / ".venv-vllm") / "bin" / "python"
    if not python.exists():
        raise VllmStartError(f"the vllm backend needs vLLM's virtualenv, and {python} does not exist: run "
                             "`make install-vllm` (or set SPECRAG_VLLM_VENV), or give --vllm-url of a running "
                             "vLLM server")
    return python


@dataclass(frozen=True)
class VllmServerConfig:
    """One model's server: ``folder`` holds its weights (``models.materialise``)."""

    name: str  # the served model name (specrag's registered name)
    folder: str
    dtype: str = "float32"
    threads: int = 1
    kv_cache_gb: int = 1  # VLLM_CPU_KVCACHE_SPACE: the paged KV cache, whole GiB
    max_model_len: int = 4096
    max_num_seqs: int = 64  # sequences in one engine step
    prefix_caching: bool = True
    eager: bool = False  # no torch.compile: starts in seconds, runs slower (tests)
    seed: int = 0
    embed: bool = False  # vLLM's pooling runner for an encoder (embeddings), not its generate runner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # in the child, before exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VllmServer:
    """A running ``vllm.entrypoints.openai.api_server`` on 127.0.0.1; ``stop()`` ends it."""

    def __init__(self, config: VllmServerConfig, log_dir: Path | None = None):
        self.config = config
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        from specrag.inference.models import cache_dir
        self.log_path = Path(log_dir or Path(cache_dir()) / "vllm-logs") / f"{config.name}-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Lock()  # rows that find the server dead stop it from several threads

    def command(self) -> list[str]:
        c = self.config
        cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", c.folder,
               "--served-model-name", c.name, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", c.dtype, "--max-model-len", str(c.max_model_len), "--max-num-seqs", str(c.max_num_seqs),
               "--seed", str(c.seed), "--generation-config", "vllm", "--max-logprobs", "1"]
        if c.embed:
            # vLLM 0.32 will not start an encoder-only model with prefix caching ("HybridKVCacheCoordinator
            # requires at least one cacheable group"); an embedding reads each text once anyway
            cmd += ["--runner", "pooling", "--convert", "embed", "--no-enable-prefix-caching"]
        else:
            cmd.append("--enable-prefix-caching" if c.prefix_caching else "--no-enable-prefix-caching")
        if c.eager:
            cmd.append("--enforce-eager")
        return cmd

    def environment(self) -> dict:
        from specrag.inference.models import cache_dir
        # nothing of the starting process's Python or libraries (a Triton stub's LD_LIBRARY_PATH holds
        # pytriton's bundled libraries)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH")}
        venv_lib = vllm_python().parent.parent / "lib"
        preload = [p for p in (TCMALLOC, *map(str, sorted(venv_lib.glob("libiomp5.so")))) if Path(p).exists()]
        env.update({
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_CPU_KVCACHE_SPACE": str(self.config.kv_cache_gb),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # Beam's worker shares the cores; OMP_NUM_THREADS sets them
            "OMP_NUM_THREADS": str(self.config.threads), "MKL_NUM_THREADS": str(self.config.threads),
            "VLLM_CACHE_ROOT": str(Path(cache_dir()) / "vllm"),  # torch.compile's artefacts, reused
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        })
        if preload:
            env["LD_PRELOAD"] = ":".join(preload + [env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else preload)
        return env

    def start(self, timeout_s: float = 900.0) -> "VllmServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            env=self.environment(), preexec_fn=_die_with_parent,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmStartError(f"vLLM's server for {self.config.name} exited with code "
                                     f"{self.process.returncode} before it was ready; log {self.log_path}:\n"
                                     f"{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise VllmStartError(f"vLLM's server for {self.config.name} not ready after {timeout_s:.0f}s; "
                             f"log {self.log_path}:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as r:
                return any(m["id"] == self.config.name for m in json.load(r)["data"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def exited(self) -> int | None:
        """The server's exit code once it has exited (its group then stopped too), else None."""
        code = self.process.poll() if self.process else None
        if code is not None:
            self.stop()
        return code

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the server's process group (vLLM shuts its engine down), SIGKILL to whatever
        of the group is left after ``timeout_s``."""
        with self._stopping:
            self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> None:
        if self.process is None:
            return
        group = self.process.pid  # its own session: the group id is its pid
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

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

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specrag.inference.server_process import ServerProcess, free_port

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
    block_size: int | None = None  # tokens per KV block (None: vLLM's choice for the platform)


class VllmServer:
    """A running ``vllm.entrypoints.openai.api_server`` on 127.0.0.1; ``stop()`` ends it."""

    def __init__(self, config: VllmServerConfig, log_dir: Path | None = None):
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        from specrag.inference.models import cache_dir
        self.log_path = Path(log_dir or Path(cache_dir()) / "vllm-logs") / f"{config.name}-{self.port}.log"
        self._server: ServerProcess | None = None

    def command(self) -> list[str]:
        c = self.config
        cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", c.folder,
               "--served-model-name", c.name, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", c.dtype, "--max-model-len", str(c.max_model_len), "--max-num-seqs", str(c.max_num_seqs),
               "--seed", str(c.seed), "--generation-config", "vllm", "--max-logprobs", "1",
               "--enable-prompt-tokens-details"]  # each answer's cached prompt tokens (usage)
        if c.embed:
            # vLLM 0.32 will not start an encoder-only model with prefix caching ("HybridKVCacheCoordinator
            # requires at least one cacheable group"); an embedding reads each text once anyway
            cmd += ["--runner", "pooling", "--convert", "embed", "--no-enable-prefix-caching"]
        else:
            cmd.append("--enable-prefix-caching" if c.prefix_caching else "--no-enable-prefix-caching")
        if c.eager:
            cmd.append("--enforce-eager")
        if c.block_size:
            cmd += ["--block-size", str(c.block_size)]
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
        self._server = ServerProcess(f"vLLM's server for {self.config.name}", self.command(), self.environment(),
                                     self.log_path, self.ready, VllmStartError, die_with_parent=True)
        self._server.start(timeout_s)
        return self

    @property
    def process(self):
        return self._server.process if self._server else None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as r:
                return any(m["id"] == self.config.name for m in json.load(r)["data"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        return self._server.log_tail(lines) if self._server else "(not started)"

    def exited(self) -> int | None:
        """The server's exit code once it has exited (its group then killed too), else None."""
        return self._server.exited() if self._server else None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the server's process group (vLLM shuts its engine down), SIGKILL to whatever
        of the group is left after ``timeout_s``."""
        if self._server:
            self._server.stop(timeout_s)

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

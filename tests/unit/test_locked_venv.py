"""The engine venvs' lock (deploy/locked_venv.py): what a relock writes from pip's install report,
and that the committed locks are what the installers install."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import load_script

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _item(name: str, version: str, archive: dict) -> dict:  # one entry of `pip install --report`
    return {"metadata": {"name": name, "version": version},
            "download_info": {"url": f"https://files/{name}.whl", "archive_info": archive}}


def test_a_relock_pins_every_installed_package_by_hash_but_torch_and_the_unused_ones(tmp_path):
    locked = load_script(DEPLOY / "locked_venv.py", "locked_venv")
    venv = locked.LockedVenv(name="engine", requirements=("engine==1.0",), lock=tmp_path / "requirements.lock",
                             check_code="", unused=("torchvision",))
    report = {"install": [
        _item("Zeta", "2.0", {"hashes": {"sha256": "b" * 64}}),
        _item("torch", "2.13.0+cpu", {"hashes": {"sha256": "c" * 64}}),  # the shared wheel, not the lock's
        _item("torchvision", "0.28.0", {"hashes": {"sha256": "d" * 64}}),  # CUDA-built: left out
        _item("alpha", "1.0", {"hash": "sha256=" + "a" * 64}),  # older reports: one "hash" string
    ]}
    lines = venv.lock_text(report).splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        f"alpha==1.0 --hash=sha256:{'a' * 64}", f"Zeta==2.0 --hash=sha256:{'b' * 64}"]
    assert "torch==2.13.0+cpu" in lines[1] and "torchvision" in lines[1]
    with pytest.raises(SystemExit, match="no sha256 for beta==3.0"):
        venv.lock_text({"install": [_item("beta", "3.0", {})]})


@pytest.mark.parametrize("engine", ["vllm", "openvino"])
def test_the_committed_locks_pin_every_line_by_hash_and_hold_the_engine(engine):
    install = load_script(DEPLOY / engine / "install.py", f"{engine}_install")
    venv = next(v for v in vars(install).values() if type(v).__name__ == "LockedVenv")
    pins = [line for line in venv.lock.read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s]+ --hash=sha256:[0-9a-f]{64}", line) for line in pins)
    names = {line.split("==")[0].lower() for line in pins}
    assert not names & {"torch", *venv.unused}
    assert {r.split("==")[0].split("[")[0].lower() for r in venv.requirements} <= names

"""benchmarks/speculative_rag_pays.py: its long training run across machines: a run stopped at its
deadline leaves a copy of its state outside runs/, a machine without runs/ resumes from that copy, and
a finished run drops it. The training itself is a stand-in process here (the real one takes hours;
tests/models/test_drafter.py resumes a real one after a kill); and the claim values its report pools
from the suites' comparisons."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture()
def srp(tmp_path, monkeypatch):
    module = load_script(BENCHMARKS / "speculative_rag_pays.py", "speculative_rag_pays")
    monkeypatch.setattr(module, "WORK", tmp_path / "runs")
    monkeypatch.setattr(module, "KEPT_STATES", tmp_path / "kept")
    monkeypatch.setattr(module, "rationale_subset", lambda n, refresh=False: tmp_path / "rationales.parquet")
    monkeypatch.setattr(module.os, "killpg", lambda pid, sig: None)
    return module


class _Training:
    """What Popen returns: a training that saves ``state`` (and with ``finish`` its manifest), and
    outlives its deadline unless it finishes."""

    def __init__(self, folder: Path, state: bytes, finish: bool):
        self.folder, self.state, self.finish, self.pid = folder, state, finish, -1

    def wait(self, timeout=None):
        from specrag.training.drafter import MANIFEST
        from specrag.training.state import STATE_FILE, partial_dir
        partial_dir(self.folder).mkdir(parents=True, exist_ok=True)
        (partial_dir(self.folder) / STATE_FILE).write_bytes(self.state)
        if self.finish:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / MANIFEST).write_text("{}")
        elif timeout and timeout > 600:  # the deadline, not the wait after SIGTERM
            raise subprocess.TimeoutExpired("train-drafter", timeout)
        return 0


def _popen(srp, monkeypatch, state: bytes, finish: bool = False) -> list[list[str]]:
    calls = []

    def popen(cmd, **kwargs):
        calls.append(cmd)
        return _Training(srp.drafter_folder(None), state, finish)
    monkeypatch.setattr(srp.subprocess, "Popen", popen)
    return calls


def test_a_stopped_run_is_kept_resumed_elsewhere_and_dropped_when_done(srp, monkeypatch, tmp_path):
    from specrag.training.state import STATE_FILE, partial_dir
    calls = _popen(srp, monkeypatch, b"step 20")
    srp.train(None, minutes=30, threads=1)
    assert "--resume" not in calls[0]  # a first start
    assert srp.kept_state(None).read_bytes() == b"step 20"  # copied out of runs/

    # another machine: no runs/ at all, the carried copy only
    import shutil
    shutil.rmtree(tmp_path / "runs")
    calls = _popen(srp, monkeypatch, b"step 40")
    seen = []
    original = _Training.wait

    def wait(self, timeout=None):  # what the resumed run finds before it trains
        seen.append((partial_dir(self.folder) / STATE_FILE).read_bytes())
        return original(self, timeout)
    monkeypatch.setattr(_Training, "wait", wait)
    srp.train(None, minutes=30, threads=1)
    assert "--resume" in calls[0] and seen[0] == b"step 20"
    assert srp.kept_state(None).read_bytes() == b"step 40"

    _popen(srp, monkeypatch, b"step 758", finish=True)
    srp.train(None, minutes=30, threads=1)
    assert not srp.kept_state(None).exists()  # the trained drafter's folder supersedes it


def test_the_suites_claim_values_pool_the_sets_as_the_issue_defines_them():
    """specrag_minus_standard: the mean over the sets of the paired difference; sets_better: the
    sets whose interval lies above zero; latency_ratio: latencies pooled over all the questions."""
    tables = load_script(BENCHMARKS / "speculative_rag_pays_tables.py", "speculative_rag_pays_tables")
    spec, std = tables.SPECRAG, tables.STANDARD

    def row(value, latency, n):
        return {"headline_metric": "contains", "contains": value, "mean_latency_s": latency, "n": n, "models": ""}
    report = {"datasets": ["A", "B"],
              "runs": [{"dataset": s, "label": m, "output": f"runs/{s}/{m}"} for s in "AB" for m in (spec, std)],
              "rows": {"A": {spec: row(50.0, 2.0, 30), std: row(40.0, 4.0, 30)},
                       "B": {spec: row(20.0, 6.0, 10), std: row(30.0, 6.0, 10)}},
              "baselines": {"A": [{"method": spec, "baseline": std, "difference": 10.0, "ci95": [2.0, 18.0], "n": 30}],
                            "B": [{"method": spec, "baseline": std, "difference": -10.0, "ci95": [-20.0, 1.0],
                                   "n": 10}]}}
    lines, values = tables.quality_lines(report, {"B": 63.0})
    assert values == {"specrag_minus_standard": 0.0, "sets_better": 1}
    assert any(line.startswith("| B's majority label |  | 63.0 |") for line in lines)
    lines, values = tables.latency_lines(report, floors=False)
    assert values == {"latency_ratio": round((2.0 * 30 + 6.0 * 10) / (4.0 * 30 + 6.0 * 10), 3)}

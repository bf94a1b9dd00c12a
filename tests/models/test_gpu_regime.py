"""benchmarks/gpu/regime.py, the prepared GPU check, at tiny shapes on this CPU: it runs from the
checkout without specrag installed (as on the GPU machine), its engine generates what Hugging
Face's greedy generate does for the same random model, RaLMSpec verifies in fewer searches than
RaLMSeq makes and rolls back when speculation misses, and it ends with its claim line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "regime.py"


@pytest.mark.parametrize("accept, rollbacks", [(0.925, False), (0.0, True)])
def test_the_gpu_check_runs_at_tiny_shapes_on_a_cpu(tmp_path, accept, rollbacks):
    out = tmp_path / "gpu_regime.md"
    run = subprocess.run([sys.executable, "-I", str(SCRIPT), "--tiny", "--device", "cpu", "--from-checkout",
                          "--reps", "1", "--accept", str(accept), "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    report = out.read_text()
    claim = report.strip().splitlines()[-1]
    values = dict(pair.split("=") for pair in claim.split())
    assert set(values) == {"speculative_rag_vs_standard", "ralmspec_vs_ralmseq", "engine_tok_s", "engine_vs_hf_generate"}
    assert all(float(v) > 0 for v in values.values())
    assert "| HF generate, the same |" in report and "(4/4 rows the same tokens)" in report
    seq = re.search(r"\| RaLMSeq \(16 tokens, a search every 4\) \| [\d.]+ s, (\d+) searches", report)
    spec = re.search(r"\| RaLMSpec .*? \| [\d.]+ s, ([\d.]+) searches, ([\d.]+) speculated steps, ([\d.]+) rollbacks",
                     report)
    assert int(seq.group(1)) == 4 and float(spec.group(2)) >= 3
    assert (float(spec.group(3)) > 0) == rollbacks
    if not rollbacks:
        assert float(spec.group(1)) < int(seq.group(1))

"""Evidence trajectories of iterative-retrieval methods (SARDI and its baselines).

A method whose trace has ``steps`` with ``doc_ids`` (the evidence each generation step saw)
gets, per query with gold passages: gold recall of the evidence in effect at 25%, 50% and
100% of its steps (the paper's Figure 5: "the fraction of gold passages in the current
retrieved set"), cumulative recall (every passage seen along the way) and retention (the
share of a step's documents still there at the next step, averaged over steps; the paper's
Appendix E: 83-90%).
"""
from __future__ import annotations

import math
from typing import Sequence

FRACTIONS = (0.25, 0.5, 1.0)
METRICS = (*(f"recall_at_{int(f * 100)}pct" for f in FRACTIONS), "cumulative_recall", "retention")


def evidence_at(steps: Sequence[Sequence[str]], fraction: float) -> Sequence[str]:
    """The evidence of the step at ``fraction`` of the generation (the first step at 0)."""
    if not steps:
        return []
    return steps[max(0, math.ceil(fraction * len(steps)) - 1)]


def _recall(docs: Sequence[str], gold: set[str]) -> float:
    return len(gold & set(docs)) / len(gold)


def retention(steps: Sequence[Sequence[str]]) -> float | None:
    """Mean over consecutive steps of |D_t ∩ D_t+1| / |D_t| (None for a one-step trajectory)."""
    shares = [len(set(a) & set(b)) / len(set(a)) for a, b in zip(steps, steps[1:]) if a]
    return sum(shares) / len(shares) if shares else None


def trajectory_metrics(steps: Sequence[Sequence[str]], gold: Sequence[str]) -> dict[str, float]:
    """The metrics of one query (empty without gold passages or steps)."""
    gold_set = set(gold)
    if not gold_set or not steps:
        return {}
    out = {f"recall_at_{int(f * 100)}pct": _recall(evidence_at(steps, f), gold_set) for f in FRACTIONS}
    out["cumulative_recall"] = _recall([d for s in steps for d in s], gold_set)
    kept = retention(steps)
    if kept is not None:
        out["retention"] = kept
    return out


def trace_steps(trace: dict | None) -> list[list[str]] | None:
    """The evidence trajectory of a results row's trace, if its method records one."""
    if not trace or not isinstance(trace.get("steps"), list):
        return None
    steps = [s.get("doc_ids") for s in trace["steps"] if isinstance(s, dict)]
    return [list(s) for s in steps if s is not None] or None

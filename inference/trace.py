"""Per-query accounting: counts, timings, retrieval steps, drafts.

The engine fills counts and timings as services are used; methods add retrieval steps,
drafts and free-form details. ``to_record`` gives the ``trace`` struct of the results table.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from specrag.schemas.tables import COUNT_FIELDS, TIMING_FIELDS


@dataclass
class Trace:
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    retrieved: list[dict[str, Any]] = field(default_factory=list)
    drafts: list[dict[str, Any]] = field(default_factory=list)
    chosen_draft: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def add_time(self, name: str, seconds: float) -> None:
        self.timings[name] += seconds

    def merge(self, other: "Trace") -> None:
        """Fold a fanned-out part's accounting into this trace (used when re-joining parts)."""
        for k, v in other.counts.items():
            self.counts[k] += v
        for k, v in other.timings.items():
            if k != "total_s":
                self.timings[k] += v
        self.timings["total_s"] = max(self.timings.get("total_s", 0.0), other.timings.get("total_s", 0.0))
        self.retrieved.extend(r for r in other.retrieved if r not in self.retrieved)
        self.drafts.extend(other.drafts)
        for k, v in other.details.items():  # pre-fork details live in part 0, merged first
            self.details.setdefault(k, v)

    def to_record(self) -> dict[str, Any]:
        return {
            "retrieved": [dict(r) for r in self.retrieved],
            "drafts": [dict(d) for d in self.drafts],
            "chosen_draft": self.chosen_draft,
            "counts": {k: int(self.counts.get(k, 0)) for k in COUNT_FIELDS},
            "timings": {k: float(self.timings.get(k, 0.0)) for k in TIMING_FIELDS},
            "details": json.dumps(self.details, sort_keys=True, default=str),
        }

    def __getstate__(self):  # defaultdicts with lambdas do not pickle
        state = dict(self.__dict__)
        state["counts"] = dict(self.counts)
        state["timings"] = dict(self.timings)
        return state

    def __setstate__(self, state):
        state["counts"] = defaultdict(int, state["counts"])
        state["timings"] = defaultdict(float, state["timings"])
        self.__dict__.update(state)

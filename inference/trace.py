"""Per-query accounting: counts, timings, stage times, retrieval steps, and the method's own trace.

The engine fills counts, timings and stage times as services are used; ``Context.retrieve``
records retrieval steps; a method records what is its own (drafts, speculation steps, the
stages of SPS) in a typed dataclass it declares (``Method.trace_class``), reached with
``trace.of(MyTrace)``. ``core_record`` and ``method_record`` give the results table's columns.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specrag.schemas.tables import COUNT_FIELDS, TIMING_FIELDS
from specrag.schemas.typed import to_record

T = TypeVar("T")


@dataclass
class Trace:
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stages: dict[str, float] = field(default_factory=dict)  # stage name -> seconds, in run order
    retrieved: list[dict[str, Any]] = field(default_factory=list)
    method: Any = None  # the method's typed trace (a dataclass instance), see ``of``

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def add_time(self, name: str, seconds: float) -> None:
        self.timings[name] += seconds

    def add_stage_time(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def of(self, cls: type[T]) -> T:
        """The method's trace of type ``cls``, created on first use."""
        if self.method is None:
            self.method = cls()
        elif not isinstance(self.method, cls):
            raise TypeError(f"trace already holds a {type(self.method).__name__}, not a {cls.__name__}")
        return self.method

    def merge(self, other: "Trace") -> None:
        """Fold a fanned-out part's accounting into this trace (used when re-joining parts).

        Counts add up. Timings and stage times add up too: the engine writes a query's wall
        times (all parts together) into part 0 only, so nothing is counted twice."""
        for k, v in other.counts.items():
            self.counts[k] += v
        for k, v in other.timings.items():
            self.timings[k] += v
        for k, v in other.stages.items():
            self.add_stage_time(k, v)
        self.retrieved.extend(r for r in other.retrieved if r not in self.retrieved)
        if self.method is None:  # pre-fork records live in part 0, merged first
            self.method = other.method

    def core_record(self) -> dict[str, Any]:
        return {
            "counts": {k: int(self.counts.get(k, 0)) for k in COUNT_FIELDS},
            "timings": {k: round(float(self.timings.get(k, 0.0)), 6) for k in TIMING_FIELDS},
            "stages": [{"stage": k, "seconds": round(v, 6)} for k, v in self.stages.items()],
            "retrieved": [dict(r) for r in self.retrieved],
        }

    def method_record(self) -> dict[str, Any] | None:
        return None if self.method is None else to_record(self.method)

    def __getstate__(self):  # defaultdicts with lambdas do not pickle
        state = dict(self.__dict__)
        state["counts"] = dict(self.counts)
        state["timings"] = dict(self.timings)
        return state

    def __setstate__(self, state):
        state["counts"] = defaultdict(int, state["counts"])
        state["timings"] = defaultdict(float, state["timings"])
        self.__dict__.update(state)

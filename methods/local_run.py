"""Run a method's stages over many queries without Beam (tests, benchmarks, notebooks).

The same stage code, the same engine and the same fused segments as the pipeline; fan-out
parts are re-joined in memory where the pipeline uses its keyed GatherParts join.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from specrag.methods.base import Method, QueryState, merge_parts, method_segments


def run_method(engine: Any, method: Method, queries: list[dict]) -> tuple[list[QueryState], list[dict]]:
    """Returns (finished states in input order, failures as {id, stage, error})."""
    method.warn_departures()
    states = [QueryState(query=q) for q in queries]
    failures: list[dict] = []
    for segment in method_segments(method.stages()):
        if segment[0].gather:
            by_id: dict[str, list[QueryState]] = defaultdict(list)
            for s in states:
                by_id[s.id].append(s)
            states = []
            for qid, parts in by_id.items():
                try:
                    states.append(merge_parts(parts))
                except ValueError as e:  # a part failed earlier: the query fails here, once
                    failures.append({"id": qid, "stage": segment[0].name, "error": repr(e)})
        outcomes = engine.run_stages(segment, states)
        next_states = []
        for state, outcome in zip(states, outcomes):
            if outcome.error is not None:
                failures.append({"id": state.id, "stage": outcome.stage, "error": repr(outcome.error)})
            else:
                next_states.extend(outcome.outputs)
        states = next_states
    order = {q["id"]: i for i, q in enumerate(queries)}
    return sorted(states, key=lambda s: order[s.id]), failures

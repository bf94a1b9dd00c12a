"""Converting between pipeline elements and output table rows (results, dead letters)."""
from __future__ import annotations

import json
from typing import Any

from specrag.methods.base import QueryState

DEAD = "dead_letters"


def _json_safe(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def dead_letter(qid: Any, stage: str, error: BaseException | str, raw: Any) -> dict:
    """One dead-letter row; ``raw`` keeps the input (or state) so it can be replayed."""
    if isinstance(error, BaseException):
        etype, message = type(error).__name__, str(error)
    else:
        etype, message = "Rejected", error
    if isinstance(qid, (bytes, bytearray)):
        qid = bytes(qid).decode("utf-8", errors="backslashreplace")
    return {"id": None if qid is None else str(qid), "stage": stage, "error_type": etype,
            "message": message, "raw": json.dumps(_json_safe(raw), sort_keys=True, default=str)}


def state_raw(state: QueryState) -> dict:
    return {"query": state.query, "part": state.part, "parts": state.parts}


def result_row(state: QueryState, method: str, fingerprint: str) -> dict:
    """The core columns, then the method's typed trace (only when it declares one)."""
    q = state.query
    row = {"id": q["id"], "method": method, "run_fingerprint": fingerprint,
           "dataset": q.get("dataset", ""), "task_type": q.get("task_type", ""),
           "answer": state.answer, "raw_output": state.raw_output, "choice": state.choice, "error": None,
           **state.trace.core_record()}
    method_trace = state.trace.method_record()
    if method_trace is not None:
        row["trace"] = method_trace
    return row

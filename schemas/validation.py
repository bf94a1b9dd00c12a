"""Row validation for input tables, with errors that name the row and the field.

Readers hand over raw Python values (strings still as bytes where the column was binary
or its UTF-8 could not be trusted); validation decodes, type-checks and normalises them, so
one bad row becomes one dead letter and never stops a run.
"""
from __future__ import annotations

import json
from typing import Any

from specrag.schemas.tables import TASK_TYPES


class RowError(ValueError):
    """A row that cannot be used; ``field`` names the offending column."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _text(row: dict, field: str, *, required: bool) -> str | None:
    value = row.get(field)
    if value is None:
        if required:
            raise RowError(field, "missing")
        return None
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RowError(field, f"invalid UTF-8 at byte {e.start}") from None
    if not isinstance(value, str):
        raise RowError(field, f"expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RowError(field, f"invalid UTF-8 (lone surrogate at {e.start})") from None
    if required and not value.strip():
        raise RowError(field, "empty")
    return value


def _text_list(row: dict, field: str) -> list[str]:
    value = row.get(field)
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise RowError(field, f"expected a list of strings, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        out.append(_text({f"{field}[{i}]": item}, f"{field}[{i}]", required=False) or "")
    return out


def validate_query(row: dict[str, Any], task_types: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Return the normalised query row or raise RowError; ``task_types``: the ones the method
    answers (None: all), so a query it cannot answer is rejected before any work is spent on it."""
    qid = row.get("id")
    if isinstance(qid, (int,)) and not isinstance(qid, bool):
        raise RowError("id", f"expected a string, got int ({qid})")
    qid = _text(row, "id", required=True)
    question = _text(row, "question", required=True)
    task_type = _text(row, "task_type", required=False) or "short_form"
    if task_type not in TASK_TYPES:
        raise RowError("task_type", f"{task_type!r} is not one of {', '.join(TASK_TYPES)}")
    if task_types is not None and task_type not in task_types:
        raise RowError("task_type", f"{task_type!r}: the method answers {', '.join(task_types)} questions only")
    choices = _text_list(row, "choices")
    labels = _text_list(row, "choice_labels")
    if task_type == "multiple_choice":
        if len(choices) < 2:
            raise RowError("choices", "multiple_choice needs at least two choices")
        if not labels:
            labels = [chr(ord("A") + i) for i in range(len(choices))]
        if len(labels) != len(choices):
            raise RowError("choice_labels", f"{len(labels)} labels for {len(choices)} choices")
    groups_raw = row.get("answer_groups") or []
    if not isinstance(groups_raw, (list, tuple)):
        raise RowError("answer_groups", f"expected a list of lists, got {type(groups_raw).__name__}")
    groups = [_text_list({"answer_groups": g}, "answer_groups") for g in groups_raw]
    metadata = _text(row, "metadata", required=False) or "{}"
    try:
        if not isinstance(json.loads(metadata), dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise RowError("metadata", f"not a JSON object ({e})") from None
    return {
        "id": qid,
        "question": question.strip(),
        "answers": _text_list(row, "answers"),
        "answer_groups": groups,
        "choices": choices,
        "choice_labels": labels,
        "task_type": task_type,
        "dataset": _text(row, "dataset", required=False) or "",
        "gold_passage_ids": _text_list(row, "gold_passage_ids"),
        "metadata": metadata,
    }


def validate_passage(row: dict[str, Any]) -> dict[str, Any]:
    """Return the normalised passage row or raise RowError."""
    pid = row.get("id")
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
        row = {**row, "id": pid}
    return {
        "id": _text(row, "id", required=True),
        "title": _text(row, "title", required=False) or "",
        "text": _text(row, "text", required=True),
    }

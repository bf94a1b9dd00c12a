"""Validation of input rows and removal of duplicate ids; rejects go to dead letters.

Grouping by id also does the resume's anti-join: ids of earlier results, flattened into the
same GroupByKey as markers, drop their queries there (one shuffle for both).
"""
from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from specrag.schemas.validation import RowError
from specrag.transforms.records import DEAD, dead_letter


class _Validate(beam.DoFn):
    def __init__(self, validator, stage: str):
        self._validator = validator
        self._stage = stage

    def process(self, row: dict):
        order, source = row.pop("_order", None), row.pop("_source", None)
        try:
            clean = self._validator(row)
        except RowError as e:
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                row.get("id"), self._stage, e, {**row, "_source": source}))
            return
        yield clean["id"], (order, source, clean)


FINISHED = None  # the marker an earlier result puts beside its id
MARKED = "marked"  # the marker a ``marked`` id puts beside its row
MARK_FIELD = "_marked"  # set True on the valid row of a marked id


def _first_of_id(element):
    qid, rows = element
    rows = list(rows)
    if any(r is FINISHED for r in rows):
        if len(rows) > rows.count(FINISHED):  # in the input and answered earlier: skipped
            Metrics.counter("specrag", "skipped_finished").inc()
        return
    marked = MARKED in rows
    rows = sorted((r for r in rows if r != MARKED), key=lambda r: r[0])  # (file, row): the first occurrence wins
    if not rows:  # a mark with no row of that id
        return
    _, first_source, first = rows[0]
    yield {**first, MARK_FIELD: True} if marked else first
    for _, source, row in rows[1:]:
        yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
            qid, "validate", f"duplicate id {qid!r} (first seen at {first_source})",
            {**row, "_source": source}))


class ReadIds(beam.PTransform):
    """The ids in one column of Parquet files (earlier outputs), read by the job itself: the
    resume's anti-join input, never baked into the graph."""

    def __init__(self, files: list[str], column: str = "id"):
        super().__init__()
        self.files, self.column = list(files), column

    def expand(self, pbegin):
        from apache_beam.io.parquetio import ReadAllFromParquet
        column = self.column
        return (pbegin | "Files" >> beam.Create(self.files)
                | "Read" >> ReadAllFromParquet(columns=[column])
                | "Ids" >> beam.Map(lambda r: r[column]))


class ValidateRows(beam.PTransform):
    """Rows → (valid rows, dead letters). Duplicate ids keep their first row only."""

    def __init__(self, validator, stage: str = "validate", finished=None, marked=None):
        super().__init__()
        self._validator = validator
        self._stage = stage
        self._finished = finished  # PCollection of ids answered earlier (resume), or None
        # PCollection of ids whose valid row gets MARK_FIELD set (build-index: precomputed
        # vectors), found in the same GroupByKey as the duplicates; or None
        self._marked = marked

    def expand(self, rows):
        checked = rows | "Check" >> beam.ParDo(_Validate(self._validator, self._stage)).with_outputs(
            DEAD, main="valid")
        # typed keys: GroupByKey then encodes them with a deterministic string coder
        keyed = checked.valid | "TypedKeys" >> beam.Map(lambda kv: kv).with_output_types(Tuple[str, Any])
        if self._finished is not None:
            marks = self._finished | "MarkFinished" >> beam.Map(lambda qid: (qid, FINISHED)).with_output_types(
                Tuple[str, Any])
            keyed = (keyed, marks) | "WithFinished" >> beam.Flatten()
        if self._marked is not None:
            marks = self._marked | "MarkIds" >> beam.Map(lambda qid: (qid, MARKED)).with_output_types(Tuple[str, Any])
            keyed = (keyed, marks) | "WithMarks" >> beam.Flatten()
        unique = (keyed
                  | "GroupById" >> beam.GroupByKey()
                  | "FirstOfId" >> beam.FlatMap(_first_of_id).with_outputs(DEAD, main="valid"))
        dead = (checked[DEAD], unique[DEAD]) | "DeadLetters" >> beam.Flatten()
        return unique.valid, dead

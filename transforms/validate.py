"""Validation of input rows and removal of duplicate ids; rejects go to dead letters.

Two passes over the input, so no step holds whole rows (an in-process runner keeps a
GroupByKey's input in memory: 5M passages did not fit in 24 GB). The first pass groups each
valid row's position by id and decides a verdict for the rows that are not simply kept: a later
duplicate, an id answered earlier, an id to mark. The second reads the rows again and judges
each by its position, against a side input of those exceptions only. Grouping by id also does
the resume's anti-join: ids of earlier results, flattened into the same GroupByKey as markers,
drop their queries there (one shuffle for both).
"""
from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from specrag.schemas.validation import RowError
from specrag.transforms.records import DEAD, dead_letter


class _Validate(beam.DoFn):
    """Valid rows as (id, position) (``positions_only``) or (position, source, row); invalid
    rows to dead letters in the second pass only, so each is reported once."""

    def __init__(self, validator, stage: str, positions_only: bool = False):
        self._validator = validator
        self._stage = stage
        self._positions_only = positions_only

    def process(self, row: dict):
        order, source = row.pop("_order", None), row.pop("_source", None)
        try:
            clean = self._validator(row)
        except RowError as e:
            if not self._positions_only:
                yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                    row.get("id"), self._stage, e, {**row, "_source": source}))
            return
        yield (clean["id"], order) if self._positions_only else (order, source, clean)


FINISHED = None  # the marker an earlier result puts beside its id
MARKED = "marked"  # the marker a ``marked`` id puts beside its row
MARK_FIELD = "_marked"  # set True on the valid row of a marked id
SKIP = "skip"  # verdict: the id was answered earlier
MARK = "mark"  # verdict: kept, with MARK_FIELD set
# any other verdict is the dead-letter reason of a later duplicate


def _verdicts(element, source_of):
    """(position, verdict) for each row of one id that is not simply kept."""
    qid, orders = element
    orders = list(orders)
    rows = sorted(o for o in orders if isinstance(o, int))  # the first occurrence wins
    if not rows:  # a mark with no row of that id
        return
    if any(o is FINISHED for o in orders):
        # answered earlier: the first row is skipped, a later duplicate is a dead letter again,
        # as in the attempt that answered it (each input row stays in results or dead letters)
        Metrics.counter("specrag", "skipped_finished").inc()
        yield rows[0], SKIP
    elif MARKED in orders:
        yield rows[0], MARK
    for o in rows[1:]:
        yield o, f"duplicate id {qid!r} (first seen at {source_of(rows[0])})"


def _judge(element, verdicts: dict):
    order, source, row = element
    verdict = verdicts.get(order)
    if verdict is None:
        yield row
    elif verdict == MARK:
        yield {**row, MARK_FIELD: True}
    elif verdict != SKIP:
        yield beam.pvalue.TaggedOutput(DEAD, dead_letter(row["id"], "validate", verdict,
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
    """Pipeline root → (valid rows, dead letters): ``read`` (a ``ReadParquetRows``) is applied
    twice, once per pass. Duplicate ids keep their first row only."""

    def __init__(self, read, validator, stage: str = "validate", finished=None, marked=None):
        super().__init__()
        self._read = read
        self._validator = validator
        self._stage = stage
        self._finished = finished  # PCollection of ids answered earlier (resume), or None
        # PCollection of ids whose valid row gets MARK_FIELD set (build-index: precomputed
        # vectors), found in the same GroupByKey as the duplicates; or None
        self._marked = marked

    def expand(self, pbegin):
        # typed keys: GroupByKey then encodes them with a deterministic string coder
        keyed = (pbegin
                 | "ReadPositions" >> self._read
                 | "CheckPositions" >> beam.ParDo(_Validate(self._validator, self._stage, positions_only=True))
                 .with_output_types(Tuple[str, Any]))
        if self._finished is not None:
            marks = self._finished | "MarkFinished" >> beam.Map(lambda qid: (qid, FINISHED)).with_output_types(
                Tuple[str, Any])
            keyed = (keyed, marks) | "WithFinished" >> beam.Flatten()
        if self._marked is not None:
            marks = self._marked | "MarkIds" >> beam.Map(lambda qid: (qid, MARKED)).with_output_types(Tuple[str, Any])
            keyed = (keyed, marks) | "WithMarks" >> beam.Flatten()
        verdicts = (keyed
                    | "GroupById" >> beam.GroupByKey()
                    | "Verdicts" >> beam.FlatMap(_verdicts, self._read.source_of))
        checked = (pbegin
                   | "ReadRows" >> self._read
                   | "Check" >> beam.ParDo(_Validate(self._validator, self._stage)).with_outputs(DEAD, main="valid"))
        judged = checked.valid | "Judge" >> beam.FlatMap(
            _judge, beam.pvalue.AsDict(verdicts)).with_outputs(DEAD, main="valid")
        dead = (checked[DEAD], judged[DEAD]) | "DeadLetters" >> beam.Flatten()
        return judged.valid, dead

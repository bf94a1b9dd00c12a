"""Input rows in (Parquet, JSON lines or CSV: ``jobio/tables.py``), with their position, and UTF-8
left for validation to judge.

``ReadParquetRows`` splits the input files into row groups (one element each, reshuffled
so workers share them), and reads each group into dicts carrying ``_source`` =
"file:row". The position gives duplicates a deterministic winner (the first row) and a
dead letter a pointer back to its input; ``_order``, the same position as one int, is what
validation's duplicate check groups, so it never holds whole rows. String columns are read as bytes so one row with
invalid UTF-8 becomes one dead letter instead of an exception that kills the read. Files
are found and opened through Beam's FileSystems (any scheme); every file's footer is read at
start, so a corrupt file is an error naming it before the job runs — or, with
``bad_files="dead-letter"``, one dead letter naming it while the other files are answered.
"""
from __future__ import annotations

from typing import Iterator

import apache_beam as beam
import pyarrow as pa

from specrag.jobio.files import UnreadableInput
from specrag.jobio.tables import open_table
from specrag.jobio.inputs import expand_inputs, inspect_inputs, rows_taken
from specrag.transforms.records import dead_letter

BAD_FILES = ("fail", "dead-letter")


def _as_bytes(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_as_bytes(t.value_type))
    return t


ROW_BITS = 40  # a row's position is one int: file index << ROW_BITS | row


def read_row_group(file_index: int, path: str, group: int, stop: int | None = None) -> Iterator[dict]:
    """The rows of one row group; ``stop``: the file's rows from there on are not read (``--limit``)."""
    pf = open_table(path)
    table = pf.read_row_group(group)
    table = table.cast(pa.schema([pa.field(f.name, _as_bytes(f.type)) for f in table.schema]))
    offset = sum(pf.metadata.row_group(g).num_rows for g in range(group))
    if stop is not None:
        table = table.slice(0, max(0, stop - offset))
    for i, row in enumerate(table.to_pylist()):
        row["_source"] = f"{path}:{offset + i}"
        row["_order"] = (file_index << ROW_BITS) | (offset + i)  # sorts as (path, row): files are sorted
        yield row


class ReadParquetRows(beam.PTransform):
    """Rows of every Parquet file matching ``pattern`` as dicts (see module docstring).

    Returns the rows; ``self.bad_files`` lists the unreadable files, which go to the
    ``dead_letters`` output of ``with_bad_files`` when ``bad_files="dead-letter"``."""

    def __init__(self, pattern: str, bad_files: str = "fail", limit: int | None = None):
        super().__init__()
        if bad_files not in BAD_FILES:
            raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
        self.files = expand_inputs(pattern)
        self.groups, self.bad = inspect_inputs(self.files)
        self.taken = rows_taken(self.files, limit)  # None: every row
        if self.bad and bad_files == "fail":
            raise UnreadableInput("; ".join(self.bad.values()) + " (pass --bad-files dead-letter to answer the "
                                                                 "other files and record these as dead letters)")

    def expand(self, pbegin):
        groups = [(i, f, g, None if self.taken is None else self.taken[f]) for i, f in enumerate(self.files)
                  if f in self.groups for g in range(self.groups[f])
                  if self.taken is None or self._starts_before(f, g, self.taken[f])]
        return (pbegin
                | "RowGroups" >> beam.Create(groups)
                | "Spread" >> beam.Reshuffle()
                | "Rows" >> beam.FlatMapTuple(read_row_group))

    @staticmethod
    def _starts_before(path: str, group: int, stop: int) -> bool:
        meta = open_table(path).metadata
        return sum(meta.row_group(g).num_rows for g in range(group)) < stop

    def source_of(self, order: int) -> str:
        """`FILE row N` of a row's ``_order``, numbered from 1 as an editor or a reader counts rows."""
        return f"{self.files[order >> ROW_BITS]} row {(order & ((1 << ROW_BITS) - 1)) + 1}"

    def dead_letters(self, pbegin):
        """One dead letter per unreadable input file."""
        rows = [dead_letter(None, "read", UnreadableInput(why), {"_source": f}) for f, why in sorted(self.bad.items())]
        return pbegin | "UnreadableFiles" >> beam.Create(rows)

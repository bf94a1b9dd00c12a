"""Input tables in the formats users have them: Parquet, JSON lines or CSV, by file suffix.

A job's queries and corpora are read through ``open_table``, which gives every format the face
of a ``pyarrow.parquet.ParquetFile`` that the readers use (row groups, footer row counts, the
schema's names): Parquet is opened as it is, a JSON lines or CSV file is parsed whole by pyarrow
and cut into row groups of ``TEXT_GROUP_ROWS`` rows, so a large one still spreads over workers.
Ids and text columns of a text format are read as strings (a CSV id ``007`` stays ``"007"``, a
JSON id ``7`` becomes ``"7"``). A file that does not parse is an ``UnreadableInput`` naming it.

Example usage::

    table = open_table("queries.jsonl")      # {"id": "q1", "question": "..."} a line
    rows = table.read(columns=["id", "question"]).to_pylist()
"""
from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass

import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from specrag.jobio.files import UnreadableInput, open_parquet, read_bytes

TEXT_FORMATS = {".jsonl": "JSON lines", ".ndjson": "JSON lines", ".json": "JSON lines", ".csv": "CSV"}
SUFFIXES = (".parquet", *TEXT_FORMATS)
TEXT_GROUP_ROWS = 10_000
STRING_COLUMNS = ("id", "question", "text", "title", "dataset", "task_type")


def text_format(path: str) -> str | None:
    """"JSON lines" or "CSV" for a text input by its suffix; None for Parquet (any other suffix)."""
    lower = str(path).lower()
    return next((name for suffix, name in TEXT_FORMATS.items() if lower.endswith(suffix)), None)


def open_table(path: str):
    """A ParquetFile, or a ``TextTable`` with the same reading methods for JSON lines and CSV."""
    kind = text_format(path)
    if kind is None:
        return open_parquet(path)
    try:
        [meta] = FileSystems.match([path])[0].metadata_list
        version = (meta.size_in_bytes, meta.last_updated_in_seconds)
    except (BeamIOError, ValueError):  # not found: TextTable names the file
        version = None
    return _text_table(path, kind, version)


@functools.lru_cache(maxsize=4)
def _text_table(path: str, kind: str, version) -> "TextTable":
    # one parse per process for every row group a worker reads of the file; ``version`` (size,
    # modification time) keeps a rewritten file from being served from the cache
    return TextTable(path, kind)


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    return open_table(path).read(columns=columns)


@dataclass(frozen=True)
class _Group:
    num_rows: int


class _Metadata:
    def __init__(self, table: pa.Table):
        self.num_rows = table.num_rows
        self._rows = [min(TEXT_GROUP_ROWS, table.num_rows - start)
                      for start in range(0, table.num_rows, TEXT_GROUP_ROWS)] or [0]

    @property
    def num_row_groups(self) -> int:
        return len(self._rows)

    def row_group(self, i: int) -> _Group:
        return _Group(self._rows[i])


class TextTable:
    """A JSON lines or CSV file read as one Arrow table, with ParquetFile's reading methods."""

    def __init__(self, path: str, kind: str):
        try:
            data = read_bytes(path)
            table = _parse(data, kind)
        except (pa.ArrowInvalid, pa.ArrowException, OSError, UnicodeDecodeError) as e:
            raise UnreadableInput(f"{path}: not a readable {kind} file ({type(e).__name__}: {e})") from None
        self.table = _strings(table)
        self.metadata = _Metadata(self.table)
        self.num_row_groups = self.metadata.num_row_groups
        self.schema_arrow = self.table.schema

    def read_row_group(self, i: int) -> pa.Table:
        return self.table.slice(i * TEXT_GROUP_ROWS, TEXT_GROUP_ROWS)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        return self.table if columns is None else self.table.select(columns)


def _parse(data: bytes, kind: str) -> pa.Table:
    if kind == "CSV":
        from pyarrow import csv
        types = {c: pa.string() for c in STRING_COLUMNS}
        return csv.read_csv(io.BytesIO(data), convert_options=csv.ConvertOptions(column_types=types))
    # line by line, not pyarrow.json: its type inference refuses a column whose values change type
    # (ids 1 and "q2" in one file), which a JSON lines file of ids often has
    rows = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise pa.ArrowInvalid(f"line {number}: {e}") from None
            if not isinstance(row, dict):
                raise pa.ArrowInvalid(f"line {number}: a JSON object per line, got {type(row).__name__}")
            rows.append({k: (str(v) if k in STRING_COLUMNS and isinstance(v, (int, float)) else v)
                         for k, v in row.items()})
    return pa.Table.from_pylist(rows)


def _strings(table: pa.Table) -> pa.Table:
    """Ids and text columns as strings, whatever type the parser guessed from their values."""
    for i, field in enumerate(table.schema):
        if field.name in STRING_COLUMNS and (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                                              or pa.types.is_boolean(field.type)):
            table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
    return table

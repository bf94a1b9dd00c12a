"""Parquet shards written as rows arrive, so a killed run keeps what it finished.

Beam's WriteToParquet finalises its files only when the whole job ends: a run killed after
ten hours leaves nothing to resume from. ``WriteParquetShards`` writes a shard of at most
``max_rows`` rows whenever that many have arrived (and the rest when the bundle ends), each
under a temporary name renamed into place (FileSystems: any scheme), so every shard on disk
is whole. Rows of a bundle the runner retries may be written twice; readers keep one row per
id (resume's anti-join skips ids that have any result).
"""
from __future__ import annotations

import time
import uuid

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from specrag.jobio.files import ShardWriteError, os_error, write_parquet
from specrag.jobio.lease import check


class _WriteShards(beam.DoFn):
    def __init__(self, prefix: str, schema: pa.Schema, max_rows: int, counter: str, lease_token: str | None,
                 windowed: bool = False):
        self.prefix, self.schema, self.max_rows, self.lease_token = prefix, schema, max_rows, lease_token
        self.windowed, self.counter = windowed, counter
        self._shards = Metrics.counter("specrag", f"{counter}_shards")
        self._written = Metrics.counter("specrag", counter)  # rows written (the failure share reads it)

    def start_bundle(self):
        self._rows: dict = {}  # window -> rows: a shard never mixes windows

    def process(self, row: dict, window=beam.DoFn.WindowParam):
        rows = self._rows.setdefault(window, [])
        rows.append(row)
        if len(rows) >= self.max_rows:
            yield self._flush(window)

    def finish_bundle(self):
        for window, rows in self._rows.items():
            if rows:
                path = self._flush(window)
                if self.windowed:
                    yield WindowedValue(path, window.max_timestamp(), [window])
                else:
                    yield WindowedValue(path, MIN_TIMESTAMP, [GlobalWindow()])

    def _flush(self, window) -> str:
        # time-ordered names: reading shards in name order follows the order they were written;
        # a windowed shard names its window's start (UTC) first
        tag = f"-w{window.start.to_utc_datetime().strftime('%Y%m%dT%H%M%S')}" if self.windowed else ""
        path = f"{self.prefix}{tag}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        if self.lease_token:  # the folder is still this run's (jobio/lease.py)
            check(FileSystems.split(path)[0], self.lease_token)
        try:
            write_parquet(path, pa.Table.from_pylist(self._rows[window], schema=self.schema))
        except OSError as e:  # Beam's BeamIOError is one too
            raise ShardWriteError(f"could not write the {self.counter} shard {path}: {os_error(e)}") from None
        self._written.inc(len(self._rows[window]))
        self._rows[window] = []
        self._shards.inc()
        return path


class WriteParquetShards(beam.PTransform):
    """rows → Parquet files ``<prefix>-<time>-<uid>.parquet``; returns the written paths. With a
    ``lease_token``, each commit first checks that the folder's lease is still that run's. With
    ``windowed`` (a streaming job's event-time windows) a shard holds one window's rows, is
    named ``<prefix>-w<window start>-<time>-<uid>.parquet`` and its path is output in that window."""

    def __init__(self, prefix: str, schema: pa.Schema, max_rows: int = 1000, counter: str = "rows",
                 lease_token: str | None = None, windowed: bool = False):
        super().__init__()
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.prefix, self.schema, self.max_rows, self.counter = prefix, schema, max_rows, counter
        self.lease_token, self.windowed = lease_token, windowed

    def expand(self, rows):
        return rows | "WriteShards" >> beam.ParDo(
            _WriteShards(self.prefix, self.schema, self.max_rows, self.counter, self.lease_token, self.windowed))

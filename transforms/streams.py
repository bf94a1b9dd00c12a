"""Unbounded query sources and the steps that admit their rows, for `specrag answer --streaming`.

Sources (each yields query rows as dicts, timestamped with their event time):
- ``WatchQueryFiles``: new Parquet or JSON-lines files under a glob on any FileSystems path,
  polled on Beam's ``PeriodicImpulse``; a file is read once (by path and modification time);
  its rows' event time is when the file was first seen.
- ``PubSubQueries``: Beam's ``ReadFromPubSub``, one JSON object per message; its event time is
  the publish time (or a message attribute, ``timestamp_attribute``).

``AdmitRows`` validates each row as the batch job does (a rejected row is a dead letter) and
applies the lateness policy: a row whose event time (its own ``event_time_field`` when set)
is more than ``allowed_lateness_s`` behind the moment it is read becomes a dead letter with
reason "late" instead of being dropped by the runner's windowing. Since a runner's watermark
never runs ahead of the time rows are read, every admitted row is on time for its window.

``DedupeIds`` answers each id once: keyed by id in the global window (so no row is ever late
for it), it keeps a fingerprint of the row it admitted until ``horizon_s`` of event time have
passed (an event-time timer clears it: the state is bounded). The same row again (a file read
twice, a message redelivered) is dropped and counted; another row with that id is a
duplicate-id dead letter, as in batch; ids answered by an earlier run into the same output
(a side input) are skipped, as ``--resume`` skips them.
"""
from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import Any, Callable

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Duration, Timestamp

from specrag.schemas.validation import RowError
from specrag.transforms.records import DEAD, dead_letter

NAMESPACE = "specrag"
PUBSUB_PREFIX = "pubsub:"  # --queries pubsub:projects/P/subscriptions/S (or .../topics/T)
FILE_SUFFIXES = (".parquet", ".jsonl", ".json")


def is_pubsub(queries: str) -> bool:
    return queries.startswith(PUBSUB_PREFIX)


def can_watch(queries: str) -> bool:
    """A glob or a folder can receive new files; one named file cannot."""
    return any(c in queries for c in "*?[") or queries.endswith("/")


def watch_pattern(queries: str) -> str:
    return queries + "*" if queries.endswith("/") else queries


def read_query_file(path: str) -> list[dict]:
    """Rows of one Parquet or JSON-lines file (strings as bytes for Parquet, as in batch, so a
    row with invalid UTF-8 is one dead letter); a file that cannot be read is one row
    carrying ``_unreadable`` (a dead letter downstream)."""
    from specrag.jobio.files import UnreadableInput, open_parquet, read_bytes
    from specrag.transforms.parquet_io import read_row_group
    try:
        if path.endswith(".parquet"):
            groups = open_parquet(path).num_row_groups
            return [row for g in range(groups) for row in read_row_group(0, path, g)]
        rows = []
        for i, line in enumerate(read_bytes(path).splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                row = {"_unreadable": f"line {i + 1} is not JSON ({e})"}
            if not isinstance(row, dict):
                row = {"_unreadable": f"line {i + 1} is not a JSON object"}
            rows.append({**row, "_source": f"{path}:{i}"})
        return rows
    except (UnreadableInput, OSError, ValueError) as e:
        return [{"_unreadable": str(e), "_source": path}]


class _PollFiles(beam.DoFn):
    """On each tick, the files under the pattern not read before, as their rows. What was read
    is remembered by this worker; a restarted worker reads a file again and ``DedupeIds``
    drops its rows as repeats (their fingerprints are the same)."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def setup(self):
        self._seen: set[tuple[str, int]] = set()

    def process(self, tick):
        from apache_beam.io.filesystems import FileSystems
        found = FileSystems.match([self.pattern])[0].metadata_list
        for meta in sorted(found, key=lambda m: m.path):
            key = (meta.path, meta.last_updated_in_seconds)
            if key in self._seen or not meta.path.endswith(FILE_SUFFIXES):
                continue
            self._seen.add(key)
            Metrics.counter(NAMESPACE, "files_read").inc()
            now = Timestamp.now()
            for row in read_query_file(meta.path):
                yield TimestampedValue(row, now)


def _ticks_until_marker():
    """Beam's PeriodicImpulse DoFn that also ends when a stop marker file appears (checked before
    each tick): the source then finishes, its watermark passes every window and the job drains
    what is in flight and ends, on any runner (the marker is a FileSystems path, which every
    worker reads; a signal reaches only the launching process)."""
    from apache_beam.transforms.periodicsequence import ImpulseSeqGenDoFn, ImpulseSeqGenRestrictionProvider
    from apache_beam.io.watermark_estimators import ManualWatermarkEstimator

    class TicksUntilMarker(ImpulseSeqGenDoFn):
        def __init__(self, marker: str):
            super().__init__()
            self.marker = marker

        @beam.DoFn.unbounded_per_element()
        def process(self, element, restriction_tracker=beam.DoFn.RestrictionParam(ImpulseSeqGenRestrictionProvider()),
                    watermark_estimator=beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider())):
            from apache_beam.io.filesystems import FileSystems
            if FileSystems.exists(self.marker):
                # claim the restriction's last position: the tracker is done, nothing more is read
                last = restriction_tracker.current_restriction().stop - 1
                if last >= restriction_tracker.current_restriction().start:
                    restriction_tracker.try_claim(last)
                return
            yield from super().process(element, restriction_tracker, watermark_estimator)

    return TicksUntilMarker


class WatchQueryFiles(beam.PTransform):
    """New query files under a glob, polled every ``interval_s`` until ``stop_after_s`` (None:
    forever) or until the file ``stop_marker`` exists (``specrag answer --streaming`` writes it
    when it gets SIGINT or SIGTERM: the job drains and stops)."""

    def __init__(self, pattern: str, interval_s: float, stop_after_s: float | None = None,
                 stop_marker: str | None = None):
        super().__init__()
        self.pattern, self.interval_s, self.stop_after_s = pattern, interval_s, stop_after_s
        self.stop_marker = stop_marker

    def expand(self, pbegin):
        from apache_beam.transforms.periodicsequence import PeriodicImpulse
        start = Timestamp.now()
        stop = start + self.stop_after_s if self.stop_after_s is not None else MAX_TIMESTAMP
        if self.stop_marker is None:
            ticks = pbegin | "Poll" >> PeriodicImpulse(start_timestamp=start, stop_timestamp=stop,
                                                       fire_interval=self.interval_s)
        else:
            ticks = (pbegin
                     | "PollStart" >> beam.Create([(start, stop, float(self.interval_s))])
                     | "Poll" >> beam.ParDo(_ticks_until_marker()(self.stop_marker)))
        return ticks | "NewFiles" >> beam.ParDo(_PollFiles(self.pattern))


def parse_message(data: bytes) -> dict:
    """One Pub/Sub message's payload → one query row (a JSON object); anything else is a row
    carrying ``_unreadable``."""
    try:
        row = json.loads(data)
    except ValueError as e:
        return {"_unreadable": f"message is not JSON ({e})", "_source": "pubsub"}
    if not isinstance(row, dict):
        return {"_unreadable": "message is not a JSON object", "_source": "pubsub"}
    return {**row, "_source": "pubsub"}


class PubSubQueries(beam.PTransform):
    """Query rows from a Pub/Sub subscription or topic (``pubsub:projects/P/subscriptions/S``)."""

    def __init__(self, queries: str, timestamp_attribute: str | None = None):
        super().__init__()
        self.path = queries[len(PUBSUB_PREFIX):]
        self.timestamp_attribute = timestamp_attribute

    def expand(self, pbegin):
        from apache_beam.io.gcp.pubsub import ReadFromPubSub
        kind = "subscription" if "/subscriptions/" in self.path else "topic"
        read = ReadFromPubSub(**{kind: self.path}, timestamp_attribute=self.timestamp_attribute)
        return pbegin | "ReadPubSub" >> read | "ParseMessages" >> beam.Map(parse_message)


def event_time(value: Any) -> Timestamp:
    """A row's event time: epoch seconds, an ISO 8601 string, or a datetime."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, (int, float)):
        return Timestamp.of(value)
    if isinstance(value, datetime):
        return Timestamp.from_utc_datetime(value if value.tzinfo else value.replace(tzinfo=timezone.utc))
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return Timestamp.from_utc_datetime(parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc))
    raise ValueError(f"not a time: {value!r}")


class AdmitRows(beam.DoFn):
    """Row → valid query (timestamped with its event time) or a dead letter (invalid, unreadable,
    late). ``now``: the clock lateness is measured against (the wall clock)."""

    def __init__(self, validator: Callable[[dict], dict], allowed_lateness_s: float,
                 event_time_field: str | None = None, now: Callable[[], float] = time.time):
        self.validator, self.allowed_lateness_s = validator, allowed_lateness_s
        self.event_time_field, self.now = event_time_field, now

    def process(self, row: dict, timestamp=beam.DoFn.TimestampParam):
        row = dict(row)
        source = row.pop("_source", None)
        row.pop("_order", None)
        if "_unreadable" in row:
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(None, "read", row["_unreadable"], {"_source": source}))
            return
        try:
            clean = self.validator(row)
        except RowError as e:
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(row.get("id"), "validate", e, {**row, "_source": source}))
            return
        at = timestamp
        if self.event_time_field:
            try:
                at = event_time(row.get(self.event_time_field))
            except (ValueError, TypeError, OverflowError) as e:
                yield beam.pvalue.TaggedOutput(DEAD, dead_letter(clean["id"], "validate", RowError(
                    self.event_time_field, str(e)), {**row, "_source": source}))
                return
        behind = self.now() - at.micros / 1e6
        if behind > self.allowed_lateness_s:
            Metrics.counter(NAMESPACE, "late").inc()
            # in the window of its arrival: its own event time's window may be long closed
            yield beam.pvalue.TaggedOutput(DEAD, TimestampedValue(dead_letter(clean["id"], "admit", (
                f"late: event time {at.to_rfc3339()} is {behind:.0f} s behind its arrival, more than the "
                f"allowed lateness ({self.allowed_lateness_s:g} s)"), {**row, "_source": source}),
                Timestamp.of(self.now())))
            return
        yield TimestampedValue((clean["id"], clean), at)


def row_fingerprint(row: dict) -> bytes:
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).digest()[:16]


class DedupeIds(beam.DoFn):
    """(id, row) → row, each id once while its state lives (see the module docstring); the side
    input ``finished`` holds the ids an earlier run into the same output answered."""

    ADMITTED = ReadModifyWriteStateSpec("admitted", BytesCoder())
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, horizon_s: float | None):
        self.horizon_s = horizon_s  # None: kept for the job's life (a bounded run on the FnApiRunner)

    def process(self, element, finished, timestamp=beam.DoFn.TimestampParam,
                admitted=beam.DoFn.StateParam(ADMITTED), expire=beam.DoFn.TimerParam(EXPIRE)):
        qid, row = element
        if qid in finished:
            Metrics.counter(NAMESPACE, "skipped_finished").inc()
            return
        fingerprint, earlier = row_fingerprint(row), admitted.read()
        if earlier == fingerprint:
            Metrics.counter(NAMESPACE, "repeated_rows").inc()  # the same row read again
            return
        if earlier is not None:
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(qid, "validate", (
                f"duplicate id {qid!r} (another row with this id was admitted earlier in the stream)"), row))
            return
        admitted.write(fingerprint)
        if self.horizon_s is not None:
            expire.set(timestamp + Duration.of(self.horizon_s))
        yield TimestampedValue(row, timestamp)

    @on_timer(EXPIRE)
    def expire_state(self, admitted=beam.DoFn.StateParam(ADMITTED)):
        admitted.clear()

"""Unbounded query sources and the steps that admit their rows, for `specrag answer --streaming`.

Sources (each yields query rows as dicts, timestamped with their event time):
- ``WatchQueryFiles``: new Parquet or JSON-lines files under a glob on any FileSystems path,
  polled on Beam's ``PeriodicImpulse``; a file is read once (by path and modification time);
  its rows' event time is when the file was first seen.
- ``PubSubQueries``: Beam's ``ReadFromPubSub``, one JSON object per message; its event time is
  the publish time (or a message attribute, ``timestamp_attribute``).
- ``KafkaQueries``: Beam's ``ReadFromKafka`` (a Java transform through an expansion service),
  one JSON object per message value; its event time is when it is read, as for files. No
  offsets are committed: a restarted job reads its topics from the start and ``DedupeIds``
  skips the ids answered (``--resume``), so a lost worker loses nothing.

``AdmitRows`` validates each row as the batch job does (a rejected row is a dead letter) and
applies the lateness policy: a row whose event time (its own ``event_time_field`` when set)
is more than ``allowed_lateness_s`` behind the moment it is read becomes a dead letter with
reason "late" instead of being dropped by the runner's windowing. Since a runner's watermark
never runs ahead of the time rows are read, every admitted row is on time for its window.

``DedupeIds`` answers each id once: keyed by id in the global window (so no row is ever late
for it), it keeps a fingerprint of the row it admitted until ``horizon_s`` of event time have
passed (an event-time timer clears it: the state is bounded). The same row again (a file read
twice, a message redelivered) is dropped and counted; another row with that id is a
duplicate-id dead letter, as in batch. ``SkipFinished`` before it skips the ids an earlier run
into the same output answered, as ``--resume`` skips them.
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
KAFKA_PREFIX = "kafka://"  # --queries kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC][?consumer.setting=value&...]
# the key under which Beam's ReadFromKafka looks up a pre-started expansion service in the
# --beam_services option (deploy/flink/kafka_services.py flags prints it)
KAFKA_EXPANSION_SERVICE = "sdks:java:io:expansion-service:shadowJar"
FILE_SUFFIXES = (".parquet", ".jsonl", ".json")


def is_pubsub(queries: str) -> bool:
    return queries.startswith(PUBSUB_PREFIX)


def is_kafka(queries: str) -> bool:
    return queries.startswith(KAFKA_PREFIX)


def kafka_source(queries: str) -> tuple[dict[str, str], list[str]]:
    """``kafka://HOST:PORT/TOPIC?setting=value`` → (the consumer's settings, the topics). A
    restarted job must see every message again, so the consumer starts at the earliest offset
    unless the address says otherwise."""
    from urllib.parse import parse_qsl, urlsplit
    parts = urlsplit(queries)
    topics = [t for t in parts.path.strip("/").split(",") if t]
    if not parts.netloc or not topics:
        raise ValueError(f"--queries {queries!r}: a Kafka source is kafka://HOST:PORT/TOPIC "
                         "(brokers and topics may be comma-separated; consumer settings as ?name=value)")
    return {"bootstrap.servers": parts.netloc, "auto.offset.reset": "earliest",
            **dict(parse_qsl(parts.query, keep_blank_values=True))}, topics


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
            rows.append({**row, "_source": f"{path} line {i + 1}"})
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


def parse_message(data: bytes, source: str = "pubsub") -> dict:
    """One message's payload (Pub/Sub, Kafka) → one query row (a JSON object); anything else is
    a row carrying ``_unreadable``."""
    try:
        row = json.loads(data)
    except ValueError as e:
        return {"_unreadable": f"message is not JSON ({e})", "_source": source}
    if not isinstance(row, dict):
        return {"_unreadable": "message is not a JSON object", "_source": source}
    return {**row, "_source": source}


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


class _ParseRecord(beam.DoFn):
    """A Kafka record (key, value) → a query row from its value (the key is not used)."""

    def process(self, record):
        _, value = record
        yield parse_message(value or b"", "kafka")


class KafkaQueries(beam.PTransform):
    """Query rows from Kafka topics (``kafka://HOST:PORT/TOPIC``), through Beam's ``ReadFromKafka``.

    The Java side comes from an expansion service: the one ``--beam_services`` names under
    ``KAFKA_EXPANSION_SERVICE`` (``deploy/flink/kafka_services.py flags``), else Beam's default (it fetches
    Beam's expansion service jar from Maven Central and runs the read in Docker)."""

    def __init__(self, queries: str):
        super().__init__()
        self.config, self.topics = kafka_source(queries)

    def expand(self, pbegin):
        from apache_beam.io.kafka import ReadFromKafka
        from apache_beam.options.pipeline_options import CrossLanguageOptions
        from apache_beam.utils.subprocess_server import JavaJarServer
        services = pbegin.pipeline.options.view_as(CrossLanguageOptions).beam_services or {}
        # Beam applies --beam_services only inside `with Pipeline(...)`; a job built and run
        # with p.run() names its service here, where ReadFromKafka resolves it
        with JavaJarServer.beam_services(services):
            read = ReadFromKafka(consumer_config=self.config, topics=self.topics)
        return pbegin | "ReadKafka" >> read | "ParseMessages" >> beam.ParDo(_ParseRecord())


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
                 event_time_field: str | None = None, now: Callable[[], float] = time.time,
                 stop_marker: str | None = None):
        self.validator, self.allowed_lateness_s = validator, allowed_lateness_s
        self.event_time_field, self.now = event_time_field, now
        # a source that does not end at the stop marker (Kafka): rows read after it are not
        # admitted (the next run reads them again), so the job can drain what it admitted
        self.stop_marker = stop_marker
        self._stopped, self._checked = False, 0.0

    def _stopping(self) -> bool:
        if self.stop_marker and not self._stopped and time.monotonic() - self._checked > 1.0:
            from apache_beam.io.filesystems import FileSystems
            self._checked = time.monotonic()
            self._stopped = FileSystems.exists(self.stop_marker)
        return self._stopped

    def process(self, row: dict, timestamp=beam.DoFn.TimestampParam):
        if self._stopping():
            Metrics.counter(NAMESPACE, "not_admitted_after_stop").inc()
            return
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


class SkipFinished(beam.DoFn):
    """(id, row) pairs whose id an earlier run into the same output answered are skipped, as
    ``--resume`` skips them. The ids are read from that run's result files when the worker
    starts, not taken as a side input: Flink's runner holds a main input back until the side
    input is ready, and for an empty side input it releases what it held only when the main
    input's watermark next moves (a Kafka read's held every query), and a side input on the keyed
    ``DedupeIds`` mis-keyed its timers there (``ClassCastException`` in ``FlinkKeyUtils``)."""

    def __init__(self, files: list[str], column: str = "id"):
        self.files, self.column = list(files), column

    def setup(self):
        from specrag.jobio.files import read_parquet
        self._finished = {i for f in self.files for i in read_parquet(f, columns=[self.column]).column(
            self.column).to_pylist()}

    def process(self, element):
        if element[0] in self._finished:
            Metrics.counter(NAMESPACE, "skipped_finished").inc()
            return
        yield element


class DedupeIds(beam.DoFn):
    """(id, row) → row, each id once while its state lives (see the module docstring)."""

    ADMITTED = ReadModifyWriteStateSpec("admitted", BytesCoder())
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, horizon_s: float | None):
        self.horizon_s = horizon_s  # None: kept for the job's life (a bounded run on the FnApiRunner)

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                admitted=beam.DoFn.StateParam(ADMITTED), expire=beam.DoFn.TimerParam(EXPIRE)):
        qid, row = element
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


class MarkEndOfInput(beam.DoFn):
    """Writes the file ``path`` once its input's watermark has passed the end of time: by then
    every element upstream has been processed and every window has fired. Fed ``(key, _)`` in
    the global window, at least one element (each sets the same timer). Why: on Flink a
    streaming job's sources are kept up (``pipelines/streaming.py``, ``stream_beam_args``), so
    the job does not end when its source does; the launcher cancels it once this file is there
    and the shards are written."""

    END = TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, path: str):
        self.path = path

    def process(self, element, end=beam.DoFn.TimerParam(END)):
        from apache_beam.transforms.window import GlobalWindow
        end.set(GlobalWindow().max_timestamp())

    @on_timer(END)
    def on_end(self):
        from specrag.jobio.files import write_text
        write_text(self.path, time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))

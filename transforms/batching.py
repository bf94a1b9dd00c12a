"""Keyed stateful batching and the keyed join of fanned-out parts.

``BatchByKey``: elements keyed by a shard key are buffered in BagState with a running
count and flushed as one list when ``batch_size`` is reached, when the oldest buffered
element has waited ``max_wait_s`` (processing-time timer: streaming runners only — the
FnApiRunner in batch mode never fires processing-time timers, so leave it unset there), or
at the end of the window (event-time timer: end of input in batch). Shard keys spread the work across
workers; the batch is what the engine runs concurrently, so its model calls coalesce.

``GatherParts``: keyed by query id; buffers the parts of a fanned-out query and emits
them merged once all ``parts`` have arrived, then clears all its state. A query still
incomplete when its window ends (or after ``timeout_s`` in streaming) goes to dead letters
with what was missing; a part arriving after its query was emitted starts no state that
outlives the window: it expires the same way, as one dead letter.

``BatchByKey`` remains for the fixed-batch execution (benchmarks compare against it) and
keeps its own state instead of ``GroupIntoBatches``: GroupIntoBatches' buffering timer is
processing-time, which the FnApiRunner never fires in batch mode.
"""
from __future__ import annotations

import zlib
import apache_beam as beam
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec,
                                              ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from specrag.methods.base import merge_parts
from specrag.transforms.records import DEAD, dead_letter, state_raw


def shard_of(key: str, num_shards: int) -> int:
    """Stable across processes and runs (Python's hash() is salted per process)."""
    return zlib.crc32(key.encode("utf-8")) % num_shards


class BatchByKey(beam.DoFn):
    BUFFER = BagStateSpec("buffer", PickleCoder())  # (event timestamp, value)
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
    END_OF_WINDOW = TimerSpec("end_of_window", TimeDomain.WATERMARK)
    MAX_WAIT = TimerSpec("max_wait", TimeDomain.REAL_TIME)

    def __init__(self, batch_size: int, max_wait_s: float | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam,
                buffer=beam.DoFn.StateParam(BUFFER), count=beam.DoFn.StateParam(COUNT),
                end_of_window=beam.DoFn.TimerParam(END_OF_WINDOW),
                max_wait=beam.DoFn.TimerParam(MAX_WAIT)):
        _, value = element
        end_of_window.set(window.end)
        n = (count.read() or 0) + 1
        if n == 1 and self.max_wait_s:
            max_wait.set(Timestamp.now() + Duration(seconds=self.max_wait_s))
        buffer.add((timestamp, value))
        count.write(n)
        if n >= self.batch_size:
            yield from self._flush(buffer, count, max_wait)

    @on_timer(END_OF_WINDOW)
    def on_end_of_window(self, buffer=beam.DoFn.StateParam(BUFFER), count=beam.DoFn.StateParam(COUNT),
                         max_wait=beam.DoFn.TimerParam(MAX_WAIT)):
        yield from self._flush(buffer, count, max_wait)

    @on_timer(MAX_WAIT)
    def on_max_wait(self, buffer=beam.DoFn.StateParam(BUFFER), count=beam.DoFn.StateParam(COUNT),
                    max_wait=beam.DoFn.TimerParam(MAX_WAIT)):
        yield from self._flush(buffer, count, max_wait)

    def _flush(self, buffer, count, max_wait):
        items = list(buffer.read())
        buffer.clear()
        count.clear()
        if self.max_wait_s:
            max_wait.clear()
        if items:
            # Keep the elements' event time: a batch flushed by the end-of-window timer
            # would otherwise carry the window's end and be dropped as late downstream.
            yield TimestampedValue([v for _, v in items], min(t for t, _ in items))


class GatherParts(beam.DoFn):
    PARTS = BagStateSpec("parts", PickleCoder())
    SEEN = ReadModifyWriteStateSpec("seen", VarIntCoder())
    END_OF_WINDOW = TimerSpec("end_of_window", TimeDomain.WATERMARK)
    TIMEOUT = TimerSpec("timeout", TimeDomain.REAL_TIME)

    def __init__(self, stage: str, timeout_s: float | None = None):
        self.stage = stage
        self.timeout_s = timeout_s

    def process(self, element, window=beam.DoFn.WindowParam,
                parts=beam.DoFn.StateParam(PARTS), seen=beam.DoFn.StateParam(SEEN),
                end_of_window=beam.DoFn.TimerParam(END_OF_WINDOW),
                timeout=beam.DoFn.TimerParam(TIMEOUT)):
        qid, state = element
        n = (seen.read() or 0) + 1
        if n == 1:
            end_of_window.set(window.end)
            if self.timeout_s:
                timeout.set(Timestamp.now() + Duration(seconds=self.timeout_s))
        parts.add(state)
        seen.write(n)
        if n >= state.parts:
            collected = list(parts.read())
            parts.clear()
            seen.clear()
            end_of_window.clear()
            if self.timeout_s:  # a pending processing-time timer would keep a batch run from finishing
                timeout.clear()
            try:
                yield qid, merge_parts(collected)
            except ValueError as e:
                yield beam.pvalue.TaggedOutput(DEAD, dead_letter(qid, self.stage, e, state_raw(state)))

    @on_timer(END_OF_WINDOW)
    def on_end_of_window(self, key=beam.DoFn.KeyParam, parts=beam.DoFn.StateParam(PARTS),
                         seen=beam.DoFn.StateParam(SEEN), timeout=beam.DoFn.TimerParam(TIMEOUT)):
        if self.timeout_s:
            timeout.clear()
        yield from self._expire(key, parts, seen, "input ended")

    @on_timer(TIMEOUT)
    def on_timeout(self, key=beam.DoFn.KeyParam, parts=beam.DoFn.StateParam(PARTS),
                   seen=beam.DoFn.StateParam(SEEN), end_of_window=beam.DoFn.TimerParam(END_OF_WINDOW)):
        end_of_window.clear()
        yield from self._expire(key, parts, seen, f"timed out after {self.timeout_s}s")

    def _expire(self, qid, parts, seen, why: str):
        collected = sorted(parts.read(), key=lambda s: s.part)
        parts.clear()
        seen.clear()
        if collected:
            have = [s.part for s in collected]
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                qid, self.stage, f"incomplete: {why} with parts {have} of {collected[0].parts} "
                                 "(the missing parts failed earlier, or arrived after the query was "
                                 "complete; see their dead letters)", state_raw(collected[0])))

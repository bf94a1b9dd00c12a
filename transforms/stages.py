"""A method's stages as fused Beam transforms over the per-process engine.

``method_segments`` cuts a method's stage list at its keyed joins (stages with ``gather =
True``): every segment runs in one ParDo (``RunStages``), so a query's Retrieve → Draft →
Verify ... never crosses a shuffle; only GatherParts, keyed by query id, re-joins fanned-out
parts before the segment that gathers them. The stage names stay visible: each segment's
label lists them, every stage has Beam counters (``<stage>.done``, ``<stage>.failed``), and
each query's trace records its time per stage.

All segments of a job share one Engine per worker process (``apache_beam.utils.shared``):
a DoFn instance admits each element into it as the element arrives and emits the query when
it is done (from ``process`` once ready, the rest in ``finish_bundle``), so the queries of
every bundle and thread in the process form micro-batches together, bounded by the engine's
``max_in_flight``. ``execution="fixed-batch"`` keeps the earlier behaviour (shard, batch by
key, drain one batch at a time) for comparison in benchmarks/scaling.py.
"""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from typing import Any, Sequence, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared
from apache_beam.utils.windowed_value import WindowedValue

from specrag.inference.engine import Engine
from specrag.methods.base import method_segments  # noqa: F401  (the graph's segments: re-exported)
from specrag.transforms.batching import BatchByKey, GatherParts, shard_of
from specrag.transforms.records import DEAD, dead_letter, state_raw
from specrag.transforms.runtime import RuntimeConfig, get_services, models_loaded, worker_setup

EXECUTIONS = ("streaming", "fixed-batch")
NAMESPACE = "specrag"
log = logging.getLogger(__name__)


def segment_label(segment: Sequence[Any]) -> str:
    return "+".join(s.name for s in segment)


class _EngineHolder:
    """What Shared keeps per process: the engine and whether its loading was reported."""

    def __init__(self, runtime: RuntimeConfig):
        worker_setup(runtime)
        started, before = time.perf_counter(), models_loaded()
        self.engine = Engine(get_services(runtime), runtime.engine)
        self.models_loaded = models_loaded() - before
        self.start_s = time.perf_counter() - started  # model loads and server starts: apart from serving
        self.reported = False
        self.lock = threading.Lock()
        log.info("specrag engine started in pid %d (%d model(s) loaded, %.1f s)", os.getpid(), self.models_loaded,
                 self.start_s)


def _runtime_tag(runtime: RuntimeConfig) -> str:
    return hashlib.sha256(repr(runtime).encode()).hexdigest()[:16]


class _EngineDoFn(beam.DoFn):
    def __init__(self, stages: Sequence[Any], runtime: RuntimeConfig, shared: Shared):
        self.stages = list(stages)
        self.runtime = runtime
        self._shared = shared
        self._holder: _EngineHolder | None = None
        self._done = Metrics.counter(NAMESPACE, "queries_done")
        self._stage_done = {s.name: Metrics.counter(NAMESPACE, f"{s.name}.done") for s in self.stages}
        self._stage_failed = {s.name: Metrics.counter(NAMESPACE, f"{s.name}.failed") for s in self.stages}

    def setup(self):
        runtime = self.runtime
        self._holder = self._shared.acquire(lambda: _EngineHolder(runtime), tag=_runtime_tag(runtime))

    def start_bundle(self):
        holder = self._holder
        with holder.lock:  # once per process: how many engines / model loads the job had
            if not holder.reported:
                holder.reported = True
                Metrics.counter(NAMESPACE, "engines_started").inc()
                Metrics.counter(NAMESPACE, "models_loaded").inc(holder.models_loaded)
                # summed over processes (each starts its own; they start at once): the manifest's
                # engine_start_ms / engines_started is a worker's wait before its first query
                Metrics.counter(NAMESPACE, "engine_start_ms").inc(round(1000 * holder.start_s))

    def _outputs(self, state, outcome):
        """(tag or None, value) pairs of one finished query."""
        for name in outcome.stages:
            self._stage_done[name].inc()
        if outcome.error is not None:
            self._stage_failed[outcome.stage].inc()
            yield DEAD, dead_letter(state.id, outcome.stage, outcome.error, state_raw(state))
            return
        self._done.inc()
        for out in outcome.outputs:
            yield None, (out.id, out)

    def teardown(self):
        self._holder = None  # the engine lives while any DoFn of the process holds it


class RunStages(_EngineDoFn):
    """(id, QueryState) → (id, QueryState) after a fused segment; failures as dead letters."""

    def start_bundle(self):
        super().start_bundle()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        _, state = element
        future = self._holder.engine.submit(self.stages, state)  # blocks while the engine is full
        self._outstanding += 1
        future.add_done_callback(lambda f, s=state: self._finished.put((s, f, window, timestamp)))
        yield from self._emit(block=False)

    def finish_bundle(self):
        yield from self._emit(block=True)

    def _emit(self, block: bool):
        while self._outstanding:
            try:
                state, future, window, timestamp = self._finished.get(block=block)
            except queue.Empty:
                return
            self._outstanding -= 1
            for tag, value in self._outputs(state, future.result()):
                wv = WindowedValue(value, timestamp, [window])
                yield wv if tag is None else beam.pvalue.TaggedOutput(tag, wv)


class _RunStagesOnBatch(_EngineDoFn):
    """The fixed-batch execution: one Beam batch submitted and drained before the next."""

    def process(self, batch):
        for state, outcome in zip(batch, self._holder.engine.run_stages(self.stages, batch)):
            for tag, value in self._outputs(state, outcome):
                yield value if tag is None else beam.pvalue.TaggedOutput(tag, value)


class RunSegment(beam.PTransform):
    """(id, QueryState) → ((id, QueryState) outputs, [dead letters]) for one fused segment,
    preceded by GatherParts when the segment starts with a gathering stage."""

    def __init__(self, segment: Sequence[Any], runtime: RuntimeConfig, shared: Shared, *,
                 execution: str = "streaming", batch_size: int = 16, num_shards: int = 4,
                 gather_timeout_s: float | None = None):
        super().__init__()
        if execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
        if batch_size < 1 or num_shards < 1:
            raise ValueError("batch_size and num_shards must be >= 1")
        self.segment, self.runtime, self.shared = list(segment), runtime, shared
        self.execution, self.batch_size, self.num_shards = execution, batch_size, num_shards
        self.gather_timeout_s = gather_timeout_s

    def expand(self, keyed):
        dead = []
        first = self.segment[0]
        if first.gather:
            # The keyed join's shuffle, made explicit: without it the segment before it fuses into
            # the stateful GatherParts stage, and the FnApiRunner runs a stateful stage on one
            # worker (fn_runner.py: "a single key cannot be processed concurrently"), so the fan-out
            # method's model work never spread over worker processes. Distributed runners shuffle
            # before a stateful ParDo anyway.
            keyed = keyed | "PartsToJoin" >> beam.Reshuffle()
            keyed = keyed | "TypedKeys" >> beam.Map(lambda kv: kv).with_output_types(Tuple[str, Any])  # str key coder
            joined = keyed | "GatherParts" >> beam.ParDo(
                GatherParts(first.name, self.gather_timeout_s)).with_input_types(
                    Tuple[str, Any]).with_outputs(DEAD, main="out")
            keyed = joined.out
            dead.append(joined[DEAD])
        if self.execution == "streaming":
            ran = keyed | "Run" >> beam.ParDo(RunStages(self.segment, self.runtime, self.shared)).with_outputs(
                DEAD, main="out")
        else:
            n = self.num_shards
            ran = (keyed
                   | "ShardByQuery" >> beam.Map(lambda kv: (shard_of(kv[0], n), kv[1])).with_output_types(
                       Tuple[int, Any])
                   | "Redistribute" >> beam.Reshuffle()
                   | "BatchByKey" >> beam.ParDo(BatchByKey(self.batch_size)).with_input_types(Tuple[int, Any])
                   | "Run" >> beam.ParDo(_RunStagesOnBatch(self.segment, self.runtime, self.shared)).with_outputs(
                       DEAD, main="out"))
        dead.append(ran[DEAD])
        return ran.out, dead

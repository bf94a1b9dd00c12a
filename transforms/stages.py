"""A method's stages as named Beam transforms.

``RunStage`` = shard by query id → BatchByKey → run the stage over each batch on the
engine (one event loop; model and retrieval calls micro-batched across the batch). A stage
that fans out yields several elements per query; a stage marked ``gather = True`` is
preceded by GatherParts, which re-joins them by query id. Each stateful step is preceded by
a Reshuffle: it spreads the keys over workers, and it keeps two stateful DoFns out of one
fused stage, where the FnApiRunner loses timers set by the second while the first's fire. Failures of single queries leave
as dead letters; the batch goes on.
"""
from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam

from specrag.inference.engine import Engine
from specrag.transforms.batching import BatchByKey, GatherParts, shard_of
from specrag.transforms.records import DEAD, dead_letter, state_raw
from specrag.transforms.runtime import RuntimeConfig, get_services


class _RunStageOnBatch(beam.DoFn):
    def __init__(self, stage, runtime: RuntimeConfig):
        self.stage = stage
        self.runtime = runtime
        self.engine: Engine | None = None

    def setup(self):
        self.engine = Engine(get_services(self.runtime), self.runtime.engine)

    def process(self, batch):
        for state, outcome in zip(batch, self.engine.run_stage(self.stage, batch)):
            if outcome.error is not None:
                yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                    state.id, self.stage.name, outcome.error, state_raw(state)))
                continue
            for out in outcome.outputs:
                yield out.id, out

    def teardown(self):
        if self.engine is not None:
            self.engine.close()


class RunStage(beam.PTransform):
    """(id, QueryState) → ((id, QueryState) outputs, dead letters)."""

    def __init__(self, stage, runtime: RuntimeConfig, *, batch_size: int, num_shards: int,
                 max_wait_s: float | None = None, gather_timeout_s: float | None = None):
        super().__init__()
        if num_shards < 1:
            raise ValueError("num_shards must be >= 1")
        self.stage, self.runtime = stage, runtime
        self.batch_size, self.num_shards, self.max_wait_s = batch_size, num_shards, max_wait_s
        self.gather_timeout_s = gather_timeout_s

    def expand(self, keyed):
        dead = []
        if getattr(self.stage, "gather", False):
            joined = keyed | "RedistributeParts" >> beam.Reshuffle() | "GatherParts" >> beam.ParDo(
                GatherParts(self.stage.name, self.gather_timeout_s)).with_input_types(
                    Tuple[str, Any]).with_outputs(DEAD, main="out")
            keyed = joined.out
            dead.append(joined[DEAD])
        n = self.num_shards
        ran = (keyed
               | "ShardByQuery" >> beam.Map(lambda kv: (shard_of(kv[0], n), kv[1]))
               | "Redistribute" >> beam.Reshuffle()
               | "BatchByKey" >> beam.ParDo(BatchByKey(self.batch_size, self.max_wait_s)).with_input_types(
                   Tuple[int, Any])
               | "Run" >> beam.ParDo(_RunStageOnBatch(self.stage, self.runtime)).with_outputs(
                   DEAD, main="out"))
        dead.append(ran[DEAD])
        return ran.out, dead

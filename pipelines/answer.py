"""`specrag answer`: queries.parquet → the method's stages → results + dead letters + manifest.

The Beam graph spells out the method: ReadQueries → ValidateQueries → KeyByQuery → one
named RunStage per stage (Retrieve, Generate, ... ) → WriteResults, with every rejected
row or failed query flattened into WriteDeadLetters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.parquetio import WriteToParquet
from apache_beam.options.pipeline_options import PipelineOptions

from specrag.methods.base import Method, QueryState
from specrag.schemas.tables import DEAD_LETTERS, RESULTS
from specrag.schemas.validation import validate_query
from specrag.pipelines.manifest import write_manifest
from specrag.transforms.parquet_io import ReadParquetRows, dataset_fingerprint, expand_inputs
from specrag.transforms.records import result_row
from specrag.transforms.runtime import RuntimeConfig
from specrag.transforms.stages import RunStage
from specrag.transforms.validate import ValidateRows


@dataclass(frozen=True)
class AnswerJob:
    queries: str
    output: str
    method: Method
    runtime: RuntimeConfig
    batch_size: int = 16
    num_shards: int = 4
    max_wait_s: float | None = None
    gather_timeout_s: float | None = None
    beam_args: tuple[str, ...] = ("--runner=FnApiRunner",)
    extra_manifest: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        self.runtime.validate(self.method.model_roles, self.method.needs_retriever)
        if self.batch_size < 1 or self.num_shards < 1:
            raise ValueError("batch_size and num_shards must be >= 1")
        expand_inputs(self.queries)


def build_answer_pipeline(p: beam.Pipeline, job: AnswerJob) -> None:
    out = Path(job.output)
    rows = p | "ReadQueries" >> ReadParquetRows(job.queries)
    valid, dead_rows = rows | "ValidateQueries" >> ValidateRows(validate_query)
    keyed = valid | "KeyByQuery" >> beam.Map(lambda q: (q["id"], QueryState(query=q)))
    dead = [dead_rows]
    for stage in job.method.stages():
        keyed, stage_dead = keyed | stage.name >> RunStage(
            stage, job.runtime, batch_size=job.batch_size, num_shards=job.num_shards,
            max_wait_s=job.max_wait_s, gather_timeout_s=job.gather_timeout_s)
        dead.extend(stage_dead)
    name, fp = job.method.name, job.method.fingerprint()
    (keyed
     | "ToResultRows" >> beam.Map(lambda kv: result_row(kv[1], name, fp))
     | "WriteResults" >> WriteToParquet(str(out / "results"), RESULTS, file_name_suffix=".parquet"))
    (dead
     | "FlattenDeadLetters" >> beam.Flatten()
     | "WriteDeadLetters" >> WriteToParquet(str(out / "dead_letters"), DEAD_LETTERS,
                                            file_name_suffix=".parquet"))


def run_answer(job: AnswerJob) -> dict:
    """Validate the job, run it, write the manifest; returns the manifest."""
    job.validate()
    out = Path(job.output)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("results-*.parquet")) + list(out.glob("dead_letters-*.parquet")):
        old.unlink()  # a rerun replaces the previous outputs, never mixes with them
    started = time.time()
    with beam.Pipeline(options=PipelineOptions(list(job.beam_args))) as p:
        build_answer_pipeline(p, job)
    return write_manifest(out, {
        "job": "answer",
        "method": job.method.name,
        "method_config": job.method.config.to_dict(),
        "config_fingerprint": job.method.fingerprint(),
        "runtime": job.runtime.to_dict(),
        "batch_size": job.batch_size, "num_shards": job.num_shards,
        "beam_args": list(job.beam_args),
        "inputs": dataset_fingerprint(expand_inputs(job.queries)),
        "wall_s": round(time.time() - started, 3),
        **job.extra_manifest,
    })

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
import pyarrow.parquet as pq
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
    resume: bool = False
    extra_manifest: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        self.runtime.validate(self.method.model_roles, self.method.needs_retriever, self.method.needs_datastore)
        if self.batch_size < 1 or self.num_shards < 1:
            raise ValueError("batch_size and num_shards must be >= 1")
        expand_inputs(self.queries)


def build_answer_pipeline(p: beam.Pipeline, job: AnswerJob, done: frozenset[str] = frozenset(),
                          attempt: int = 0) -> None:
    out = Path(job.output)
    rows = p | "ReadQueries" >> ReadParquetRows(job.queries)
    valid, dead_rows = rows | "ValidateQueries" >> ValidateRows(validate_query)
    if done:
        done_ids = p | "FinishedIds" >> beam.Create([done])
        valid = valid | "SkipFinished" >> beam.Filter(lambda q, ids: q["id"] not in ids,
                                                     ids=beam.pvalue.AsSingleton(done_ids))
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
     | "WriteResults" >> WriteToParquet(str(out / f"results-{attempt:03d}"), RESULTS,
                                        file_name_suffix=".parquet"))
    (dead
     | "FlattenDeadLetters" >> beam.Flatten()
     | "WriteDeadLetters" >> WriteToParquet(str(out / f"dead_letters-{attempt:03d}"), DEAD_LETTERS,
                                            file_name_suffix=".parquet"))


def finished_ids(out: Path, fingerprint: str) -> tuple[frozenset[str], int]:
    """Ids answered by earlier attempts of the same method config, and the next attempt number."""
    files = sorted(out.glob("results-*.parquet"))
    ids: set[str] = set()
    for f in files:
        t = pq.read_table(f, columns=["id", "config_fingerprint"])
        other = set(t.column("config_fingerprint").to_pylist()) - {fingerprint}
        if other:
            raise ValueError(f"{out} holds results of another configuration ({sorted(other)}); "
                             "resume only with the same method settings, or use a new --output")
        ids.update(t.column("id").to_pylist())
    attempts = [int(f.name.split("-")[1]) for f in files if f.name.split("-")[1].isdigit()]
    return frozenset(ids), (max(attempts) + 1 if attempts else 0)


def run_answer(job: AnswerJob) -> dict:
    """Validate the job, run it, write the manifest; returns the manifest.

    Without ``resume`` earlier outputs in the folder are replaced. With it, queries that
    already have results are skipped and only the rest run again (earlier dead letters
    are replaced by this attempt's: they are retried).
    """
    job.validate()
    out = Path(job.output)
    out.mkdir(parents=True, exist_ok=True)
    done, attempt = finished_ids(out, job.method.fingerprint()) if job.resume else (frozenset(), 0)
    stale = list(out.glob("dead_letters-*.parquet"))
    if not job.resume:
        stale += list(out.glob("results-*.parquet"))
    for old in stale:
        old.unlink()
    started = time.time()
    with beam.Pipeline(options=PipelineOptions(list(job.beam_args))) as p:
        build_answer_pipeline(p, job, done, attempt)
    return write_manifest(out, {
        "job": "answer",
        "method": job.method.name,
        "method_config": job.method.config.to_dict(),
        "config_fingerprint": job.method.fingerprint(),
        "runtime": job.runtime.to_dict(),
        "batch_size": job.batch_size, "num_shards": job.num_shards,
        "beam_args": list(job.beam_args),
        "inputs": dataset_fingerprint(expand_inputs(job.queries)),
        "resumed": {"attempt": attempt, "skipped_finished": len(done)} if job.resume else None,
        "wall_s": round(time.time() - started, 3),
        **job.extra_manifest,
    })

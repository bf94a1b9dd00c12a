"""`specrag extract-triplets`: corpus Parquet → knowledge triplets Parquet, offline, at corpus scale.

Read passages (any FileSystems path) → validate (bad rows to dead letters) → RunInference
with the extractor (loaded once per worker, batched) → paired shards written as passages
finish (``triplets-*.parquet`` + ``extracted-*.parquet``, see transforms/triplets.py) and
dead letters → manifest with counts and passages/s. ``--resume`` completes a killed run
(finished passages are skipped, inside the job); the run identity (extractor, its model and
rules) must match the earlier attempt's.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.ml.inference.base import RunInference

from specrag.jobio.job_run import job_run
from specrag.jobio.run_folder import EXTRACT_TRIPLETS, RunFailed, RunFolder
from specrag.pipelines.manifest import job_counters, write_manifest
from specrag.pipelines.options import new_pipeline
from specrag.schemas.tables import DEAD_LETTERS, PASSAGE_COLUMNS
from specrag.schemas.validation import validate_passage
from specrag.jobio.files import delete, join, match_files, read_parquet
from specrag.transforms.parquet_io import ReadParquetRows
from specrag.jobio.inputs import dataset_fingerprint, expand_inputs, expand_tables
from specrag.transforms.sinks import WriteParquetShards
from specrag.transforms.progress import CountProgress, count_ids, count_rows, progress_dir, watch_progress
from specrag.transforms.triplets import (NAMESPACE, ExtractorConfig, TripletModelHandler, WriteTripletShards,
                                         split_outcomes, to_passage)
from specrag.transforms.validate import ReadIds, ValidateRows

@dataclass
class ExtractJob:
    corpus: str
    output: str
    extractor: ExtractorConfig
    beam_args: tuple[str, ...] = ("--runner=FnApiRunner",)
    batch_size: int = 64  # passages per extractor call (BatchElements' maximum)
    shard_passages: int = 5000
    resume: bool = False
    overwrite: bool = False
    bad_files: str = "fail"
    max_failure_fraction: float = 0.5

    def validate(self) -> None:
        self.extractor.validate()
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        if self.batch_size < 1 or self.shard_passages < 1:
            raise ValueError("--extract-batch and --shard-passages must be >= 1")
        if not 0 <= self.max_failure_fraction <= 1:
            raise ValueError("--max-failure-fraction must be within [0, 1]")


ExtractionFailed = RunFailed  # more passages failed than --max-failure-fraction allows (everything is written)


def committed_shards(folder: str) -> list[str]:
    """Shard names whose extracted-* twin exists (the twin is written last)."""
    return sorted(f.rsplit("/", 1)[-1][len("extracted-"):-len(".parquet")]
                  for f in match_files(join(folder, "extracted-*.parquet")))


def _prepare_output(job: ExtractJob, folder: RunFolder) -> list[str]:
    """Clear what this attempt replaces; returns the extracted-* files of earlier attempts (resume)."""
    out = job.output
    committed = set(committed_shards(out)) if job.resume else set()
    stale = [f for f in match_files(join(out, "triplets-*.parquet"))
             if f.rsplit("/", 1)[-1][len("triplets-"):-len(".parquet")] not in committed]
    delete(stale)
    folder.clear_for_attempt(job.resume)
    return [join(out, f"extracted-{s}.parquet") for s in sorted(committed)]


def build_extract_pipeline(p: beam.Pipeline, job: ExtractJob, finished_files: list[str] = ()) -> None:
    reader = ReadParquetRows(job.corpus, bad_files=job.bad_files)
    finished = p | "ReadFinished" >> ReadIds(finished_files, "passage_id") if finished_files else None
    valid, rejected = p | "ValidatePassages" >> ValidateRows(reader, validate_passage, finished=finished)
    valid = valid | "SpreadPassages" >> beam.Reshuffle()  # over the workers: a corpus may be one row group
    handler = TripletModelHandler(job.extractor, min_batch_size=min(16, job.batch_size), max_batch_size=job.batch_size)
    results = (valid
               | "ToPassages" >> beam.Map(to_passage)
               | "Extract" >> RunInference(handler))
    done, failed = split_outcomes(results)
    (done | "ProgressExtracted" >> CountProgress(progress_dir(job.output), "done")
     | "WriteTriplets" >> WriteTripletShards(job.output, job.extractor.extractor, job.shard_passages))
    dead = [failed, rejected | "CountRejected" >> beam.Map(_count_rejected)]
    if reader.bad:
        dead.append(reader.dead_letters(p) | "CountUnreadable" >> beam.Map(_count_rejected))
    (dead | "AllDeadLetters" >> beam.Flatten()
     | "ProgressDead" >> CountProgress(progress_dir(job.output), "dead")
     | "WriteDeadLetters" >> WriteParquetShards(join(job.output, "dead_letters"), DEAD_LETTERS,
                                                max_rows=10000, counter="dead_letter_rows"))


def _count_rejected(row: dict) -> dict:
    from apache_beam.metrics import Metrics
    Metrics.counter(NAMESPACE, f"dead_letters.{row['stage']}.{row['error_type']}").inc()
    Metrics.counter(NAMESPACE, "dead_letters").inc()
    return row


def run_extract_triplets(job: ExtractJob) -> dict:
    """Run the job, write the manifest (counts, passages/s); returns it.

    Raises ExtractionFailed (after writing everything) when the dead-letter share of the
    passages this attempt handled exceeds ``max_failure_fraction``."""
    job.validate()
    identity = {"job": "extract-triplets", **job.extractor.identity()}
    expand_tables(job.corpus, PASSAGE_COLUMNS, "corpus")  # before the folder is touched
    with job_run(job.output, EXTRACT_TRIPLETS, identity, resume=job.resume, overwrite=job.overwrite) as run:
        manifest = _run(job, identity, run.folder)
        # every attempt's: earlier dead letters were retried by this one
        run.judge(manifest["over_the_run"]["reconciliation"], job.max_failure_fraction)
    return manifest


def _run(job: ExtractJob, identity: dict, folder: RunFolder) -> dict:
    finished = _prepare_output(job, folder)
    started = time.time()
    p = new_pipeline(job.beam_args)
    build_extract_pipeline(p, job, finished)
    total = count_rows(expand_inputs(job.corpus))
    if total is not None and finished:
        total = max(0, total - count_ids(finished, "passage_id"))
    with watch_progress("extract-triplets", job.output, total, unit="passages"):
        result = p.run()
        result.wait_until_finish()
    wall = time.time() - started
    counters = job_counters(result, NAMESPACE)
    passages = counters.get("passages", 0)
    failed = counters.get("dead_letters", 0)
    if not counters:  # a runner without metrics: count the files
        passages = sum(read_parquet(f, columns=["passage_id"]).num_rows
                       for f in match_files(join(job.output, "extracted-*.parquet")))
        failed = sum(read_parquet(f, columns=["id"]).num_rows
                     for f in match_files(join(job.output, "dead_letters-*.parquet")))
    fingerprint = _fingerprint(identity, job.corpus)
    inputs = dataset_fingerprint(expand_inputs(job.corpus))
    manifest = write_manifest(job.output, {
        "job": "extract-triplets", "identity": identity, "fingerprint": fingerprint, "inputs": inputs,
        "beam_args": list(job.beam_args), "batch_size": job.batch_size,
        "resumed": {"earlier_shards": len(finished), "skipped_finished": counters.get("skipped_finished", 0)}
        if job.resume else None,
        "passages": passages, "dead_letters": failed, "triplets": counters.get("triplets"),
        "passages_without_triplets": counters.get("passages_without_triplets"),
        "sentences": counters.get("sentences"),
        "wall_s": round(wall, 3), "passages_per_s": round(passages / wall, 2) if wall > 0 else None,
        "counters": counters,
        "over_the_run": {"passages": count_ids(match_files(join(job.output, "extracted-*.parquet")), "passage_id"),
                         "dead_letters": failed,
                         "reconciliation": folder.reconcile(inputs)},
    })
    return manifest


def _fingerprint(identity: dict, corpus: str) -> str:
    """Which extractor over which corpus: AED-RAG's runs name the triplet sets they read."""
    import hashlib
    files = dataset_fingerprint(expand_inputs(corpus))
    # a local corpus by its sha256 (as every earlier set), a remote one by its store's checksum
    content = sorted(v.get("sha256") or f"{v['checksum']}:{v['size']}" for v in files.values())
    return hashlib.sha256(json.dumps([identity, content],
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]

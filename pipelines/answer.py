"""`specrag answer`: queries.parquet → the method's stages → results + dead letters + manifest.

The Beam graph spells out the method: ValidateQueries (reads the queries twice: ids and
positions keyed by id, then the rows) → SpreadQueries (the shuffle that spreads queries over
workers) → one fused ParDo per segment of stages, named
after them (``Retrieve+Generate``; a keyed GatherParts before a segment that re-joins
fanned-out parts, e.g. ``Retrieve+SampleSubsets+Draft+Verify`` → GatherParts → ``Select``)
→ WriteResults, with every rejected row or failed query flattened into WriteDeadLetters.
A run whose dead-letter share exceeds ``max_failure_fraction`` fails after writing everything.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions

from specrag.methods.base import Method, QueryState
from specrag.schemas.tables import QUERY_COLUMNS
from specrag.schemas.validation import validate_query
from specrag.jobio.files import exists, join, read_text
from specrag.jobio.job_run import JobRun, job_run
from specrag.jobio.run_folder import ANSWER, failure_share, input_contents
from specrag.pipelines.manifest import job_counters, write_manifest
from specrag.pipelines.identity import keep_earlier_prefill, run_fingerprint, run_identity  # noqa: F401
from specrag.pipelines.options import (AnswerOptions, GrowOptions, OutputOptions, ReplaceOptions, RuntimeOptions,
                                       StreamOptions, dataflow_template, in_process_runner, job_options,
                                       new_pipeline)
from specrag.pipelines.answer_tail import run_method, write_dead_letters, write_results
from specrag.pipelines.streaming import check_streaming_input, run_streaming_answer
from specrag.transforms.parquet_io import ReadParquetRows
from specrag.jobio.inputs import dataset_fingerprint, expand_inputs, expand_tables
from specrag.transforms.progress import count_ids, count_rows, watch_progress
from specrag.transforms.counters import count_element
from specrag.transforms.runtime import RuntimeConfig
from specrag.transforms.stages import NAMESPACE
from specrag.transforms.validate import ReadIds, ValidateRows


@dataclass(frozen=True)
class AnswerJob:
    queries: str
    output: str
    method: Method
    runtime: RuntimeConfig
    batch_size: int = 16
    num_shards: int = 4
    gather_timeout_s: float | None = None
    beam_args: tuple[str, ...] = ("--runner=FnApiRunner",)
    resume: bool = False
    # with resume: the queries the earlier attempts answered, when ``queries`` now holds them and
    # more (a suite's first 30 questions grown to its first 100): their results are kept
    grow_from: str | None = None
    overwrite: bool = False
    # streaming: queries admitted into the per-process engine as they arrive;
    # fixed-batch: the earlier shard → batch → drain-one-batch execution (for comparisons)
    execution: str = "streaming"
    max_failure_fraction: float = 0.5
    shard_rows: int = 1000  # results/dead letters written in shards of this many rows as they finish
    bad_files: str = "fail"  # or "dead-letter": an unreadable input file becomes one dead letter
    extra_manifest: dict[str, Any] = field(default_factory=dict)
    stream: Any = None  # StreamSettings (pipelines/options.py): answer an unbounded source as it arrives
    limit: int | None = None  # only the first N query rows (files sorted, then row order)
    start_line: str = ""  # said once the job starts (the CLI's: worker processes x threads)

    def validate(self) -> None:
        self.runtime.validate(self.method.needs, self.method.needs_retriever, method=f"method {self.method.name!r}",
                              resources=self.method.resources)
        if self.batch_size < 1 or self.num_shards < 1:
            raise ValueError("batch_size and num_shards must be >= 1")
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {self.max_failure_fraction}")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        if self.grow_from is not None and not self.resume:
            raise ValueError("--grow-from keeps an earlier run's results: it needs --resume")
        if self.limit is not None and (self.limit < 1 or self.stream is not None):
            raise ValueError("--limit takes the first N >= 1 rows of a batch run's queries" +
                             (" (a streaming run has no fixed input)" if self.stream is not None else
                              f", got {self.limit}"))
        if self.grow_from is not None and self.stream is not None:
            raise ValueError("--grow-from grows a batch run over a larger query file; a streaming run has no fixed input")
        if self.stream is not None:
            self.stream.validate()  # an unbounded source may hold no file yet
        else:
            expand_tables(self.queries, QUERY_COLUMNS, "queries")


def build_answer_pipeline(p: beam.Pipeline, job: AnswerJob, finished_files: list[str] = (),
                          attempt: int = 0, fingerprint: str | None = None, lease_token: str | None = None) -> None:
    """The job's graph. ``finished_files``: earlier results, read by the job itself and
    anti-joined with the input by id in the validation's GroupById (no ids in the graph).
    ``lease_token``: every shard commit checks that the output folder's lease is still this run's."""
    read = ReadParquetRows(job.queries, job.bad_files, job.limit)
    finished = p | "ReadFinished" >> ReadIds(finished_files, "id") if finished_files else None
    validator = functools.partial(validate_query, task_types=job.method.task_types)
    valid, dead_rows = p | "ValidateQueries" >> ValidateRows(read, validator, finished=finished)
    # spread the queries over the workers: validation reads them a row group at a time, and a
    # small input is one row group (one worker would answer all of it)
    valid = valid | "SpreadQueries" >> beam.Reshuffle()
    keyed = (valid | "CountQueries" >> beam.Map(count_element("queries_in"))
             | "KeyByQuery" >> beam.Map(lambda q: (q["id"], QueryState(query=q))))
    dead = [dead_rows]
    if read.bad:
        dead.append(read.dead_letters(p))
    answered, failed = run_method(keyed, job, job.execution, batch_size=job.batch_size, num_shards=job.num_shards)
    write_results(answered, job, fingerprint or run_fingerprint(run_identity(job)), f"results-{attempt:03d}",
                  lease_token)
    write_dead_letters([*dead, *failed] | "FlattenDeadLetters" >> beam.Flatten(), job, f"dead_letters-{attempt:03d}",
                       lease_token)


def run_answer(job: AnswerJob) -> dict:
    """Validate the job, run it, write the manifest; returns the manifest.

    The output folder follows ``RunFolder``'s rules (jobio/run_folder.py): a folder that already
    holds a run is refused unless ``resume`` (queries that already have results are skipped and
    only the rest run again; earlier dead letters are retried) or ``overwrite`` (a transaction:
    the earlier run comes back if this one fails for any reason or is killed). Raises RunFailed
    after writing everything when the dead-letter share of the input, over every attempt,
    exceeds ``max_failure_fraction``, or when input rows are in neither results nor dead letters.

    Example usage::

        manifest = run_answer(AnswerJob("queries.parquet", "out/", create_method("standard"), runtime))
    """
    job.validate()
    if job.stream is not None:
        return run_streaming_answer(job)
    identity = run_identity(job)
    fingerprint = run_fingerprint(identity)
    template = dataflow_template(job.beam_args)
    if template:  # the job's graph as Dataflow would run it, written there; nothing runs
        p = new_pipeline(job.beam_args)
        build_answer_pipeline(p, job, [], 0, fingerprint, None)
        p.run()
        return {"job": "answer", "template": template, "run_fingerprint": fingerprint, "identity": identity}
    inputs = dataset_fingerprint(expand_inputs(job.queries), job.limit)
    earlier = dataset_fingerprint(expand_inputs(job.grow_from)) if job.resume and job.grow_from else None
    with job_run(job.output, ANSWER, identity, resume=job.resume, overwrite=job.overwrite, inputs=inputs,
                 grow_from=earlier, grow_from_name=job.grow_from or "") as run:
        manifest = _run(job, run, identity, fingerprint, inputs)
        run.judge(manifest["reconciliation"], job.max_failure_fraction)
    return manifest


def _run(job: AnswerJob, run: JobRun, identity: dict, fingerprint: str, inputs: dict) -> dict:
    out, folder = job.output, run.folder
    done, attempt = folder.finished() if job.resume else ([], 0)
    folder.clear_for_attempt(job.resume)
    job.method.warn_departures()
    started = time.time()
    p = new_pipeline(job.beam_args)
    build_answer_pipeline(p, job, done, attempt, fingerprint, run.token)
    total = count_rows(expand_inputs(job.queries))
    if total is not None and job.limit is not None:
        total = min(total, job.limit)
    if total is not None and done:
        total = max(0, total - count_ids(done, "id"))
    if job.start_line:  # the graph is built: its inputs are readable, the job starts now
        print(job.start_line, file=sys.stderr, flush=True)
    with watch_progress(f"answer {job.method.name}", out, total):
        result = p.run()
        result.wait_until_finish()
    counters = job_counters(result, NAMESPACE)
    wall = round(time.time() - started, 3)
    rec = folder.reconcile(inputs)
    earlier = json.loads(read_text(join(out, "manifest.json"))) if job.resume and exists(join(out, "manifest.json")) else {}
    this = {"attempt": attempt, "wall_s": wall, "counters": counters,
            **({"grew_from": input_contents(run.grown)} if run.grown else {}),  # the input its earlier attempts answered
            **({"lease_takeover": run.took_over} if run.took_over else {})}  # a killed run's lease this attempt took
    attempts = [*(earlier.get("attempts") or []), this]
    manifest = write_manifest(out, {
        "job": "answer",
        "method": job.method.name,
        "method_config": job.method.config.to_dict(),
        "run_fingerprint": fingerprint,
        "method_fingerprint": job.method.fingerprint(),
        "departures_from_paper": job.method.departures(),
        "identity": identity,
        "runtime": job.runtime.to_dict(),
        "batch_size": job.batch_size, "num_shards": job.num_shards,
        "beam_args": list(job.beam_args),
        "inputs": inputs,
        "resumed": {"attempt": attempt, "skipped_finished": counters.get("skipped_finished", 0)}
        if job.resume else None,
        "wall_s": wall,
        "execution": job.execution, "max_in_flight": job.runtime.engine.max_in_flight,
        "counters": counters,  # this attempt's; every attempt's are under "attempts"
        "attempts": attempts,
        "reconciliation": rec,
        "dead_letter_share": failure_share(rec),
        "max_failure_fraction": job.max_failure_fraction,
        **job.extra_manifest,
    })
    return manifest


def answer_job_from_flags(flags: list[str], command: str = "answer", method_name: str | None = None):
    """The answer job its flags describe, checked (label-utility: with the aed-label method).

    Example usage::

        job = answer_job_from_flags(["--queries=q.parquet", "--output=out", "--index=idx", "--method=sps"])
    """
    from specrag.methods import create_method
    from specrag.methods.base import parse_settings
    options, beam_args = job_options(flags)
    a, o, r = options.view_as(AnswerOptions), options.view_as(OutputOptions), options.view_as(ReplaceOptions)
    a.validate()
    r.validate()
    streaming = bool(options.view_as(StandardOptions).streaming)
    stream = options.view_as(StreamOptions).settings() if streaming else None
    check_streaming_input(a.queries, streaming, options.view_as(StandardOptions).runner or "", stream)
    name = method_name or a.method
    if method_name and a.method not in ("standard", method_name):  # standard: the flag's default
        raise ValueError(f"{command} runs method {method_name!r}; drop --method {a.method}")
    method = create_method(name, **parse_settings(name, a.set or []))
    runtime = options.view_as(RuntimeOptions).runtime_config(method)
    if options.view_as(RuntimeOptions).prefix_cache_mb is None and not r.overwrite:
        runtime = keep_earlier_prefill(runtime, o.output)
    return AnswerJob(a.queries, o.output, method, runtime, batch_size=a.batch_size,
                     num_shards=a.shards, beam_args=beam_args, resume=o.resume,
                     grow_from=options.view_as(GrowOptions).grow_from,
                     overwrite=r.overwrite, execution=a.execution,
                     max_failure_fraction=r.max_failure_fraction, gather_timeout_s=a.gather_timeout,
                     shard_rows=a.shard_rows, bad_files=o.bad_files, stream=stream, limit=a.limit,
                     start_line=options.view_as(RuntimeOptions).workers_line(f"{command} {name}")
                     if in_process_runner(options) else "")

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
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared

from specrag.methods.base import Method, QueryState
from specrag.schemas.tables import DEAD_LETTERS
from specrag.schemas.validation import validate_query
from specrag.pipelines.manifest import identity_differences, job_counters, write_manifest
from specrag.pipelines.options import new_pipeline
from specrag.transforms.files import (delete, exists, join, match_files, mkdirs, read_parquet, read_text, replacing,
                                      write_text)
from specrag.transforms.parquet_io import ReadParquetRows, dataset_fingerprint, expand_inputs
from specrag.transforms.lease import Lease
from specrag.transforms.sinks import WriteParquetShards
from specrag.transforms.progress import CountProgress, count_ids, count_rows, progress_dir, watch_progress
from specrag.transforms.records import result_row
from specrag.transforms.runtime import RuntimeConfig
from specrag.transforms.stages import NAMESPACE, RunSegment, method_segments, segment_label
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
    stream: Any = None  # StreamSettings (pipelines/streaming.py): answer an unbounded source as it arrives

    def validate(self) -> None:
        self.runtime.validate(self.method.needs, self.method.needs_retriever, self.method.needs_datastore,
                              method=f"method {self.method.name!r}", needs_triplets=self.method.needs_triplets)
        if self.batch_size < 1 or self.num_shards < 1:
            raise ValueError("batch_size and num_shards must be >= 1")
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {self.max_failure_fraction}")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        if self.grow_from is not None and not self.resume:
            raise ValueError("--grow-from keeps an earlier run's results: it needs --resume")
        if self.grow_from is not None and self.stream is not None:
            raise ValueError("--grow-from grows a batch run over a larger query file; a streaming run has no fixed input")
        if self.stream is not None:
            self.stream.validate()  # an unbounded source may hold no file yet
        else:
            expand_inputs(self.queries)


class RunFailed(RuntimeError):
    """The run wrote its outputs, but too many queries ended as dead letters."""


def _count(metric: str):
    counter = Metrics.counter(NAMESPACE, metric)

    def inc(element):
        counter.inc()
        return element
    return inc


def _count_dead(row: dict) -> dict:
    Metrics.counter(NAMESPACE, f"dead_letters.{row['stage']}.{row['error_type']}").inc()
    return row


def _result_row(kv, name: str, fingerprint: str) -> dict:
    row = result_row(kv[1], name, fingerprint)
    counts = row["counts"]
    for key in ("model_calls", "prompt_tokens", "generated_tokens", "retrieval_calls", "embed_calls"):
        if counts.get(key):
            Metrics.counter(NAMESPACE, key).inc(counts[key])
    Metrics.counter(NAMESPACE, "answered").inc()
    return row


def build_answer_pipeline(p: beam.Pipeline, job: AnswerJob, finished_files: list[str] = (),
                          attempt: int = 0, fingerprint: str | None = None, lease_token: str | None = None) -> None:
    """The job's graph. ``finished_files``: earlier results, read by the job itself and
    anti-joined with the input by id in the validation's GroupById (no ids in the graph).
    ``lease_token``: every shard commit checks that the output folder's lease is still this run's."""
    out = job.output
    read = ReadParquetRows(job.queries, job.bad_files)
    finished = p | "ReadFinished" >> ReadIds(finished_files, "id") if finished_files else None
    validator = functools.partial(validate_query, task_types=job.method.task_types)
    valid, dead_rows = p | "ValidateQueries" >> ValidateRows(read, validator, finished=finished)
    # spread the queries over the workers: validation reads them a row group at a time, and a
    # small input is one row group (one worker would answer all of it)
    valid = valid | "SpreadQueries" >> beam.Reshuffle()
    keyed = (valid | "CountQueries" >> beam.Map(_count("queries_in"))
             | "KeyByQuery" >> beam.Map(lambda q: (q["id"], QueryState(query=q))))
    dead = [dead_rows]
    if read.bad:
        dead.append(read.dead_letters(p))
    shared = Shared()  # one engine per worker process for every segment of the job
    for segment in method_segments(job.method.stages()):
        keyed, stage_dead = keyed | segment_label(segment) >> RunSegment(
            segment, job.runtime, shared, execution=job.execution, batch_size=job.batch_size,
            num_shards=job.num_shards, gather_timeout_s=job.gather_timeout_s)
        dead.extend(stage_dead)
    name, fp = job.method.name, fingerprint or run_fingerprint(run_identity(job))
    (keyed
     | "ToResultRows" >> beam.Map(_result_row, name, fp)
     | "ProgressAnswered" >> CountProgress(progress_dir(out), "done")
     | "WriteResults" >> WriteParquetShards(join(out, f"results-{attempt:03d}"), job.method.results_schema(),
                                            job.shard_rows, counter="results", lease_token=lease_token))
    (dead
     | "FlattenDeadLetters" >> beam.Flatten()
     | "CountDeadLetters" >> beam.Map(_count_dead)
     | "ProgressDead" >> CountProgress(progress_dir(out), "dead")
     | "WriteDeadLetters" >> WriteParquetShards(join(out, f"dead_letters-{attempt:03d}"), DEAD_LETTERS,
                                                job.shard_rows, counter="dead_letters", lease_token=lease_token))


IDENTITY_FILE = "identity.json"
INPUTS_FILE = "inputs.json"  # the input files' contents (no paths), written before the run


def run_identity(job: AnswerJob) -> dict[str, Any]:
    """Everything that decides a query's result: method and settings, models (weight hashes),
    backend, dtype, retriever and index, datastore, prompt templates."""
    import hashlib
    import inspect
    from specrag.methods import prompts
    return {"method": job.method.name, "method_config": job.method.config.to_dict(), **job.runtime.identity(),
            "prompts": hashlib.sha256(inspect.getsource(prompts).encode()).hexdigest()[:16]}


def run_fingerprint(identity: dict[str, Any]) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_resumable(out: str, identity: dict[str, Any]) -> None:
    """Refuse to resume a folder whose earlier run had another identity, saying what differs.
    The identity file is written before a run starts, so it covers every result file there."""
    path = join(out, IDENTITY_FILE)
    if not exists(path):
        if match_files(join(out, "results-*.parquet")):
            raise ValueError(f"cannot resume {out}: it holds results but no {IDENTITY_FILE} that says how "
                             "they were made; use --overwrite or a new --output")
        return
    diffs = identity_differences(json.loads(read_text(path)), json.loads(json.dumps(identity, default=str)))
    if diffs:
        raise ValueError(f"cannot resume {out}: its results were made with a different run identity "
                         f"({'; '.join(diffs)}); use the same settings, --overwrite, or a new --output")


def input_contents(inputs: dict) -> list[dict]:
    """What the input files hold, without their paths: the same queries copied to a bucket are
    the same input; a different file is not."""
    return sorted((v for v in inputs.values()), key=lambda v: json.dumps(v, sort_keys=True))


def recorded_inputs(out: str) -> list[dict] | None:
    """What the input files of the run in ``out`` held (``input_contents``), from inputs.json or,
    for a run from before that file was written, its manifest; None when neither says."""
    if exists(join(out, INPUTS_FILE)):
        return json.loads(read_text(join(out, INPUTS_FILE)))
    if exists(join(out, "manifest.json")):
        return input_contents(json.loads(read_text(join(out, "manifest.json"))).get("inputs") or {}) or None
    return None


def check_same_inputs(out: str, inputs: dict, grow_from: str | None = None) -> dict | None:
    """Refuse to resume a folder whose earlier attempts answered other input files: the results
    would mix two query sets. With ``grow_from`` the earlier input may be a part of this one: it
    must be exactly what the earlier attempts answered, and every one of its rows must be in this
    input unchanged; returns its fingerprint then (None when the inputs are the same)."""
    recorded = recorded_inputs(out)
    if recorded is None or recorded == json.loads(json.dumps(input_contents(inputs))):
        return None
    if grow_from is None:
        raise ValueError(f"cannot resume {out}: its results were made from other input files than "
                         f"{', '.join(inputs) or 'these'}; use the same --queries, --grow-from EARLIER_QUERIES when "
                         "these queries hold the earlier ones and more, --overwrite, or a new --output")
    earlier = dataset_fingerprint(expand_inputs(grow_from))
    if recorded != json.loads(json.dumps(input_contents(earlier))):
        raise ValueError(f"cannot grow {out} from {grow_from}: its results were made from other input files "
                         f"({sum(r.get('rows') or 0 for r in recorded)} rows) than {grow_from}")
    missing = rows_not_contained(list(earlier), list(inputs))
    if missing:
        raise ValueError(f"cannot grow {out} from {grow_from}: {len(missing)} of its rows are not in the new input "
                         f"unchanged (first: id {missing[0]!r}); the earlier results would answer other questions")
    return earlier


def rows_not_contained(earlier: list[str], files: list[str]) -> list[str]:
    """Ids of the rows of the ``earlier`` files that ``files`` lack or hold with other content, in file order."""
    import hashlib

    def digest(row: dict) -> str:
        return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()
    held = {(r.get("id"), digest(r)) for f in files for r in read_parquet(f).to_pylist()}
    return [str(r.get("id")) for f in earlier for r in read_parquet(f).to_pylist()
            if (r.get("id"), digest(r)) not in held]


def finished_files(out: str) -> tuple[list[str], int]:
    """Earlier attempts' result files and the next attempt number (``check_resumable`` has
    made sure they share this run's identity)."""
    files = match_files(join(out, "results-*.parquet"))
    attempts = [int(n.split("-")[1]) for n in (f.rsplit("/", 1)[-1] for f in files) if n.split("-")[1].isdigit()]
    return files, (max(attempts) + 1 if attempts else 0)


def run_answer(job: AnswerJob) -> dict:
    """Validate the job, run it, write the manifest; returns the manifest.

    A folder that already holds results is refused unless ``resume`` (queries that already
    have results are skipped and only the rest run again; earlier dead letters are replaced
    by this attempt's: they are retried) or ``overwrite`` (the earlier run's files are set aside,
    put back if this run fails, and deleted once it has written its outputs and manifest).
    Raises RunFailed after writing everything when the dead-letter share of the input, over
    every attempt, exceeds ``max_failure_fraction``, or when input rows are in neither results
    nor dead letters (``reconcile``).
    """
    job.validate()
    if job.stream is not None:
        from specrag.pipelines.streaming import run_streaming_answer
        return run_streaming_answer(job)
    out = job.output
    refuse_earlier_run(job)
    identity = run_identity(job)
    fingerprint = run_fingerprint(identity)
    inputs = dataset_fingerprint(expand_inputs(job.queries))
    grown = None
    if job.resume:
        check_resumable(out, identity)
        grown = check_same_inputs(out, inputs, job.grow_from)
    mkdirs(out)
    with Lease(out) as lease:  # one writer per folder: a second run is refused here
        # --overwrite removes nothing yet: the earlier run is set aside, put back if this run
        # fails, deleted once it has written its outputs and manifest
        with replacing(out, lambda: run_files(out), job.overwrite and not job.resume):
            manifest = _run(job, identity, fingerprint, inputs, lease.token, grown)
    rec = manifest["reconciliation"]
    if rec["lost"] > 0:
        raise RunFailed(f"{reconciliation_line(rec)}: {rec['lost']} input rows are in neither results nor dead "
                        f"letters; outputs and manifest are in {out}")
    if manifest["dead_letter_share"] > job.max_failure_fraction:
        what = "input rows and unreadable files" if rec["unreadable_files"] else "input rows"
        raise RunFailed(f"{rec['dead_letters']} of {rec['results'] + rec['dead_letters']} {what} "
                        f"ended as dead letters ({manifest['dead_letter_share']:.0%} > --max-failure-fraction "
                        f"{job.max_failure_fraction}, over every attempt of the run); outputs and manifest are in {out}")
    return manifest


def refuse_earlier_run(job: AnswerJob) -> None:
    """An earlier run's outputs are kept unless --resume or --overwrite says what to do with them
    (an identity file alone is a run that produced nothing: there is nothing to lose)."""
    out = job.output
    if not (job.resume or job.overwrite):
        earlier = [name for name, pattern in (("results", "results-*.parquet"), ("dead letters", "dead_letters-*.parquet"),
                                              ("a manifest", "manifest.json")) if match_files(join(out, pattern))]
        if earlier:
            raise ValueError(f"{out} already holds an earlier run ({', '.join(earlier)}): pass --resume to complete "
                             "that run, --overwrite to replace it, or choose another --output")


def run_files(out: str) -> list[str]:
    """A run's own files in its folder (results, dead letters, manifest, identity, inputs)."""
    return [f for pattern in ("results-*.parquet", "dead_letters-*.parquet", "manifest.json", IDENTITY_FILE,
                              INPUTS_FILE) for f in match_files(join(out, pattern))]


def _run(job: AnswerJob, identity: dict, fingerprint: str, inputs: dict, lease_token: str,
         grown: dict | None = None) -> dict:
    out = job.output
    # written before the run: a killed run can still only be resumed with the same identity and inputs
    write_text(join(out, IDENTITY_FILE), json.dumps(identity, indent=2, sort_keys=True, default=str))
    write_text(join(out, INPUTS_FILE), json.dumps(input_contents(inputs), indent=2))
    done, attempt = finished_files(out) if job.resume else ([], 0)
    stale = match_files(join(out, "dead_letters-*.parquet")) + match_files(join(out, ".*.inprogress"))
    if not job.resume:
        stale += match_files(join(out, "results-*.parquet"))
    delete(stale)
    job.method.warn_departures()
    started = time.time()
    p = new_pipeline(job.beam_args)
    build_answer_pipeline(p, job, done, attempt, fingerprint, lease_token)
    total = count_rows(expand_inputs(job.queries))
    if total is not None and done:
        total = max(0, total - count_ids(done, "id"))
    with watch_progress(f"answer {job.method.name}", out, total):
        result = p.run()
        result.wait_until_finish()
    counters = job_counters(result, NAMESPACE)
    wall = round(time.time() - started, 3)
    rec = reconcile(out, inputs)
    earlier = json.loads(read_text(join(out, "manifest.json"))) if job.resume and exists(join(out, "manifest.json")) else {}
    this = {"attempt": attempt, "wall_s": wall, "counters": counters,
            **({"grew_from": input_contents(grown)} if grown else {})}  # the input its earlier attempts answered
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
        "dead_letter_share": _share(rec),
        "max_failure_fraction": job.max_failure_fraction,
        **job.extra_manifest,
    })
    return manifest


def reconcile(out: str, inputs: dict) -> dict:
    """Where every input row went, over all attempts of the run. An attempt keeps the results
    of the earlier ones and judges every other row again (earlier dead letters are retried), so
    the input rows must equal the distinct result ids plus the last attempt's distinct dead
    letters (an unreadable file is one dead letter without rows). ``lost`` > 0 means rows
    vanished; ``duplicated`` counts rows a retried bundle wrote twice (readers keep one per id).
    Read from the files themselves: it holds on any runner, with or without metrics."""
    input_rows = sum(v["rows"] for v in inputs.values() if isinstance(v.get("rows"), int))
    ids = [i for f in match_files(join(out, "results-*.parquet"))
           for i in read_parquet(f, columns=["id"]).column("id").to_pylist()]
    dead = [tuple(r.values()) for f in match_files(join(out, "dead_letters-*.parquet"))
            for r in read_parquet(f, columns=["id", "stage", "raw"]).to_pylist()]
    distinct_dead = set(dead)
    unreadable = sum(1 for d in distinct_dead if d[1] == "read")  # ReadParquetRows.dead_letters: one per file
    answered = len(set(ids))
    return {"input_rows": input_rows, "results": answered, "dead_letters": len(distinct_dead),
            "unreadable_files": unreadable, "lost": input_rows - answered - (len(distinct_dead) - unreadable),
            "duplicated": len(ids) - answered + len(dead) - len(distinct_dead)}


def _share(rec: dict) -> float:
    """The run's dead-letter share: of every input row (and unreadable file), over all attempts."""
    handled = rec["results"] + rec["dead_letters"]
    return round(rec["dead_letters"] / handled, 6) if handled else 0.0


def reconciliation_line(rec: dict) -> str:
    files = f" + {rec['unreadable_files']} unreadable files" if rec["unreadable_files"] else ""
    return (f"{rec['input_rows']} input rows{files} = {rec['results']} results + {rec['dead_letters']} dead letters "
            f"(lost {rec['lost']}, duplicated {rec['duplicated']})")

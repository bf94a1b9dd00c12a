"""`specrag answer --streaming`: queries answered as they arrive, from a source that never ends.

The graph: an unbounded source (new files under a glob, or Pub/Sub; transforms/streams.py) →
AdmitQueries (validation and the lateness policy, per row: no global GroupByKey, which would never
fire) → DedupeIds (keyed by id in the global window, bounded expiring state; ids an earlier run
into this output answered are skipped) → event-time FixedWindows → the method's segments on the
same per-worker engine as batch → WriteResults, and the dead letters written by the stage that
makes them (rejected, duplicate, failed), one set of committed shards per window
(``results-stream-w<window start>-*.parquet``) → WindowCounts, folded into
``manifest.json`` once per window (and per late firing) by one keyed step, so a job that never
ends still says what it has done. The manifest is written when the job starts.

Stopping and starting again over the same output (``--resume``) answers each query once: the
ids in its results are skipped, as a batch resume skips them.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import signal
import sys
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any, Tuple

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import FixedWindows, GlobalWindows
from apache_beam.utils.timestamp import Duration

from specrag.methods.base import QueryState
from specrag.schemas.validation import validate_query
from specrag.jobio.files import delete, exists, join, match_files, read_parquet, read_text, write_text
from specrag.jobio.job_run import job_run
from specrag.jobio.run_folder import ANSWER
from specrag.pipelines.identity import run_fingerprint, run_identity
from specrag.pipelines.manifest import job_counters, write_manifest
from specrag.pipelines.answer_tail import run_method, write_dead_letters, write_results
from specrag.pipelines.options import StreamSettings, new_pipeline
from specrag.transforms.counters import count_element
from specrag.transforms.progress import CountProgress, progress_dir, watch_progress
from specrag.transforms.records import DEAD
from specrag.transforms.stages import NAMESPACE
from specrag.transforms.streams import (AdmitRows, DedupeIds, KafkaQueries, MarkEndOfInput, PubSubQueries,
                                        SkipFinished, WatchQueryFiles, can_watch, is_kafka, is_pubsub, kafka_source,
                                        watch_pattern)

STREAM_PREFIX = "stream"  # results-stream-w...: a streaming run's shards, beside a batch run's results-000-...
log = logging.getLogger(__name__)


def check_streaming_input(queries: str, streaming: bool, runner: str, stream: StreamSettings | None) -> None:
    """The clear errors a streaming run (or a batch run of an unbounded source) gets at start."""
    for kind, unbounded in (("Pub/Sub", is_pubsub(queries)), ("Kafka", is_kafka(queries))):
        if unbounded and not streaming:
            raise ValueError(f"--queries {queries} is a {kind} source, which never ends: pass --streaming")
    if not streaming:
        return
    if is_kafka(queries):
        kafka_source(queries)  # its address is checked now, not when the job is built
    elif not (is_pubsub(queries) or can_watch(queries)):
        raise ValueError(f"--streaming watches a folder or glob for new query files, or reads Pub/Sub "
                         f"(--queries pubsub:projects/P/subscriptions/S) or Kafka (kafka://HOST:PORT/TOPIC); "
                         f"{queries!r} is one file: name its folder (a trailing /) or a glob, or drop --streaming "
                         "to answer it as a batch job")
    name = runner.rsplit(".", 1)[-1]
    if name == "FnApiRunner" and stream is not None and stream.stop_after_s is None:
        log.warning("--streaming on the FnApiRunner: it answers each poll round's new files as they land, but "
                    "moves the watermark to the end of time after every round, so answered ids are remembered "
                    "for the job's life instead of --dedupe-horizon (memory grows with the ids answered); "
                    "for a job that runs for days use DataflowRunner or FlinkRunner")
    if is_pubsub(queries) and name == "FnApiRunner":
        raise ValueError("a Pub/Sub source needs a runner that streams (DataflowRunner, or the DirectRunner, "
                         "which reads Pub/Sub on its streaming runner)")
    if is_kafka(queries) and name in ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", ""):
        raise ValueError("a Kafka source is a Java transform: run it on a portable runner (PrismRunner, FlinkRunner: "
                         "deploy/flink/kafka_services.py starts a local broker and Beam's Java side) or DataflowRunner")


STOP_MARKER = ".stop"  # in the output folder: the watch source ends when it appears (a signal's drain)
ENDED_MARKER = ".ended"  # in the output folder: written once everything read is counted (MarkEndOfInput)


def query_source(queries: str, stream: StreamSettings, stop_marker: str | None = None) -> beam.PTransform:
    if is_pubsub(queries):
        return PubSubQueries(queries, stream.timestamp_attribute)
    if is_kafka(queries):
        return KafkaQueries(queries)
    return WatchQueryFiles(watch_pattern(queries), stream.poll_interval_s, stream.stop_after_s, stop_marker)


@contextlib.contextmanager
def drain_on_signals(marker: str, label: str):
    """SIGINT or SIGTERM while a streaming job runs: write the stop marker, so the watch source ends
    at its next poll and the job drains the queries in flight and stops (manifest ``stopped``, the
    lease released); a second signal stops at once. Handlers are only set in the main thread.
    Yields ``rearm``, to call after the job is submitted: Beam's local job servers (Prism's)
    put their own SIGINT handler first when they start, which stops the server at once."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if exists(marker):  # the second signal: stop now
            for s, h in previous.items():
                signal.signal(s, h)
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopped without draining")
        write_text(marker, f"{signal.Signals(signum).name} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        print(f"{label}: {signal.Signals(signum).name}: no new queries; draining the ones in flight "
              "(again to stop at once)", file=sys.stderr, flush=True)

    def rearm() -> None:
        for s in previous:
            signal.signal(s, handler)

    rearm()
    try:
        yield rearm
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _windows(stream: StreamSettings) -> beam.WindowInto:
    return beam.WindowInto(FixedWindows(stream.window_s), allowed_lateness=Duration.of(stream.allowed_lateness_s))


class _WindowCount(beam.DoFn):
    def process(self, kv, window=beam.DoFn.WindowParam):
        kind, n = kv
        yield ("manifest", (window.start.to_rfc3339(), window.end.to_rfc3339(), kind, n))


class UpdateManifest(beam.DoFn):
    """Folds each window's counts into ``manifest.json``: one key, so one update at a time."""

    COUNTS = ReadModifyWriteStateSpec("counts", StrUtf8Coder())

    def __init__(self, output: str, base: dict):
        self.output, self.base = output, base

    def process(self, element, counts=beam.DoFn.StateParam(COUNTS)):
        _, (start, end, kind, n) = element
        state = json.loads(counts.read() or '{"windows": {}, "totals": {}}')
        window = state["windows"].setdefault(start, {"end": end, "results": 0, "dead_letters": 0})
        window[kind] += n
        state["totals"][kind] = state["totals"].get(kind, 0) + n
        counts.write(json.dumps(state))
        write_text(join(self.output, "manifest.json"), json.dumps(
            {**self.base, "status": "running", "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "windows": dict(sorted(state["windows"].items())), "totals_so_far": state["totals"]},
            indent=2, sort_keys=True, default=str))


def _stopped_by(stream: StreamSettings) -> str:
    """What ended a stream that no signal stopped."""
    return f"--stop-after {stream.stop_after_s:g} s" if stream.stop_after_s is not None else "its source ended"


def build_streaming_answer_pipeline(p: beam.Pipeline, job, stream: StreamSettings, *, rows=None,
                                    finished_files: list[str] = (), fingerprint: str = "",
                                    lease_token: str | None = None, manifest_base: dict | None = None) -> None:
    """The streaming job's graph. ``rows``: an unbounded PCollection of query rows (a test's
    TestStream); by default the job's own source."""
    out = job.output
    if rows is None:
        rows = p | "Queries" >> query_source(job.queries, stream, join(out, STOP_MARKER))
    validator = functools.partial(validate_query, task_types=job.method.task_types)
    admitted = rows | "AdmitQueries" >> beam.ParDo(AdmitRows(
        validator, stream.allowed_lateness_s, stream.event_time_field,
        stop_marker=join(out, STOP_MARKER) if is_kafka(job.queries) else None)).with_outputs(DEAD, main="valid")
    # The FnApiRunner runs a streaming job in rounds, one per poll, and moves the watermark to the
    # end of time after each (an expiry timer would fire at once): its runs are bounded
    # (--stop-after), so the dedupe state lives as long as the job there
    horizon = None if runner_name(job.beam_args) == "FnApiRunner" else stream.dedupe_horizon_s
    deduped = (admitted.valid
               | "SkipFinished" >> beam.ParDo(SkipFinished(list(finished_files)))
               | "TypedIds" >> beam.Map(lambda kv: kv).with_output_types(Tuple[str, Any])
               | "DedupeIds" >> beam.ParDo(DedupeIds(horizon)).with_outputs(DEAD, main="valid"))
    progress = progress_dir(out)
    keyed = (deduped.valid
             | "ProgressAdmitted" >> CountProgress(progress, "admitted")
             | "Windows" >> _windows(stream)
             | "CountQueries" >> beam.Map(count_element("queries_in"))
             | "KeyByQuery" >> beam.Map(lambda q: (q["id"], QueryState(query=q))))
    dead = [admitted[DEAD] | "WindowRejected" >> _windows(stream), deduped[DEAD] | "WindowDuplicates" >> _windows(stream)]
    answered, failed = run_method(keyed, job, "streaming")
    failed = failed | "FlattenFailed" >> beam.Flatten() | "ProgressFailed" >> CountProgress(progress, "failed")
    results = write_results(answered, job, fingerprint, f"results-{STREAM_PREFIX}", lease_token, windowed=True)
    # each kind of dead letter is written by the stage that makes it, as results are: flattened
    # first, the FnApiRunner's streaming mode wrote them only when the job stopped
    dead_ones = [write_dead_letters(rows, job, f"dead_letters-{STREAM_PREFIX}", lease_token, kind, windowed=True)
                 | f"One{kind}" >> beam.Map(lambda _: ("dead_letters", 1))
                 for kind, rows in (("Rejected", dead[0]), ("Duplicates", dead[1]), ("Failed", failed))]
    counts = ((results | "OneResult" >> beam.Map(lambda _: ("results", 1)), *dead_ones)
              | "AllRows" >> beam.Flatten()
              | "PerWindow" >> beam.CombinePerKey(sum))
    in_global = (counts
                 | "WindowCounts" >> beam.ParDo(_WindowCount())
                 | "ToGlobalWindow" >> beam.WindowInto(GlobalWindows()))
    _ = in_global | "UpdateManifest" >> beam.ParDo(UpdateManifest(out, manifest_base or {}))
    ended = end_of_input_marker(job)
    if ended:
        # the counts' watermark passes the end of time once every branch has drained; the
        # one element from the start sets the timer even if no query ever came
        _ = ((p | "Start" >> beam.Create([("end", None)]),
              in_global | "NoCounts" >> beam.Filter(lambda _: False))
             | "UntilAllCounted" >> beam.Flatten()
             | "MarkEndOfInput" >> beam.ParDo(MarkEndOfInput(ended)).with_input_types(Tuple[str, Any]))


KEEP_SOURCES_UP_MS = 2**63 - 1  # Java's Long.MAX_VALUE: Flink keeps a finished source's task up


def stream_beam_args(job) -> tuple[str, ...]:
    """The job's Beam flags; on Flink, with its sources kept up (``--shutdown_sources_after_idle_ms``)
    and a job name (``--job_name``, how ``cancel_job`` finds it) unless given.

    Without checkpointing, Flink's runner (2.62) ends a source task once it has emitted
    everything, which the impulse under the watch's poll and under Beam's Kafka read does at
    once; the unbounded read then ran inside the next operator's end-of-input flush, where
    bundles finished only by count (a Kafka query waited for 999 more) and CPU and heap grew
    until the TaskManager missed its heartbeats (every streaming job failed 2-4 minutes in, idle
    or busy). Kept up, the job does not end with its source: it is cancelled once it has drained
    (``CancelWhenDrained``)."""
    args = tuple(job.beam_args)
    if runner_name(args) != "FlinkRunner":
        return args
    given = {a.split("=", 1)[0].replace("-", "_") for a in args}
    if "--shutdown_sources_after_idle_ms" not in given:
        args += (f"--shutdown_sources_after_idle_ms={KEEP_SOURCES_UP_MS}",)
    if "--job_name" not in given:
        args += (f"--job_name=specrag-{job.method.name}-{uuid.uuid4().hex[:12]}",)
    return args


def ends_by_cancel(job) -> bool:
    """A streaming job whose source does not end the job: a Kafka read never ends, and on Flink
    the sources are kept up (``stream_beam_args``)."""
    return is_kafka(job.queries) or runner_name(job.beam_args) == "FlinkRunner"


def end_of_input_marker(job) -> str | None:
    """The file ``MarkEndOfInput`` writes when the input of a job that ``ends_by_cancel`` has
    ended (a watched folder or a finite stream on Flink), which tells ``CancelWhenDrained`` to
    cancel; None where the source ends the job itself, and for Kafka, which never ends (only a
    stop does)."""
    return join(job.output, ENDED_MARKER) if ends_by_cancel(job) and not is_kafka(job.queries) else None


FLINK_TERMINAL = ("FINISHED", "FAILED", "CANCELED")


def cancel_job(result, beam_args, wait_s: float = 60) -> None:
    """Cancels the job on its runner. On Flink, Beam's portable cancel only interrupts the job
    server's wait for the job: the Flink job went on RUNNING with its slots held after the
    launcher had exited, so there it is cancelled through Flink's REST API (``--flink_master``)
    by its job name (``--job_name``, which the launcher sets unless given), first, and waited for
    until Flink says it has ended (at most ``wait_s``): the portable cancel ends the launcher's
    wait, and a launcher that exited before its REST call had gone left the job running."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, GoogleCloudOptions, PipelineOptions
    options = PipelineOptions(list(beam_args))
    master, name = options.view_as(FlinkRunnerOptions).flink_master, options.view_as(GoogleCloudOptions).job_name
    if runner_name(beam_args) == "FlinkRunner" and name and master not in (None, "[auto]", "[local]"):
        _cancel_flink_job(master if "://" in master else f"http://{master}", name, wait_s)
    with contextlib.suppress(Exception):
        result.cancel()


def _cancel_flink_job(rest: str, name: str, wait_s: float) -> None:
    """Asks Flink to cancel every live job named ``name`` until none is left (a request that was
    lost, or a busy JobManager's slow answer, is asked again) or ``wait_s`` has passed."""
    import urllib.request
    deadline, asked, error = time.time() + wait_s, 0.0, None
    while True:
        try:
            jobs = json.load(urllib.request.urlopen(f"{rest}/jobs/overview", timeout=10))["jobs"]
            live = [j for j in jobs if j["name"] == name and j["state"] not in FLINK_TERMINAL]
            if not live:
                return
            if time.time() - asked > 10:  # again while it is not cancelling yet (CANCELLING takes a while)
                for flink_job in live:
                    if flink_job["state"] != "CANCELLING":
                        urllib.request.urlopen(urllib.request.Request(
                            f"{rest}/jobs/{flink_job['jid']}?mode=cancel", method="PATCH"), timeout=10)
                asked = time.time()
        except OSError as e:
            error = e
        if time.time() > deadline:
            log.warning("the Flink job %s did not end within %.0f s of its cancel through %s%s", name, wait_s, rest,
                        f": {error}" if error else "")
            return
        time.sleep(0.5)


def runner_name(beam_args) -> str:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    return (PipelineOptions(list(beam_args)).view_as(StandardOptions).runner or "").rsplit(".", 1)[-1]


def finished_ids_files(out: str) -> list[str]:
    """Every result file in the output, batch or streaming: their ids are not answered again."""
    return match_files(join(out, "results-*.parquet"))


def stream_account(out: str) -> dict:
    """What the output holds once a streaming run stops: distinct ids answered (all runs into
    it), and this run's dead letters."""
    ids = [i for f in finished_ids_files(out) for i in read_parquet(f, columns=["id"]).column("id").to_pylist()]
    dead = sum(read_parquet(f, columns=["id"]).num_rows
               for f in match_files(join(out, f"dead_letters-{STREAM_PREFIX}-*.parquet")))
    return {"results": len(set(ids)), "duplicated": len(ids) - len(set(ids)), "dead_letters": dead}


def window_counts(out: str, window_s: float) -> dict:
    """Rows per window from the shards' names (``-w<start>-``): exact on every runner once the
    job has stopped (the running manifest's counts come from per-window firings)."""
    from datetime import datetime, timedelta, timezone
    windows: dict = {}
    for kind in ("results", "dead_letters"):
        for f in match_files(join(out, f"{kind}-{STREAM_PREFIX}-w*.parquet")):
            tag = f.rsplit("/", 1)[-1].split("-")[2][1:]
            start = datetime.strptime(tag, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc)
            key = start.strftime("%Y-%m-%dT%H:%M:%SZ")
            entry = windows.setdefault(key, {"end": (start + timedelta(seconds=window_s)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"), "results": 0, "dead_letters": 0})
            entry[kind] += read_parquet(f, columns=["id"]).num_rows
    return dict(sorted(windows.items()))


class CancelWhenDrained:
    """Ends a streaming job whose source does not end it (``ends_by_cancel``): it is cancelled
    on its runner, which is then the run's end (manifest ``stopped``), once it has drained.

    Drained means: its input has ended — ``ended`` exists (``MarkEndOfInput``: the watch saw the
    stop marker or ``--stop-after`` and everything it read is counted) or, for a Kafka read,
    which never ends, the stop marker exists and rows read after it are not admitted
    (``AdmitRows``) — and every query admitted is answered or failed and its shard committed:
    the rows in this run's result files, and its dead letters, reach the counts the workers
    published."""

    def __init__(self, out: str, marker: str, result, beam_args, ended: str | None = None, poll_s: float = 1.0):
        self.out, self.marker, self.result, self.ended, self.poll_s = out, marker, result, ended, poll_s
        self.beam_args = beam_args
        self.before = set(finished_ids_files(out))
        self.cancelled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specrag-drain", daemon=True)

    def start(self) -> "CancelWhenDrained":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops watching; a cancel under way is finished first (the launcher must not exit
        while the cluster's job is still being cancelled)."""
        self._stop.set()
        self._thread.join()

    def drained(self) -> bool:
        from specrag.transforms.progress import count_rows, read_progress
        counts = read_progress(progress_dir(self.out))
        if counts["admitted"] > counts["done"] + counts["failed"]:
            return False
        results = count_rows([f for f in finished_ids_files(self.out) if f not in self.before]) or 0
        dead = count_rows(match_files(join(self.out, f"dead_letters-{STREAM_PREFIX}-*.parquet"))) or 0
        return results >= counts["done"] and dead >= counts["dead"]

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if exists(self.ended or self.marker) and self.drained():
                # once more after a poll: counts published a moment before the marker settle
                if self._stop.wait(self.poll_s * 2) or not self.drained():
                    continue
                self.cancelled = True
                cancel_job(self.result, self.beam_args)
                return


def _record_failure(out: str, base: dict, started: float, result, error: BaseException, beam_args=()) -> None:
    """A streaming run that fails (a lost TaskManager, a second signal) says so in its manifest,
    which said ``running`` since the start; a second signal also cancels the job on its runner
    (a cluster's job would otherwise outlive the launcher)."""
    if isinstance(error, KeyboardInterrupt) and result is not None:
        cancel_job(result, beam_args)
    running: dict = {}
    with contextlib.suppress(Exception):
        running = json.loads(read_text(join(out, "manifest.json")))
    with contextlib.suppress(Exception):
        write_manifest(out, {**base, "status": "cancelled" if isinstance(error, KeyboardInterrupt) else "failed",
                             "error": f"{type(error).__name__}: {error}".splitlines()[0][:2000],
                             "wall_s": round(time.time() - started, 3), "windows_reported": running.get("windows", {}),
                             "note": "shards of the windows written are kept; --resume answers the rest once"})


def settings_manifest(stream: StreamSettings) -> dict:
    return {"streaming": asdict(stream)}


def run_streaming_answer(job, rows=None) -> dict:
    """Run ``job`` (an AnswerJob with ``stream`` settings) until its source stops (``--stop-after``,
    a test's TestStream) or it is cancelled; returns the final manifest. ``rows``: a callable
    pipeline → unbounded PCollection of query rows, in place of the job's source (tests).

    The output folder follows the batch rules (``RunFolder``): an earlier run is kept unless
    ``--resume`` (its answered ids are skipped) or ``--overwrite`` (set aside, restored if this
    run fails or is killed)."""
    stream: StreamSettings = job.stream
    out = job.output
    identity = run_identity(job)
    fingerprint = run_fingerprint(identity)
    with job_run(out, ANSWER, identity, resume=job.resume, overwrite=job.overwrite,
                 recorded_inputs=[{"stream": job.queries}]) as run:
        done = finished_ids_files(out) if job.resume else []
        if not is_pubsub(job.queries):  # a restarted watch or Kafka read sees its rows again: they are judged again
            delete(match_files(join(out, f"dead_letters-{STREAM_PREFIX}-*.parquet")))
        beam_args = stream_beam_args(job)
        base = {"job": "answer", "mode": "streaming", "method": job.method.name,
                "method_config": job.method.config.to_dict(), "run_fingerprint": fingerprint,
                "identity": identity, "runtime": job.runtime.to_dict(), "source": job.queries,
                "beam_args": list(beam_args), **settings_manifest(stream),
                "resumed": {"earlier_result_files": len(done)} if job.resume else None,
                **({"lease_takeover": run.took_over} if run.took_over else {}),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **job.extra_manifest}
        write_manifest(out, {**base, "status": "running"})
        started = time.time()
        p = new_pipeline(beam_args)
        build_streaming_answer_pipeline(p, job, stream, rows=rows(p) if rows else None, finished_files=done,
                                        fingerprint=fingerprint, lease_token=run.token, manifest_base=base)
        label = f"answer {job.method.name} (streaming)"
        marker = join(out, STOP_MARKER)
        ended = end_of_input_marker(job)
        delete([m for m in (marker, ended) if m and exists(m)])  # an earlier run's stop is not this one's
        result, drain = None, None
        try:
            with watch_progress(label, out, None, rate_window_s=300), drain_on_signals(marker, label) as rearm:
                result = p.run()
                rearm()
                if ends_by_cancel(job):
                    drain = CancelWhenDrained(out, marker, result, beam_args, ended).start()
                try:
                    result.wait_until_finish()
                except Exception:
                    if not (drain and drain.cancelled):
                        raise
        except BaseException as error:
            _record_failure(out, base, started, result, error, beam_args)
            raise
        finally:
            if drain:
                drain.stop()
        stopped = exists(marker)  # a signal's drain (or a stop marker written by hand: it says nothing)
        stopped_by = (read_text(marker).strip() or f"the stop marker {marker}") if stopped else _stopped_by(stream)
        delete([marker] if stopped else [])
        delete([ended] if ended and exists(ended) else [])
        running = json.loads(read_text(join(out, "manifest.json")))
        manifest = write_manifest(out, {
            **base, "status": "stopped", "wall_s": round(time.time() - started, 3), "stopped_by": stopped_by,
            "windows": window_counts(out, stream.window_s),
            # what the per-window updates said while the job ran (exact on a streaming runner)
            "windows_reported": running.get("windows", {}),
            "counters": job_counters(result, NAMESPACE), "account": stream_account(out)})
    return manifest


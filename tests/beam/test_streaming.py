"""`specrag answer --streaming`: TestStream on Beam's streaming DirectRunner (BundleBasedDirectRunner,
which runs TestStream, state, timers and windows here), and a watched folder on the FnApiRunner."""
import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from echo_method import Echo
from specrag.methods import MethodConfig
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.pipelines.options import StreamSettings
from specrag.pipelines.streaming import STOP_MARKER, run_streaming_answer
from specrag.schemas.tables import QUERIES
from specrag.transforms.runtime import RuntimeConfig

STREAMING = ("--runner=BundleBasedDirectRunner", "--streaming")


def _rows(folder, kind):
    return [r for f in sorted(folder.glob(f"{kind}-*.parquet")) for r in pq.read_table(f).to_pylist()]


def _job(out, **kw):
    stream = kw.pop("stream", StreamSettings(window_s=10, allowed_lateness_s=60, dedupe_horizon_s=3600))
    return AnswerJob("unused/*.parquet", str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                     beam_args=STREAMING, stream=stream, **kw)


def test_a_stream_across_windows_answers_each_query_once_as_the_batch_job_does(tmp_path):
    """Queries over three 10 s windows; the same row twice (a file read again), another row with an
    answered id (a duplicate), a blank question, a late row and a failing query: each id answered
    once, every other row a dead letter with its reason, answers equal to the batch job's."""
    flag = tmp_path / "failing"
    flag.touch()
    t0 = Timestamp(int(Timestamp.now().micros // 10**7) * 10 - 30)  # on a window edge, in the last 40 s
    q = lambda i, text: {"id": f"q{i}", "question": text}  # noqa: E731
    events = [(0, q(1, "one")), (1, q(2, "two")), (2, q(1, "one")),  # the same row again: dropped
              (12, q(3, "three")), (13, q(2, "second two")),  # another row with an answered id
              (14, q(4, "  ")), (15, q(5, f"fail-while:{flag}")),
              (25, q(6, "six")), (26, q(1, "one"))]  # repeated in a later window: still once
    late = q(7, "seven")  # event time an hour ago: past the allowed lateness (60 s)
    source = (test_stream.TestStream().advance_watermark_to(t0)
              .add_elements([TimestampedValue(r, t0 + s) for s, r in events[:3]])
              .advance_watermark_to(t0 + 10)
              .add_elements([TimestampedValue(r, t0 + s) for s, r in events[3:7]])
              .add_elements([TimestampedValue(late, t0 - 3600)])
              .advance_watermark_to(t0 + 20)
              .add_elements([TimestampedValue(r, t0 + s) for s, r in events[7:]])
              .advance_watermark_to_infinity())
    out = tmp_path / "out"
    manifest = run_streaming_answer(_job(out), rows=lambda p: p | source)
    results = _rows(out, "results")
    assert sorted((r["id"], r["answer"]) for r in results) == [
        ("q1", "ONE"), ("q2", "TWO"), ("q3", "THREE"), ("q6", "SIX")]
    dead = {r["id"]: r for r in _rows(out, "dead_letters")}
    assert sorted(dead) == ["q2", "q4", "q5", "q7"]
    assert "duplicate id 'q2'" in dead["q2"]["message"] and dead["q4"]["stage"] == "validate"
    assert dead["q5"]["stage"] == "Echo" and dead["q7"]["message"].startswith("late: event time")
    # one set of shards per window, and the manifest's per-window counts add up
    windows = manifest["windows"]
    assert [w["results"] for w in windows.values() if w["results"]] == [2, 1, 1]
    assert manifest["windows_reported"] == windows  # the running manifest's per-window updates were exact
    assert sum(w["dead_letters"] for w in windows.values()) == 4
    assert len({f.name.split("-")[2] for f in out.glob("results-stream-w*.parquet")}) == 3
    assert manifest["status"] == "stopped" and manifest["account"] == {"results": 4, "duplicated": 0,
                                                                       "dead_letters": 4}
    # the batch job over the same queries gives the same answers
    pq.write_table(pa.Table.from_pylist([r for _, r in events if r["id"] in ("q1", "q3", "q6")] +
                                        [q(2, "two")], schema=QUERIES), tmp_path / "q.parquet")
    batch = tmp_path / "batch"
    run_answer(AnswerJob(str(tmp_path / "q.parquet"), str(batch), Echo(MethodConfig()), RuntimeConfig(models=()),
                         max_failure_fraction=1.0))
    assert sorted((r["id"], r["answer"]) for r in _rows(batch, "results")) == sorted(
        (r["id"], r["answer"]) for r in results)

    # stopped and started again over the same output: answered ids are skipped, the failed one retried
    flag.unlink()
    again = (test_stream.TestStream().advance_watermark_to(t0 + 30)
             .add_elements([TimestampedValue(q(1, "one"), t0 + 31), TimestampedValue(q(5, f"fail-while:{flag}"), t0 + 32),
                            TimestampedValue(q(8, "eight"), t0 + 33)])
             .advance_watermark_to_infinity())
    resumed = run_streaming_answer(_job(out, resume=True), rows=lambda p: p | again)
    answered = sorted(r["id"] for r in _rows(out, "results"))
    assert answered == ["q1", "q2", "q3", "q5", "q6", "q8"] and resumed["account"]["duplicated"] == 0
    assert resumed["counters"]["skipped_finished"] == 1


def test_pubsub_messages_are_parsed_into_queries_and_bad_messages_are_dead_letters(tmp_path):
    from specrag.transforms.streams import parse_message
    t0 = Timestamp(int(Timestamp.now().micros // 10**7) * 10 - 10)
    messages = [b'{"id": "m1", "question": "hello"}', b"not json", b'["a list"]', b'{"id": "m2", "question": "world"}']
    source = (test_stream.TestStream().advance_watermark_to(t0)
              .add_elements([TimestampedValue(m, t0 + i) for i, m in enumerate(messages)])
              .advance_watermark_to_infinity())
    out = tmp_path / "out"
    run_streaming_answer(_job(out), rows=lambda p: p | source | beam.Map(parse_message))
    assert sorted((r["id"], r["answer"]) for r in _rows(out, "results")) == [("m1", "HELLO"), ("m2", "WORLD")]
    dead = sorted(r["message"] for r in _rows(out, "dead_letters"))
    assert dead == ["message is not JSON (Expecting value: line 1 column 1 (char 0))", "message is not a JSON object"]


def test_a_watched_folder_is_answered_as_files_land_and_the_job_stops_when_told(tmp_path):
    """Files dropped into a folder while the job runs (Parquet and JSON lines, one copied under
    another name, one with a line that is not JSON) are each read once; every id is answered
    once, each poll round's new files as they land, and the bad line's dead letter as its round
    ends too; the stop marker (a signal's drain) ends the job."""
    import shutil
    import threading
    import time
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    table = lambda rows: pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES)  # noqa: E731
    pq.write_table(table([("a", "first"), ("b", "second")]), incoming / "early.parquet")

    def shards(n):  # wait until the job has written n results shards
        deadline = time.time() + 30
        while len(list(out.glob("results-stream-*.parquet"))) < n and time.time() < deadline:
            time.sleep(0.1)

    def drop():
        shards(1)  # the first file's answers are written while the job runs ...
        pq.write_table(table([("c", "third")]), tmp_path / "late.parquet")
        shutil.move(tmp_path / "late.parquet", incoming / "late.parquet")  # ... before the next file exists
        shards(2)
        shutil.copy(incoming / "early.parquet", incoming / "early-copy.parquet")  # the same rows again
        (incoming / "more.jsonl").write_text('{"id": "d", "question": "fourth"}\nnot json\n')
        stop_at = time.time() + 20
        while not (out / STOP_MARKER).exists():
            if list(out.glob("dead_letters-stream-*.parquet")):
                dead_while_running.set()  # written with its poll round, as results are, not at the stop
            if dead_while_running.is_set() or time.time() > stop_at:
                (out / STOP_MARKER).write_text("")  # what a signal does: the watch ends, the job drains
            time.sleep(0.1)
    dead_while_running = threading.Event()
    out = tmp_path / "out"
    threading.Thread(target=drop, daemon=True).start()
    stream = StreamSettings(window_s=60, allowed_lateness_s=600, poll_interval_s=0.5, stop_after_s=120)
    manifest = run_answer(AnswerJob(f"{incoming}/", str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                                    beam_args=("--runner=FnApiRunner", "--streaming"), stream=stream))
    assert sorted((r["id"], r["answer"]) for r in _rows(out, "results")) == [
        ("a", "FIRST"), ("b", "SECOND"), ("c", "THIRD"), ("d", "FOURTH")]
    dead = _rows(out, "dead_letters")
    assert [(d["stage"], d["message"].split(" (")[0]) for d in dead] == [("read", "line 2 is not JSON")]
    assert dead_while_running.is_set()  # not only when the job stopped
    assert manifest["counters"]["files_read"] == 4 and manifest["counters"]["repeated_rows"] == 2
    assert manifest["account"] == {"results": 4, "duplicated": 0, "dead_letters": 1}
    # answered as the files landed, a shard per poll round that found new rows, not once at the end
    written = sorted(out.glob("results-stream-*.parquet"))
    assert [pq.read_table(f).column("id").to_pylist() for f in written] == [["a", "b"], ["c"], ["d"]]
    # the per-window counts the job folded into its manifest (when each window closed: on the
    # FnApiRunner, when the job drained) agree with the files
    reported = manifest["windows_reported"].values()
    assert sum(w["results"] for w in reported) == 4 and sum(w["dead_letters"] for w in reported) == 1


def test_a_stream_stopped_by_stop_after_says_so_and_its_lines_agree_with_its_count(tmp_path, capsys, monkeypatch):
    """E4: the running progress line of a stream said "6 queries" where 3 were answered and 3 were
    dead letters, and the manifest's stopped_by was None after --stop-after. Every line now counts
    answered queries as the final line and the manifest do, and stopped_by names --stop-after."""
    import re
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    pq.write_table(pa.Table.from_pylist([{"id": i, "question": q} for i, q in (("a", "one"), ("b", "two"),
                                                                              ("c", " "))], schema=QUERIES),
                   incoming / "q.parquet")
    (incoming / "more.jsonl").write_text('{"id": "d", "question": "four"}\nnot json\n')
    monkeypatch.setenv("SPECRAG_PROGRESS_S", "0.5")
    stream = StreamSettings(window_s=60, allowed_lateness_s=600, poll_interval_s=0.5, stop_after_s=4)
    manifest = run_answer(AnswerJob(f"{incoming}/", str(tmp_path / "out"), Echo(MethodConfig()),
                                    RuntimeConfig(models=()), beam_args=("--runner=FnApiRunner", "--streaming"),
                                    stream=stream))
    assert manifest["account"] == {"results": 3, "duplicated": 0, "dead_letters": 2}
    assert manifest["stopped_by"] == "--stop-after 4 s"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("answer echo-test (streaming):")]
    running = [int(m.group(1)) for ln in lines if (m := re.search(r": (\d+) queries · ", ln))]
    assert running and max(running) == 3, lines  # answered, not answered + dead letters
    assert lines[-1].startswith("answer echo-test (streaming): finished 3 queries, 2 dead letters in "), lines
    assert not any(re.search(r"over \dm", ln) for ln in lines), lines  # a 4 s stream's rate is not "over 5m00s"


def test_streaming_input_and_runner_are_checked_at_start(tmp_path, capsys):
    from specrag.pipelines.cli import main
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "q"}], schema=QUERIES), tmp_path / "q.parquet")
    base = ["answer", "--output", str(tmp_path / "out"), "--method", "no-retrieval"]
    assert main(base + ["--streaming", "--queries", str(tmp_path / "q.parquet")]) == 2
    assert "is one file: name its folder (a trailing /) or a glob, or drop --streaming" in capsys.readouterr().err
    assert main(base + ["--queries", "pubsub:projects/p/subscriptions/s"]) == 2
    assert "is a Pub/Sub source, which never ends: pass --streaming" in capsys.readouterr().err
    assert main(base + ["--streaming", "--queries", "pubsub:projects/p/subscriptions/s"]) == 2
    assert "a Pub/Sub source needs a runner that streams" in capsys.readouterr().err
    assert main(base + ["--streaming", "--queries", f"{tmp_path}/", "--stop-after", "5", "--window", "0"]) == 2
    assert "--window must be > 0 seconds" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sigint_drains_the_queries_in_flight_and_stops_within_seconds(tmp_path):
    """`specrag answer --streaming` over a watched folder: SIGINT ends the watch at its next poll,
    the job answers what it admitted, writes the manifest `stopped` and releases the lease, long
    before --stop-after (the FnApiRunner ignored SIGINT and ran to --stop-after before)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    from specrag.jobio.run_folder import LEASE_FILE
    from specrag.pipelines.cli import main
    pq.write_table(pa.Table.from_pylist([{"id": "p1", "title": "Paris", "text": "Paris is the capital of France."}]),
                   tmp_path / "corpus.parquet")
    assert main(["build-index", "--corpus", str(tmp_path / "corpus.parquet"), "--index", str(tmp_path / "index")]) == 0
    watch, out = tmp_path / "in", tmp_path / "out"
    watch.mkdir()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "specrag"), "answer", "--streaming",
                             "--queries", f"{watch}/", "--output", str(out), "--index", str(tmp_path / "index"),
                             "--method", "retrieve-only", "--poll-interval", "1", "--window", "5",
                             "--stop-after", "900"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pq.write_table(pa.Table.from_pylist([{"id": "q1", "question": "capital of France"}]), watch / "a.parquet")
        deadline = time.time() + 180
        while not _rows(out, "results") and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        assert [r["id"] for r in _rows(out, "results")] == ["q1"]
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, proc.stdout.read()
        assert time.time() - signalled < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped_by"].startswith("SIGINT")
    assert manifest["account"]["results"] == 1 and not (out / LEASE_FILE).exists() and not (out / ".stop").exists()


def test_the_fn_api_runner_folds_each_bundles_metrics_as_the_bundle_ends():
    """A long stream on the FnApiRunner is thousands of bundles: their metrics are folded as each
    ends (one entry per metric), not chained into one lazy generator per bundle that held every
    bundle's metrics until the end and then took as long again as the stream to read."""
    import itertools

    from apache_beam.metrics import monitoring_infos
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from specrag.pipelines.options import new_pipeline
    new_pipeline(("--runner=FnApiRunner",))
    folded = []
    for _ in range(3000):
        bundle = [monitoring_infos.int64_user_counter("specrag", "rows", 1, ptransform="Step")]
        folded = fn_runner.consolidate_monitoring_infos(itertools.chain(bundle, folded))
    assert isinstance(folded, list) and len(folded) == 1
    assert monitoring_infos.extract_counter_value(folded[0]) == 3000


def test_a_watched_folder_on_prism_is_answered_as_files_land_and_drains_at_the_stop_marker(prism, tmp_path):
    """The same watched folder on Prism (its own watermarks, timers and keyed state): files
    answered as they land, a bad line's dead letter written with its round, each id once, and the
    stop marker (what SIGINT writes) drains the job to a stopped manifest."""
    import threading
    import time
    incoming, out = tmp_path / "incoming", tmp_path / "out"
    incoming.mkdir()
    table = lambda rows: pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES)  # noqa: E731
    pq.write_table(table([("a", "first"), ("b", "second")]), incoming / "early.parquet")
    dead_while_running = threading.Event()

    def drop():
        deadline = time.time() + 120
        while not list(out.glob("results-stream-*.parquet")) and time.time() < deadline:
            time.sleep(0.1)
        (incoming / "more.jsonl").write_text('{"id": "c", "question": "third"}\nnot json\n')
        stop_at = time.time() + 60
        while not (out / STOP_MARKER).exists():
            if list(out.glob("dead_letters-stream-*.parquet")):
                dead_while_running.set()
            if dead_while_running.is_set() or time.time() > stop_at:
                (out / STOP_MARKER).write_text("test")
            time.sleep(0.1)
    threading.Thread(target=drop, daemon=True).start()
    stream = StreamSettings(window_s=5, allowed_lateness_s=600, poll_interval_s=0.5, stop_after_s=300)
    manifest = run_answer(AnswerJob(f"{incoming}/", str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                                    beam_args=("--runner=PrismRunner", f"--prism_location={prism}", "--streaming"),
                                    stream=stream))
    assert sorted((r["id"], r["answer"]) for r in _rows(out, "results")) == [("a", "FIRST"), ("b", "SECOND"),
                                                                             ("c", "THIRD")]
    assert [(d["stage"], d["message"].split(" (")[0]) for d in _rows(out, "dead_letters")] == [
        ("read", "line 2 is not JSON")]
    assert dead_while_running.is_set()
    assert manifest["status"] == "stopped" and manifest["stopped_by"] == "test"
    assert manifest["account"] == {"results": 3, "duplicated": 0, "dead_letters": 1}

"""Console progress of long jobs: workers count into the output folder, the launcher reports."""
import contextlib
import io
import json
import time

import apache_beam as beam

from specrag.pipelines.options import pipeline_options
from specrag.transforms.progress import (CountProgress, ProgressWatcher, count_rows, progress_dir, progress_line,
                                         read_progress, watch_progress)


def test_progress_line_says_done_rate_eta_and_dead_letters():
    assert progress_line("answer sps", 330, 10, 1000, 2.0, "queries") == \
        "answer sps: 340/1000 queries (34%) · 2.00 queries/s · ETA 5m30s · 10 dead letters"
    # without a total, the items done (as the final line counts them), dead letters beside them
    assert progress_line("build-index", 5, 1, None, None, "passages") == "build-index: 5 passages · 1 dead letter"
    assert progress_line("x", 10, 0, 10, 4.0, "queries") == "x: 10/10 queries (100%) · 4.00 queries/s · 0 dead letters"
    # a job without an end (streaming): the rate over the last minutes and what is in flight
    assert progress_line("answer (streaming)", 40, 2, None, 0.5, "queries", in_flight=7, rate_window_s=300) == \
        "answer (streaming): 40 queries · 0.50 queries/s over 5m00s · 7 in flight · 2 dead letters"


def test_watcher_sums_workers_and_keeps_a_half_written_files_last_value(tmp_path):
    folder = tmp_path / ".progress"
    folder.mkdir()
    (folder / "done-a.json").write_text(json.dumps({"n": 7}))
    (folder / "done-b.json").write_text(json.dumps({"n": 5}))
    (folder / "dead-c.json").write_text(json.dumps({"n": 2}))
    seen = {}
    assert read_progress(str(folder), seen) == {"done": 12, "dead": 2, "admitted": 0, "failed": 0}
    (folder / "done-a.json").write_text('{"n": ')  # being replaced
    assert read_progress(str(folder), seen) == {"done": 12, "dead": 2, "admitted": 0, "failed": 0}
    (folder / "done-a.json").write_text(json.dumps({"n": 7}))
    watcher = ProgressWatcher("answer", str(folder), 100, interval_s=0)
    assert watcher.poll() == "answer: 14/100 queries (14%) · 2 dead letters"
    (folder / "done-b.json").write_text(json.dumps({"n": 25}))
    time.sleep(0.05)
    line = watcher.poll()
    assert line.startswith("answer: 34/100 queries (34%) · ") and "queries/s · ETA " in line


def test_the_last_line_says_whether_the_job_finished_failed_or_was_interrupted(tmp_path):
    """A job stopped with Ctrl-C (or a session's SIGINT) is resumable, not failed: its last line says so."""
    import pytest
    beams = RuntimeError("KeyboardInterrupt [while running 'Answer']")  # Ctrl-C inside a DoFn, as Beam re-raises it
    for raised, said in ((None, "answer: finished 0 queries"), (RuntimeError("boom"), "(the job failed)"),
                         (KeyboardInterrupt(), "(interrupted)"), (beams, "(interrupted)")):
        stream = io.StringIO()
        with pytest.raises(type(raised)) if raised else contextlib.nullcontext():
            with watch_progress("answer", str(tmp_path / "job"), 10, interval_s=60, stream=stream):
                if raised:
                    raise raised
        last = stream.getvalue().strip().splitlines()[-1]
        interrupted = said == "(interrupted)"
        assert said in last and interrupted == ("failed" not in last and "stopped" in last), last


def test_a_beam_job_reports_its_counts_and_leaves_no_progress_files(tmp_path):
    out = tmp_path / "job"
    stream = io.StringIO()
    with watch_progress("toy", str(out), 53, unit="rows", interval_s=0.05, stream=stream) as watcher:
        with beam.Pipeline(options=pipeline_options(("--runner=FnApiRunner",))) as p:
            rows = p | beam.Create(range(53))
            _ = rows | beam.Filter(lambda x: x % 10) | "Done" >> CountProgress(progress_dir(str(out)), "done", 0.0)
            _ = rows | beam.Filter(lambda x: x % 10 == 0) | "Dead" >> CountProgress(progress_dir(str(out)), "dead")
    assert watcher.counts == {"done": 47, "dead": 6, "admitted": 0, "failed": 0}
    last = stream.getvalue().strip().splitlines()[-1]
    assert last.startswith("toy: finished 47 rows, 6 dead letters in ")
    assert not (out / ".progress").exists()


def test_answer_job_prints_progress(tmp_path, demo_tables, demo_index, capfd, monkeypatch):
    """The real answer job on the demo questions: its last console line counts every query."""
    from specrag.methods.base import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    monkeypatch.setenv("SPECRAG_PROGRESS_S", "1")
    queries = str(demo_tables[0])
    job = AnswerJob(queries, str(tmp_path / "out"), create_method("retrieve-only", top_k=2),
                    RuntimeConfig(index_dir=str(demo_index)))
    run_answer(job)
    err = capfd.readouterr().err
    total = count_rows([queries])
    assert f"answer retrieve-only: finished {total} queries, 0 dead letters in " in err
    assert not (tmp_path / "out" / ".progress").exists()


def test_counts_are_published_on_a_timer_not_only_when_the_next_element_arrives(tmp_path):
    """Elements often arrive in bursts (a batched model call finishes many queries at once) and
    then nothing for a while: the count of the burst is published within an interval anyway."""
    from specrag.transforms.progress import _Count
    fn = _Count(str(tmp_path), "done", interval_s=0.05)
    fn.setup()
    try:
        for i in range(7):
            assert list(fn.process(i)) == [i]
        deadline = time.time() + 5
        while read_progress(str(tmp_path))["done"] != 7 and time.time() < deadline:
            time.sleep(0.02)
        assert read_progress(str(tmp_path))["done"] == 7  # no finish_bundle, no later element
    finally:
        fn.teardown()

"""The run folder's rules (jobio/run_folder.py) and the seven defects of the job wing probed on
2026-12-03, each as a test: an --overwrite never loses the earlier run, whatever ends it; Beam's
flags in both forms; a damaged index is one line at start; a failed write is the last line."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.jobio.run_folder import ANSWER, EarlierRun, RunFailed, RunFolder
from specrag.methods import MethodConfig
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.pipelines.build_index import run_build_index
from specrag.pipelines.cli import main
from specrag.schemas import QUERIES
from specrag.transforms.runtime import RuntimeConfig

import remotefs  # the specragtest:// scheme (tests/remotefs.py)
from echo_method import Echo  # tests/echo_method.py

TESTS = Path(__file__).resolve().parents[1]  # echo_method.py, remotefs.py


def _queries(path: Path, rows) -> Path:
    pq.write_table(pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES), path)
    return path


def _files(folder: Path) -> dict[str, bytes]:
    """The run's files as they are (hidden folders and the lease left out)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def _ids(folder: Path) -> list[str]:
    return sorted(r["id"] for f in folder.glob("results-*.parquet") for r in pq.read_table(f).to_pylist())


def _job(queries: Path, out: Path, **kw) -> AnswerJob:
    return AnswerJob(str(queries), str(out), Echo(MethodConfig()), RuntimeConfig(models=()), **kw)


@pytest.fixture(scope="module")
def small_index(tmp_path_factory) -> Path:
    """A BM25 index of three passages (seconds to build)."""
    work = tmp_path_factory.mktemp("small_index")
    pq.write_table(pa.Table.from_pylist([{"id": f"p{i}", "title": f"T{i}", "text": f"passage number {i} about cats"}
                                         for i in range(3)]), work / "corpus.parquet")
    run_build_index(str(work / "corpus.parquet"), str(work / "index"), ["bm25"])
    return work / "index"


def test_an_overwrite_that_fails_its_threshold_keeps_the_earlier_run(tmp_path):
    """Defect 1: the earlier run's results were deleted before the failure share was judged."""
    out = tmp_path / "out"
    run_answer(_job(_queries(tmp_path / "good.parquet", [(f"q{i}", f"question {i}") for i in range(4)]), out))
    before = _files(out)
    bad = _queries(tmp_path / "blank.parquet", [(f"b{i}", "  ") for i in range(4)])  # every row a dead letter
    with pytest.raises(RunFailed, match=r"4 of 4 input rows ended as dead letters .*the earlier run is back in .*"
                                        r"this run's files are in .*\.failed-"):
        run_answer(_job(bad, out, overwrite=True, max_failure_fraction=0.5))
    assert _files(out) == before  # results, manifest, identity and inputs as they were
    [failed] = out.glob(".failed-*")
    assert len(pq.read_table(next(failed.glob("dead_letters-*.parquet")))) == 4  # nothing is lost either
    assert not list(out.glob(".replaced-*")) and not (out / ".lease").exists()
    run_answer(_job(bad, out, overwrite=True, max_failure_fraction=1.0))  # a run that passes replaces it
    assert _ids(out) == [] and not list(out.glob(".replaced-*"))


def test_an_overwrite_leaves_no_derived_file_of_the_run_it_replaced(tmp_path, capsys):
    """E2: `evaluate` writes evaluation.json into the run folder; an --overwrite that replaces the
    run set that file aside with the run, so nothing of the replaced run is read as the new one's;
    an overwrite that fails puts it back with the earlier run."""
    out, queries = tmp_path / "out", _queries(tmp_path / "q.parquet", [(f"q{i}", f"question {i}") for i in range(3)])
    run_answer(_job(queries, out))
    assert main(["evaluate", str(out), "--queries", str(queries)]) == 0
    earlier = (out / "evaluation.json").read_bytes()
    bad = _queries(tmp_path / "blank.parquet", [("b0", "  ")])
    with pytest.raises(RunFailed):
        run_answer(_job(bad, out, overwrite=True, max_failure_fraction=0.5))
    assert (out / "evaluation.json").read_bytes() == earlier  # back with the run it describes
    run_answer(_job(_queries(tmp_path / "r.parquet", [("r0", "other")]), out, overwrite=True))
    assert not (out / "evaluation.json").exists() and not list(out.glob(".replaced-*"))


def test_failed_overwrites_keep_only_the_last_failed_run_and_say_where(tmp_path):
    """E3: each failed --overwrite kept its files in a new .failed-<token>/ beside the output, and
    they piled up; the last one is kept (its place in the error) and the one before is removed."""
    out = tmp_path / "out"
    run_answer(_job(_queries(tmp_path / "good.parquet", [("q0", "question 0")]), out))
    bad = _queries(tmp_path / "blank.parquet", [("b0", "  ")])
    places = []
    for _ in range(3):
        with pytest.raises(RunFailed) as failure:
            run_answer(_job(bad, out, overwrite=True, max_failure_fraction=0.5))
        places.append(str(failure.value).rsplit("this run's files are in ", 1)[1].split()[0].rstrip(";.)"))
    assert [str(p) for p in out.glob(".failed-*")] == [places[-1]]
    assert "the last failed run's files are kept; the one before was removed" in str(failure.value)


def _echo_run_until(queries: Path, out: Path, shards: int, overwrite: bool = False) -> subprocess.Popen:
    """An Echo answer run in another process (one row a shard), returned once it has committed
    ``shards`` results shards (its other queries may hold it: ``wait-while:``)."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]);"
              "from echo_method import Echo; from specrag.methods import MethodConfig;"
              "from specrag.pipelines.answer import AnswerJob, run_answer;"
              "from specrag.transforms.runtime import RuntimeConfig;"
              "run_answer(AnswerJob(sys.argv[2], sys.argv[3], Echo(MethodConfig()), RuntimeConfig(models=()),"
              " overwrite=sys.argv[4] == 'overwrite', shard_rows=1))")
    proc = subprocess.Popen([sys.executable, "-c", script, str(TESTS), str(queries), str(out),
                             "overwrite" if overwrite else "-"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 240
    while len(list(out.glob("results-000-*.parquet"))) < shards:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.1)
    return proc


def _killed_overwrite(tmp_path: Path) -> tuple[Path, Path, dict]:
    """A finished run of 4 questions, then an --overwrite of 6 killed with SIGKILL while it writes."""
    out = tmp_path / "out"
    first = _queries(tmp_path / "first.parquet", [(f"q{i}", f"question {i}") for i in range(4)])
    run_answer(_job(first, out))
    before = _files(out)
    hold = tmp_path / "hold"
    hold.touch()
    second = _queries(tmp_path / "second.parquet", [(f"n{i}", f"new {i}") for i in range(5)]
                      + [("n5", f"wait-while:{hold}")])
    proc = _echo_run_until(second, out, shards=5, overwrite=True)  # the 5 quick answers are committed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(list(out.glob(".replaced-*"))) == 1  # the earlier run, set aside
    hold.unlink()
    return out, second, before


def test_a_run_started_right_after_its_holder_was_killed_takes_the_lease_over_and_says_so(tmp_path):
    """E6: right after a kill -9 the dead holder is a zombie until its parent reaps it, and the
    lease looked held ("being written by another run"); the next run takes it over at once and
    the manifest's attempt records whose lease it took."""
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    hold.touch()
    queries = _queries(tmp_path / "q.parquet", [(f"q{i}", f"question {i}") for i in range(3)]
                       + [("q3", f"wait-while:{hold}")])
    proc = _echo_run_until(queries, out, shards=3)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # not reaped: a zombie until proc.wait()
        time.sleep(0.5)
        hold.unlink()
        manifest = run_answer(_job(queries, out, resume=True))
        assert _ids(out) == ["q0", "q1", "q2", "q3"]
        took = manifest["attempts"][-1]["lease_takeover"]
        assert took["pid"] == proc.pid and "gone" in took["reason"]
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_overwrite_is_put_back_by_the_next_command(tmp_path, capsys):
    """Defect 2: a killed --overwrite left the earlier run in .replaced-<hex>/, never named again."""
    out, second, before = _killed_overwrite(tmp_path)
    assert main(["evaluate", "--queries", str(second), str(out)]) == 2
    assert "holds an --overwrite run that never finished" in capsys.readouterr().err  # named, not read
    with pytest.raises(EarlierRun, match="already holds an earlier run"):  # a plain run puts it back, then refuses
        run_answer(_job(second, out))
    assert "the run it was replacing is back in place" in capsys.readouterr().err
    assert _files(out) == before and not list(out.glob(".replaced-*"))
    [stopped] = out.glob(".failed-*")  # the killed run's shards are kept aside, not deleted
    assert len(list(stopped.glob("results-*.parquet"))) == 5


def test_a_killed_overwrite_is_completed_by_resume_and_only_then_replaces_the_earlier_run(tmp_path, capsys):
    """Defect 2, the other way on: --resume completes the new run; the set-aside run goes only then."""
    out, second, _ = _killed_overwrite(tmp_path)
    manifest = run_answer(_job(second, out, resume=True, shard_rows=1))
    assert "resuming the --overwrite run that was stopped" in capsys.readouterr().err
    assert manifest["resumed"]["skipped_finished"] == 5
    assert _ids(out) == [f"n{i}" for i in range(6)]  # every id once
    assert not list(out.glob(".replaced-*")) and not list(out.glob(".failed-*"))


def test_beam_flags_are_taken_in_both_of_their_forms(tmp_path, capsys):
    """Defect 3: `--direct_num_workers 1` was refused ("expected one argument")."""
    pq.write_table(pa.Table.from_pylist([{"id": "p1", "title": "T", "text": "one passage"}]), tmp_path / "c.parquet")
    assert main(["build-index", "--corpus", str(tmp_path / "c.parquet"), "--index", str(tmp_path / "i1"),
                 "--runner", "FnApiRunner", "--direct_num_workers", "1"]) == 0
    manifest = json.loads((tmp_path / "i1" / "build_manifest.json").read_text())
    assert "--direct_num_workers" in manifest["beam_args"] and "1" in manifest["beam_args"]
    with pytest.raises(SystemExit):  # a stray value still names the flag nobody defines
        main(["build-index", "--corpus", "c.parquet", "--index", "i", "--retreiver", "dense"])
    assert "unknown option(s) --retreiver (did you mean --retriever?)" in capsys.readouterr().err


def test_a_damaged_index_is_one_line_at_start(small_index, tmp_path, capsys):
    """Defects 4 and 5: a corrupt manifest.json gave a JSON error without the file's name; truncated
    bm25/ files passed the start check and failed mid-job with tracebacks."""
    import shutil
    queries = _queries(tmp_path / "q.parquet", [("a", "cats")])
    answer = ["answer", "--queries", str(queries), "--method", "retrieve-only"]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(small_index, corrupt)
    (corrupt / "manifest.json").write_text("{'kinds': 1}")
    assert main([*answer, "--index", str(corrupt), "--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{corrupt / 'manifest.json'} is not valid JSON" in err[0], err
    truncated = tmp_path / "truncated"
    shutil.copytree(small_index, truncated)
    victim = truncated / "bm25" / "data.csc.index.npy"
    victim.write_bytes(victim.read_bytes()[:20])
    assert main([*answer, "--index", str(truncated), "--output", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bm25/data.csc.index.npy has 20 bytes, files.json records" in err[0], err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    assert main([*answer, "--index", str(small_index), "--output", str(tmp_path / "o3")]) == 0  # the intact one


def test_a_failed_shard_write_is_the_last_line_not_the_lease(small_index, tmp_path, capsys, monkeypatch):
    """Defect 6: the last line named the failed `.lease` delete after `finished 20 queries`."""
    root = tmp_path / "bucket"
    (root / "in").mkdir(parents=True)
    _queries(root / "in" / "q.parquet", [(f"q{i}", f"cats {i}") for i in range(12)])
    monkeypatch.setitem(remotefs.ROOT, "path", str(root))
    monkeypatch.setitem(remotefs.BREAK_AFTER, "results", 1)  # the store goes away after one shard
    monkeypatch.setitem(remotefs.BREAK_AFTER, "written", 0)
    monkeypatch.setenv("SPECRAG_PROGRESS_S", "60")
    rc = main(["answer", "--queries", "specragtest://in/q.parquet", "--index", str(small_index), "--method",
               "retrieve-only", "--shard-rows", "2", "--output", "specragtest://out"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "the store is unavailable" in err[-1] and "WriteResults" in err[-1] and ".lease" not in err[-1], err[-3:]
    assert not any("finished" in line for line in err)  # the job did not finish
    assert any("stopped after" in line and "(the job failed)" in line for line in err)


def _chattr_works(tmp_path: Path) -> bool:
    import shutil
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = shutil.which("chattr") is not None and subprocess.run(["chattr", "+i", str(probe)],
                                                                capture_output=True).returncode == 0
    if ok:
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    return ok


def test_an_output_folder_made_immutable_mid_run_is_one_line_and_resume_completes_the_run(small_index, tmp_path,
                                                                                         capfd):
    """D6: a results shard that could not be written (the folder made immutable while the job
    ran) printed Beam's traceback and a line ending "with exceptions None"; it is one line naming
    the shard, its path and the OS error, and once the folder is writable again --resume answers
    the rest, keeping every shard written before (nothing answered twice, nothing lost)."""
    import threading
    if not _chattr_works(tmp_path):
        pytest.skip("chattr +i needs root (CAP_LINUX_IMMUTABLE) on a filesystem that has the attribute")
    queries = _queries(tmp_path / "q.parquet", [(f"q{i}", f"cats {i}") for i in range(600)])
    out = tmp_path / "out"
    flags = ["answer", "--queries", str(queries), "--index", str(small_index), "--method", "retrieve-only",
             "--shard-rows", "2", "--output", str(out)]

    def freeze():
        deadline = time.time() + 120
        while not list(out.glob("results-*.parquet")) and time.time() < deadline:
            time.sleep(0.005)
        subprocess.run(["chattr", "+i", str(out)], check=True)
    thread = threading.Thread(target=freeze, daemon=True)
    thread.start()
    try:
        assert main(flags) == 2
    finally:
        thread.join()
        subprocess.run(["chattr", "-i", str(out)], check=True)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert not any("Traceback" in ln for ln in err), err[:5]
    assert re.match(r"specrag answer: error: could not write the results shard .*/results-000-.*\.parquet: "
                    r"PermissionError: \[Errno 1\] Operation not permitted", err[-1]), err[-1]
    assert "with exceptions None" not in err[-1]
    kept = _ids(out)
    assert 0 < len(kept) < 600
    assert main([*flags, "--resume"]) == 0, capfd.readouterr().err[-2000:]
    rows = [r["id"] for f in out.glob("results-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert sorted(rows) == sorted(f"q{i}" for i in range(600)) and set(kept) <= set(rows)


def test_a_suite_file_with_a_python_tag_is_one_line_and_never_executed(tmp_path, capsys):
    """Defect 7: `!!python/object` in a suite crashed `specrag compare` with a traceback."""
    marker = tmp_path / "executed"
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: x\ndatasets: !!python/object/apply:os.system ['touch {marker}']\n")
    assert main(["compare", "--suite", str(suite), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{suite}: not a suite file (line 2, column 11)" in err[0], err
    assert not marker.exists()


def test_builds_refuse_an_earlier_index_as_a_library_call_and_replace_it_as_a_transaction(small_index, tmp_path):
    """build-index refused to overwrite only in the CLI; a failed --overwrite rebuild keeps the index."""
    import shutil
    index = tmp_path / "index"
    shutil.copytree(small_index, index)
    before = {p.relative_to(index).as_posix(): p.read_bytes() for p in index.rglob("*") if p.is_file()}
    with pytest.raises(EarlierRun, match="already holds an index: pass --overwrite"):
        run_build_index(str(small_index.parent / "corpus.parquet"), str(index), ["bm25"])
    pq.write_table(pa.Table.from_pylist([{"id": "x", "title": "T", "text": "  "}]), tmp_path / "blank.parquet")
    with pytest.raises(ValueError, match="no valid passages.*the earlier run is back in"):
        run_build_index(str(tmp_path / "blank.parquet"), str(index), ["bm25"], overwrite=True)
    assert {p.relative_to(index).as_posix(): p.read_bytes() for p in index.rglob("*")
            if p.is_file() and not p.relative_to(index).parts[0].startswith(".")} == before
    rebuilt = run_build_index(str(small_index.parent / "corpus.parquet"), str(index), ["bm25"], overwrite=True)
    assert rebuilt["index"]["passages"] == 3 and not list(index.glob(".replaced-*"))


def test_the_folder_rules_are_one_object_for_every_job():
    """The jobs ask RunFolder; none keeps its own copy of the rules (set-aside, refusal, resume)."""
    repo = TESTS.parent
    for name in ("answer.py", "streaming.py", "extract_triplets.py", "build_index.py", "build_datastore.py",
                 "cli.py", "compare.py"):
        text = (repo / "pipelines" / name).read_text()
        for rule in ("already holds", ".replaced-", "set_aside", "def check_resumable", "def reconcile"):
            assert rule not in text, f"pipelines/{name} holds its own {rule!r}"
    assert RunFolder("x", ANSWER).layout.results == "results-*.parquet"


def test_a_finished_run_compacts_to_one_results_file_that_reads_the_same(tmp_path):
    """What a versioned runs folder keeps: one results file and one dead-letters file per run."""
    from specrag.evaluation.report import evaluate_run
    rows = [{"id": f"q{i}", "question": f"capital {i}", "answers": [f"CAPITAL {i}" if i % 2 else "x"],
             "task_type": "short_form", "dataset": "toy"} for i in range(5)] + [{"id": "b", "question": " "}]
    queries = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=QUERIES), queries)
    out = tmp_path / "out"
    manifest = run_answer(_job(queries, out, shard_rows=1))
    assert len(list(out.glob("results-*.parquet"))) == 5
    before = evaluate_run(str(out), str(queries))
    folder = RunFolder(str(out), ANSWER)
    assert [Path(p).name for p in folder.compact()] == ["results-000-compacted.parquet"]  # one dead letter: one file
    assert len(list(out.glob("results-*.parquet"))) == 1 and len(list(out.glob("dead_letters-*.parquet"))) == 1
    after = evaluate_run(str(out), str(queries))
    assert after["rows"] == before["rows"] and after["coverage"] == before["coverage"]
    assert folder.reconcile(manifest["inputs"]) == manifest["reconciliation"]
    again = run_answer(_job(queries, out, resume=True))  # a compacted run resumes as any other
    assert again["resumed"] == {"attempt": 1, "skipped_finished": 5}
    assert folder.compact() == []  # nothing left to join

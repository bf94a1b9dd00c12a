"""A newcomer's first hour: a few questions of a benchmark set, a table with only the columns it
needs (and one line when one is missing), and a quiet console on success."""
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.pipelines.cli import main


def test_import_data_takes_the_first_questions_of_a_set_and_names_the_sets(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["import-data", "--help"])
    assert "popqa" in capsys.readouterr().out
    assert main(["import-data", "--data-dir", str(data_dir), "--datasets", "popqa", "--limit", "5",
                 "--out", str(tmp_path / "data")]) == 0
    queries = pq.read_table(tmp_path / "data" / "popqa" / "queries.parquet")
    corpus = pq.read_table(tmp_path / "data" / "popqa" / "corpus.parquet")
    assert queries.num_rows == 5 and 0 < corpus.num_rows


def test_minimal_tables_work_and_a_missing_column_is_one_line_before_anything_is_written(tmp_path, capsys):
    pq.write_table(pa.Table.from_pylist([{"id": "p1", "text": "Paris is the capital of France."},
                                         {"id": "p2", "text": "Rome is the capital of Italy."}]), tmp_path / "c.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": "q1", "question": "capital of France"}]), tmp_path / "q.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": "q1", "query": "capital of France"}]), tmp_path / "bad.parquet")
    assert main(["build-index", "--corpus", str(tmp_path / "c.parquet"), "--index", str(tmp_path / "index")]) == 0
    capsys.readouterr()
    answer = ["answer", "--index", str(tmp_path / "index"), "--method", "retrieve-only"]
    assert main([*answer, "--queries", str(tmp_path / "bad.parquet"), "--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the queries table lacks column question (it has: id, query)" in err[0], err
    assert not (tmp_path / "o1").exists()
    assert main([*answer, "--queries", str(tmp_path / "q.parquet"), "--output", str(tmp_path / "o2")]) == 0
    captured = capsys.readouterr()
    noise = [ln for ln in captured.err.splitlines() if ln.startswith(("DEBUG", "INFO", "WARNING"))]
    assert not noise, noise  # the progress line and the result, no library logging
    assert "reconciliation: 1 input row = 1 result + 0 dead letters" in captured.out


def test_limit_answers_the_first_rows_in_file_order_and_a_larger_limit_grows_the_run(tmp_path, capsys):
    from specrag.methods import MethodConfig
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    from echo_method import Echo  # tests/echo_method.py
    folder = tmp_path / "queries"
    folder.mkdir()
    for name, ids in (("a", range(2)), ("b", range(2, 6))):
        pq.write_table(pa.Table.from_pylist([{"id": f"q{i}", "question": f"question {i}"} for i in ids]),
                       folder / f"{name}.parquet")
    out = tmp_path / "out"

    def run(limit, **kw):
        return run_answer(AnswerJob(str(folder / "*.parquet"), str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                                    limit=limit, **kw))

    def ids():
        return sorted(r["id"] for f in out.glob("results-*.parquet") for r in pq.read_table(f).to_pylist())

    first = run(3)
    assert ids() == ["q0", "q1", "q2"]  # a.parquet whole, then b.parquet's first row
    assert first["reconciliation"]["input_rows"] == 3 and first["reconciliation"]["lost"] == 0
    assert sorted(v["rows"] for v in first["inputs"].values()) == [1, 2]
    grown = run(5, resume=True)
    assert ids() == ["q0", "q1", "q2", "q3", "q4"]
    assert grown["resumed"]["skipped_finished"] == 3 and grown["reconciliation"]["input_rows"] == 5
    with pytest.raises(ValueError, match="cannot resume"):
        run(2, resume=True)  # fewer rows than the run answered: not the same query set
    with pytest.raises(SystemExit):
        main(["answer", "--help"])
    assert "--limit" in capsys.readouterr().out


def test_queries_and_corpora_from_json_lines_and_csv(tmp_path, capsys):
    (tmp_path / "corpus.csv").write_text('id,title,text\n007,Paris,"Paris is the capital of France."\n'
                                         '008,Rome,"Rome is the capital of Italy."\n')
    (tmp_path / "queries.jsonl").write_text('{"id": 1, "question": "capital of France"}\n'
                                            '{"id": "q2", "question": "capital of Italy"}\n')
    assert main(["build-index", "--corpus", str(tmp_path / "corpus.csv"), "--index", str(tmp_path / "index")]) == 0
    passages = pq.read_table(tmp_path / "index" / "passages.parquet").column("id").to_pylist()
    assert sorted(passages) == ["007", "008"]  # a CSV id keeps its zeros
    assert main(["answer", "--index", str(tmp_path / "index"), "--method", "retrieve-only",
                 "--queries", str(tmp_path / "queries.jsonl"), "--output", str(tmp_path / "out")]) == 0
    rows = {r["id"]: r for f in (tmp_path / "out").glob("results-*.parquet") for r in pq.read_table(f).to_pylist()}
    assert set(rows) == {"1", "q2"}
    (tmp_path / "broken.jsonl").write_text('{"id": "q1", "question": "fine"}\n{"id": "q2", "question": \n')
    capsys.readouterr()
    assert main(["answer", "--index", str(tmp_path / "index"), "--method", "retrieve-only",
                 "--queries", str(tmp_path / "broken.jsonl"), "--output", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.jsonl: not a readable JSON lines file" in err[0], err


def test_evaluate_reads_queries_as_answer_does_and_needs_only_their_required_columns(tmp_path, capsys):
    """`evaluate --queries` takes what `answer --queries` takes — Parquet, JSON lines, CSV — and a
    gold table of id, question and answers alone (no dataset, no task type), as a user writes it."""
    import json

    from specrag.methods import MethodConfig
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    from echo_method import Echo  # tests/echo_method.py: the answer is the question upper-cased
    rows = [{"id": "q1", "question": "paris", "answers": ["PARIS"]}, {"id": "q2", "question": "rome", "answers": ["Milan"]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "q.csv").write_text("id,question\nq1,paris\nq2,rome\n")  # no answers: nothing to score right
    run_answer(AnswerJob(str(tmp_path / "q.parquet"), str(tmp_path / "out"), Echo(MethodConfig()),
                         RuntimeConfig(models=())))
    for name, contains in (("q.parquet", 50.0), ("q.jsonl", 50.0), ("q.csv", 0.0)):
        capsys.readouterr()
        assert main(["evaluate", str(tmp_path / "out"), "--queries", str(tmp_path / name),
                     "--json", str(tmp_path / "e.json")]) == 0, capsys.readouterr().err
        [row] = json.loads((tmp_path / "e.json").read_text())
        assert row["n"] == 2 and row["contains"] == contains and row["dataset"] == "-", (name, row)
    (tmp_path / "bad.jsonl").write_text('{"id": "q1", "question": "paris"}\n{"question": "rome"}\n')
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "out"), "--queries", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl row 2: id" in err[0], err


@pytest.mark.parametrize("command, own, others", [
    ("build-index", ("--corpus", "--kinds", "--index", "--model"), ("--engine-batch", "--datastore", "--grow-from",
                                                                    "--retriever", "--limit")),
    ("extract-triplets", ("--corpus", "--extractor", "--output"), ("--kinds", "--grow-from", "--index",
                                                                   "--max-in-flight")),
    ("answer", ("--queries", "--limit", "--grow-from", "--engine-batch"), ("--corpus", "--extractor", "--dense-shards")),
])
def test_each_command_help_lists_only_its_own_options(command, own, others, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    flags = set(re.findall(r"^\s+(--[a-z-]+)", capsys.readouterr().out, re.M))
    assert set(own) <= flags and not flags & set(others), flags
    with pytest.raises(SystemExit):  # and refuses another command's option as unknown
        main([command, others[0], "1"])


def test_a_rewritten_json_lines_file_is_read_anew(tmp_path):
    from specrag.jobio.tables import read_table
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "one"}\n')
    assert read_table(str(path)).column("id").to_pylist() == ["a"]
    path.write_text('{"id": "a", "question": "one"}\n{"id": "b", "question": "two"}\n')
    assert read_table(str(path)).column("id").to_pylist() == ["a", "b"]


def test_a_job_uses_the_machines_cores_unless_told_and_says_so(tmp_path, capsys, monkeypatch):
    """E7: `specrag answer` with no Beam or thread flags ran one worker process with one torch
    thread, one core of two idle. Unless --threads or SPECRAG_THREADS says, the in-process runner's
    worker processes share the cores (workers x threads = cores); the start line says so."""
    import os
    from specrag.pipelines.options import RuntimeOptions, job_options
    monkeypatch.delenv("SPECRAG_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    def threads(*flags):
        options, _ = job_options(list(flags))
        return options.view_as(RuntimeOptions).threads
    assert threads() == 8
    assert threads("--direct_num_workers=2", "--direct_running_mode=multi_processing") == 4
    assert threads("--threads", "3") == 3
    assert threads("--runner=FlinkRunner") == 1  # a cluster's workers: not this machine's cores
    monkeypatch.setenv("SPECRAG_THREADS", "2")
    assert threads() == 2
    monkeypatch.delenv("SPECRAG_THREADS")
    pq.write_table(pa.Table.from_pylist([{"id": "p1", "text": "Paris is the capital of France."}]),
                   tmp_path / "c.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": "q1", "question": "capital of France"}]), tmp_path / "q.parquet")
    assert main(["build-index", "--corpus", str(tmp_path / "c.parquet"), "--index", str(tmp_path / "index")]) == 0
    capsys.readouterr()
    assert main(["answer", "--index", str(tmp_path / "index"), "--method", "retrieve-only", "--queries",
                 str(tmp_path / "q.parquet"), "--output", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "answer retrieve-only: 1 worker process x 8 torch threads (8 cores; --threads, --direct_num_workers " \
           "to change)" in err, err

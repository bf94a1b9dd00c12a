"""A newcomer's first hour: a few questions of a benchmark set, a table with only the columns it
needs (and one line when one is missing), and a quiet console on success."""
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
    assert "reconciliation: 1 input rows = 1 results + 0 dead letters" in captured.out

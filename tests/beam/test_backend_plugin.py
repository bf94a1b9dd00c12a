"""A backend is one module and one registry line: tests/echo_backend.py, registered here, runs
`specrag answer` with its own flag, start-up check, identity and fallback, and no other file of
specrag knows it."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag import registry
from specrag.pipelines.cli import main

TESTS = Path(__file__).resolve().parents[1]  # echo_backend.py


@pytest.fixture
def echo_registered(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setitem(registry.BACKENDS.targets, "echo", "echo_backend:EchoBackend")  # the one registry line


def test_a_backend_of_one_module_and_one_registry_line_answers_a_job(echo_registered, demo_tables, demo_index,
                                                                     tmp_path, capsys):
    rows = [r for r in pq.read_table(demo_tables[0]).to_pylist() if r["task_type"] == "short_form"][:3]
    queries = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(rows), queries)
    job = ["answer", "--queries", str(queries), "--index", str(demo_index), "--method", "standard",
           "--runner=FnApiRunner", "--direct_running_mode=in_memory", "--backend", "echo"]
    assert main([*job, "--output", str(tmp_path / "run"), "--echo-reply", "Paris, France"]) == 0
    out = [r for f in sorted((tmp_path / "run").glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in rows)
    assert {r["raw_output"] for r in out} == {"Paris, France"}
    identity = json.loads((tmp_path / "run" / "manifest.json").read_text())["identity"]
    assert identity["backend"] == "echo" and identity["echo_reply"] == "Paris, France"
    assert identity["models"]["generator"] == "echo:smollm2-135m-instruct"
    # its check refuses a run before any work, in one line; its flag belongs to it alone
    capsys.readouterr()
    assert main([*job, "--output", str(tmp_path / "empty"), "--echo-reply", " "]) == 2
    assert capsys.readouterr().err.strip().endswith("--echo-reply must say something")
    assert not (tmp_path / "empty" / "manifest.json").exists()
    assert main(["answer", "--queries", str(queries), "--index", str(demo_index), "--output", str(tmp_path / "x"),
                 "--echo-reply", "Paris"]) == 2
    assert "--echo-reply is an option of --backend echo" in capsys.readouterr().err
    # a dense index's query encoder runs on its fallback, the local backend
    from specrag.transforms.runtime import RuntimeConfig
    runtime = RuntimeConfig(backend="echo", retriever="dense")
    assert runtime.backend_for("all-minilm-l6-v2") == "local" and runtime.backend_for("gemma3-270m") == "echo"

"""The Beam answer pipeline on the FnApiRunner: dead letters, the keyed join, end-to-end runs."""
import glob
import json
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.methods import Method, MethodConfig, Stage, create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.schemas import QUERIES
from specrag.transforms.runtime import RuntimeConfig


def _read(out, name):
    rows = []
    for f in sorted(glob.glob(str(out / f"{name}-*.parquet"))):
        rows += pq.read_table(f).to_pylist()
    return rows


# -- a fan-out method whose stages call no model: it tests the graph and the join --------
@dataclass
class FanOut(Stage):
    parts: int = 3
    name: str = "FanOut"

    async def run(self, item, ctx):
        item.trace.count("retrieval_calls")  # work before the fan-out must survive the join once
        return [item.fork(i, self.parts) for i in range(self.parts)]


@dataclass
class Work(Stage):
    name: str = "Work"

    async def run(self, item, ctx):
        if item.query["question"] == "break part 1" and item.part == 1:
            raise RuntimeError("part 1 failed")
        item.trace.count("model_calls")
        item.answer = f"part{item.part}"
        return item


@dataclass
class Join(Stage):
    name: str = "Join"
    gather: ClassVar[bool] = True

    async def run(self, item, ctx):
        item.answer = "+".join(p.answer for p in item.gathered)
        return item


class FanOutMethod(Method):
    name = "fan-out-test"
    needs = {}

    def stages(self):
        return [FanOut(), Work(), Join()]


def _queries(path, rows, schema=QUERIES):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def test_fan_out_parts_are_joined_by_query_id(tmp_path):
    rows = [{"id": f"q{i}", "question": f"question {i}"} for i in range(10)]
    rows.append({"id": "broken", "question": "break part 1"})
    job = AnswerJob(_queries(tmp_path / "q.parquet", rows), str(tmp_path / "out"), FanOutMethod(MethodConfig()),
                    RuntimeConfig(models=()), batch_size=4, num_shards=3, max_failure_fraction=0.1)
    manifest = run_answer(job)
    results = {r["id"]: r for r in _read(tmp_path / "out", "results")}
    assert sorted(results) == sorted(f"q{i}" for i in range(10))
    assert all(r["answer"] == "part0+part1+part2" for r in results.values())
    assert all(r["counts"]["model_calls"] == 3 for r in results.values())  # merged traces
    assert all(r["counts"]["retrieval_calls"] == 1 for r in results.values())
    dead = _read(tmp_path / "out", "dead_letters")
    # FanOut and Work run fused: a failed part fails its query once, and no part reaches the join
    assert [(d["id"], d["stage"], d["message"]) for d in dead] == [("broken", "Work", "part 1 failed")]
    assert manifest["counters"]["FanOut.done"] == 11 and manifest["counters"]["Work.failed"] == 1
    assert manifest["counters"]["Join.done"] == 10 and manifest["counters"]["answered"] == 10
    assert manifest["counters"]["engines_started"] == 1


def test_a_run_over_the_failure_threshold_fails_after_writing_everything(tmp_path):
    from specrag.jobio.run_folder import RunFailed
    rows = [{"id": f"b{i}", "question": "break part 1"} for i in range(3)] + [{"id": "ok", "question": "fine"}]
    job = lambda **kw: AnswerJob(_queries(tmp_path / "q.parquet", rows), str(tmp_path / "out"),
                                 FanOutMethod(MethodConfig()), RuntimeConfig(models=()), **kw)
    with pytest.raises(RunFailed, match="3 of 4 input rows ended as dead letters"):
        run_answer(job())
    assert len(_read(tmp_path / "out", "dead_letters")) == 3 and len(_read(tmp_path / "out", "results")) == 1
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["dead_letter_share"] == 0.75
    with pytest.raises(ValueError, match="already holds an earlier run"):  # never silently replaced
        run_answer(job(max_failure_fraction=1.0))
    run_answer(job(max_failure_fraction=1.0, overwrite=True))


def test_gather_parts_expires_incomplete_queries_and_keeps_no_state(tmp_path):
    """A part arriving without its siblings (or after its query was emitted) is one dead letter."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to
    from typing import Any, Tuple
    from specrag.methods import QueryState
    from specrag.transforms.batching import GatherParts
    from specrag.transforms.records import DEAD

    def part(qid, i, n):
        return qid, QueryState(query={"id": qid, "question": "q"}).fork(i, n)
    parts = [part("full", 0, 2), part("full", 1, 2), part("lone", 1, 3)]
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        out = (p | beam.Create(parts) | beam.ParDo(GatherParts("Join")).with_input_types(
            Tuple[str, Any]).with_outputs(DEAD, main="out"))
        assert_that(out.out | beam.Map(lambda kv: (kv[0], len(kv[1].gathered))), equal_to([("full", 2)]))
        assert_that(out[DEAD] | beam.Map(lambda d: (d["id"], d["message"].split(" (")[0])),
                    equal_to([("lone", "incomplete: input ended with parts [1] of 3")]), label="Dead")


@pytest.mark.slow
def test_bad_rows_become_dead_letters_and_the_rest_is_answered(tmp_path):
    good = [{"id": "g1", "question": "What is the capital of France?"},
            {"id": "g2", "question": "Name a primary colour."}]
    bad = [{"id": "e1", "question": None}, {"id": "e2", "question": "   "},
           {"id": "g1", "question": "duplicate of g1"}]
    pq.write_table(pa.Table.from_pylist(good + bad), tmp_path / "part-0.parquet")  # no schema: nulls allowed
    # wrong type: the whole file's question column is an integer
    pq.write_table(pa.table({"id": ["t1"], "question": [123]}), tmp_path / "part-1.parquet")
    # invalid UTF-8: a binary question column with bytes that do not decode
    pq.write_table(pa.table({"id": ["u1", "u2"], "question": pa.array([b"\xff\xfe\xfd", b"Who wrote Hamlet?"],
                                                                      pa.binary())}), tmp_path / "part-2.parquet")
    method = create_method("no-retrieval", max_new_tokens=8)
    job = AnswerJob(str(tmp_path / "part-*.parquet"), str(tmp_path / "out"), method,
                    RuntimeConfig().with_roles(method.model_roles), batch_size=2, num_shards=2,
                    max_failure_fraction=1.0)  # most rows are bad on purpose
    manifest = run_answer(job)
    results = _read(tmp_path / "out", "results")
    dead = _read(tmp_path / "out", "dead_letters")
    assert sorted(r["id"] for r in results) == ["g1", "g2", "u2"]
    reasons = {(d["id"], d["message"].split(" (")[0]) for d in dead}
    assert reasons == {("e1", "question: missing"), ("e2", "question: empty"),
                       ("g1", "duplicate id 'g1'"), ("t1", "question: expected a string, got int"),
                       ("u1", "question: invalid UTF-8 at byte 0")}
    dup = next(d for d in dead if d["id"] == "g1")
    assert json.loads(dup["raw"])["question"] == "duplicate of g1"  # the later row is the one rejected
    assert all(r["answer"] for r in results)
    assert manifest["method_config"]["max_new_tokens"] == 8 and len(manifest["inputs"]) == 3


def test_manifests_name_the_source_commit_they_ran(monkeypatch):
    import subprocess
    from pathlib import Path
    from specrag.pipelines.manifest import source_revision, versions
    repo = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    expected = head.stdout.strip() if head.returncode == 0 else "not a checkout"
    assert versions()["specrag_source"].removesuffix("+dirty") == expected
    monkeypatch.setenv("PATH", "")  # no git: a wheel's install says so rather than failing the job
    assert source_revision() == "not a checkout"


@pytest.mark.slow
def test_cli_answer_and_evaluate_on_demo_data(tmp_path, demo_tables, demo_index, capsys):
    from specrag.pipelines.cli import main
    queries = str(demo_tables[0])
    for method in ("no-retrieval", "standard"):
        extra = ["--set", "top_k=3"] if method == "standard" else []
        assert main(["answer", "--queries", queries, "--output", str(tmp_path / method), "--method", method,
                     "--index", str(demo_index), "--batch-size", "8", *extra]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "no-retrieval"), str(tmp_path / "standard"), "--queries", queries]) == 0
    table = capsys.readouterr().out
    assert "contains" in table and "standard" in table and "no-retrieval" in table
    n = pq.read_metadata(queries).num_rows
    for method in ("no-retrieval", "standard"):
        results = _read(tmp_path / method, "results")
        assert len(results) == n and not _read(tmp_path / method, "dead_letters")
        manifest = json.loads((tmp_path / method / "manifest.json").read_text())
        assert manifest["versions"]["apache-beam"] == "2.77.0" and manifest["inputs"][queries]["rows"] == n
    standard = {r["id"]: r for r in _read(tmp_path / "standard", "results")}
    assert all(1 <= len(r["retrieved"][0]["doc_ids"]) <= 3 for r in standard.values())
    assert sum(len(r["retrieved"][0]["doc_ids"]) == 3 for r in standard.values()) >= len(standard) // 2
    assert main(["answer", "--queries", queries, "--output", str(tmp_path / "dense"), "--method", "standard",
                 "--index", str(demo_index), "--retriever", "dense", "--set", "top_k=2"]) == 0
    dense = {r["id"]: r for r in _read(tmp_path / "dense", "results")}
    assert len(dense) == n and all(len(r["retrieved"][0]["doc_ids"]) == 2 for r in dense.values())
    assert all(r["counts"]["embed_calls"] == 1 for r in dense.values())  # the query's embedding
    assert all(r["counts"]["embed_calls"] == 0 for r in standard.values())  # BM25 embeds nothing
    assert dense["demo-q00"]["retrieved"][0]["doc_ids"][0] == "demo-004"  # Canberra for Australia's capital
    report = json.loads((tmp_path / "standard" / "evaluation.json").read_text())
    assert report["coverage"] == {"queries": n, "answered": n, "dead_letter_ids": 0, "missing": 0,
                                  "duplicate_results": 0, "in_results_and_dead_letters": 0}
    short = next(r for r in report["rows"] if r["task_type"] == "short_form")
    assert short["contains"] >= 30.0  # retrieval puts the answer in the prompt; the 135M model mostly copies it


def test_unknown_method_setting_is_rejected():
    with pytest.raises(ValueError, match="has no setting"):
        create_method("standard", topk=3)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        create_method("standard", top_k=0)


def test_retrieving_method_without_index_fails_at_start(tmp_path):
    method = create_method("standard")
    job = AnswerJob(_queries(tmp_path / "q.parquet", [{"id": "a", "question": "q"}]), str(tmp_path / "o"), method,
                    RuntimeConfig().with_roles(method.model_roles))
    with pytest.raises(ValueError, match="pass --index"):
        run_answer(job)


def test_resume_answers_only_unfinished_queries(tmp_path):
    rows = [{"id": f"q{i}", "question": f"question {i}"} for i in range(6)]
    method = FanOutMethod(MethodConfig())
    job = lambda path, resume: AnswerJob(path, str(tmp_path / "out"), method, RuntimeConfig(models=()),
                                         batch_size=4, num_shards=2, shard_rows=2, resume=resume)
    path = _queries(tmp_path / "all.parquet", rows + [{"id": "bad", "question": ""}])
    run_answer(job(path, False))
    # a run killed before its last shard committed: that shard's queries have no result
    [lost, *kept] = sorted((tmp_path / "out").glob("results-000-*.parquet"))
    lost.unlink()
    finished = {r["id"] for r in _read(tmp_path / "out", "results")}
    assert kept and 0 < len(finished) < 6
    manifest = run_answer(job(path, True))
    assert manifest["resumed"] == {"attempt": 1, "skipped_finished": len(finished)}
    results = _read(tmp_path / "out", "results")
    assert sorted(r["id"] for r in results) == [f"q{i}" for i in range(6)]  # each once
    assert sorted({f.name.split("-")[1] for f in (tmp_path / "out").glob("results-*.parquet")}) == ["000", "001"]
    assert [d["id"] for d in _read(tmp_path / "out", "dead_letters")] == ["bad"]  # replaced, not doubled


def test_resume_with_another_identity_is_refused_with_the_reason(tmp_path):
    from specrag.jobio.run_folder import ANSWER, RunFolder
    from specrag.pipelines.answer import run_identity
    rows = [{"id": f"q{i}", "question": f"question {i}"} for i in range(3)]
    path = _queries(tmp_path / "q.parquet", rows)
    job = lambda runtime, **kw: AnswerJob(path, str(tmp_path / "out"), FanOutMethod(MethodConfig()), runtime, **kw)
    first = run_answer(job(RuntimeConfig(models=())))
    with pytest.raises(ValueError, match=r"dtype: 'float32' -> 'bfloat16'"):
        run_answer(job(RuntimeConfig(models=(), dtype="bfloat16"), resume=True))
    generator = RuntimeConfig(models=(("generator", "smollm2-135m-instruct"),))
    with pytest.raises(ValueError, match=r"models.generator: None -> 'smollm2-135m-instruct@sha256:[0-9a-f]{16}'"):
        RunFolder(str(tmp_path / "out"), ANSWER).check_resumable(run_identity(job(generator)))
    again = run_answer(job(RuntimeConfig(models=()), resume=True))  # same identity: nothing left to do
    assert again["run_fingerprint"] == first["run_fingerprint"]
    assert again["resumed"] == {"attempt": 1, "skipped_finished": 3}


def test_validation_judges_rows_by_position_in_two_passes(tmp_path):
    """The duplicate check groups (id, position) only and judges re-read rows against the exceptions:
    a later duplicate (across files) is a dead letter naming the first, an id answered earlier is
    skipped, a marked id's first row carries the mark, an invalid row is one dead letter."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to
    from specrag.schemas.validation import validate_passage
    from specrag.transforms.parquet_io import ReadParquetRows
    from specrag.transforms.validate import MARK_FIELD, ValidateRows
    pq.write_table(pa.table({"id": ["a", "b", "c", "x"], "text": ["a1", "b1", "c1", ""]}), tmp_path / "p-0.parquet")
    pq.write_table(pa.table({"id": ["a", "d", "b"], "text": ["a2", "d1", "b2"]}), tmp_path / "p-1.parquet")
    read = ReadParquetRows(str(tmp_path / "p-*.parquet"))
    first = str(tmp_path / "p-0.parquet")
    with beam.Pipeline() as p:
        valid, dead = p | ValidateRows(read, validate_passage, finished=p | "F" >> beam.Create(["c"]),
                                       marked=p | "M" >> beam.Create(["b", "z"]))
        assert_that(valid | beam.Map(lambda r: (r["id"], r["text"], bool(r.get(MARK_FIELD)))),
                    equal_to([("a", "a1", False), ("b", "b1", True), ("d", "d1", False)]), label="Valid")
        assert_that(dead | beam.Map(lambda d: (d["id"], d["message"])),
                    equal_to([("a", f"duplicate id 'a' (first seen at {first} row 1)"),
                              ("b", f"duplicate id 'b' (first seen at {first} row 2)"),
                              ("x", "text: empty")]), label="Dead")

"""Random malformed query files through the answer job (hypothesis): whatever the rows hold —
missing fields, wrong types, huge strings, invalid UTF-8, NaN, nested junk, duplicate or missing
ids — the job does not crash and every input row ends in exactly one of results or dead letters;
a file with no question column at all is refused in one line before anything is written.
The fast echo method stands in for a model: the claim is about validation and bookkeeping."""
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specrag.methods import MethodConfig
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.transforms.runtime import RuntimeConfig

from echo_method import Echo  # tests/echo_method.py


IDS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "é", " ", ""]), st.text(max_size=8))
# one column type per file, as Parquet has it; values that a query row may not hold included
QUESTION_COLUMNS = st.sampled_from(["string", "binary", "float", "int", "list", "struct", "null", "missing"])


def _question(kind: str):
    return {
        "string": st.one_of(st.none(), st.text(max_size=40), st.just(""), st.just("   "), st.just("x" * 200_000)),
        "binary": st.one_of(st.binary(max_size=16), st.just(b"\xff\xfe\xfa invalid utf-8"), st.just("ok".encode())),
        "float": st.one_of(st.just(math.nan), st.floats(allow_nan=True, allow_infinity=True)),
        "int": st.integers(-2**40, 2**40),
        "list": st.lists(st.text(max_size=5), max_size=3),
        "struct": st.fixed_dictionaries({"x": st.integers(0, 9)}),
        "null": st.none(),
        "missing": st.none(),
    }[kind]


TYPES = {"string": pa.string(), "binary": pa.binary(), "float": pa.float64(), "int": pa.int64(),
         "list": pa.list_(pa.string()), "struct": pa.struct([("x", pa.int64())]), "null": pa.null()}


@st.composite
def query_files(draw):
    files = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(QUESTION_COLUMNS)
        n = draw(st.integers(0, 6))
        ids = [draw(IDS) for _ in range(n)]
        columns = {"id": pa.array(ids, pa.string())}
        if kind != "missing":
            columns["question"] = pa.array([draw(_question(kind)) for _ in range(n)], TYPES[kind])
        if draw(st.booleans()):  # junk in an optional field
            columns["task_type"] = pa.array([draw(st.sampled_from(["short_form", "nonsense", None])) for _ in range(n)],
                                            pa.string())
        files.append(pa.table(columns))
    return files


@pytest.mark.slow
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tables=query_files())
def test_malformed_rows_never_crash_the_job_and_every_row_is_accounted_for(tables, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    for i, table in enumerate(tables):
        pq.write_table(table, folder / f"part-{i}.parquet")
    total = sum(t.num_rows for t in tables)
    out = folder / "out"
    if any("question" not in t.column_names for t in tables):  # a whole file without the column: one line
        with pytest.raises(ValueError, match=r"lacks column question \(it has: id"):
            run_answer(AnswerJob(str(folder / "part-*.parquet"), str(out), Echo(MethodConfig()),
                                 RuntimeConfig(models=()), max_failure_fraction=1.0))
        assert not out.exists() or not list(out.iterdir())  # refused before anything is written
        return
    run_answer(AnswerJob(str(folder / "part-*.parquet"), str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                         max_failure_fraction=1.0))
    read = lambda name: [r for f in sorted(out.glob(f"{name}-*.parquet")) for r in pq.read_table(f).to_pylist()]  # noqa: E731
    results, dead = read("results"), read("dead_letters")
    assert len(results) + len(dead) == total  # each input row exactly once
    assert len({r["id"] for r in results}) == len(results)  # an id answered once
    for r in results:
        assert isinstance(r["id"], str) and r["id"].strip() and r["answer"] is not None
    assert all(d["stage"] and d["message"] for d in dead)

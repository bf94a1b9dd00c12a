"""The same `specrag answer` job on three runner set-ups gives the same results, and each
worker process loads its models once: the FnApiRunner with one worker, with two worker
processes, and the PortableRunner against a Beam job service (the Job API that Flink's and
Spark's job servers speak), LOOPBACK environment."""
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.methods import create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.transforms.runtime import RuntimeConfig

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job_service():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the Beam job service did not start")
    yield f"localhost:{port}"
    proc.terminate()
    proc.wait(timeout=30)


RUNNERS = {
    "fnapi-1": ["--runner=FnApiRunner"],
    "fnapi-2-processes": ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
}

METHODS = {  # small settings: the claim is about the runtime, not the method's quality
    "standard": {"top_k": 3, "max_new_tokens": 24},
    "speculative-rag": {"top_k": 4, "drafts": 2, "docs_per_draft": 2, "rationale_max_new_tokens": 8,
                        "answer_max_new_tokens": 16, "batch_invariant": True},
}
# (method, data, questions): the demo set in CI; 64 PopQA questions over the pooled BM25 index
# with `make test-full` (6 and 18 minutes here: three runs each)
CASES = [("standard", "demo", 16), ("speculative-rag", "demo", 6), ("standard", "popqa", 64),
         ("speculative-rag", "popqa", 64)]
PARAMS = [pytest.param(m, d, n, id=f"{m}-{d}-{n}", marks=[pytest.mark.full] if d == "popqa" else [])
          for m, d, n in CASES]
POPQA_SETTINGS = {  # short answers; each query decoded alone, so no answer depends on its batch
    "standard": {"top_k": 3, "max_new_tokens": 8, "batch_invariant": True},
    "speculative-rag": {"top_k": 4, "drafts": 2, "docs_per_draft": 2, "rationale_max_new_tokens": 4,
                        "answer_max_new_tokens": 8, "batch_invariant": True},
}


@pytest.mark.parametrize("method_name, data, n", PARAMS)
def test_same_results_on_every_runner_and_one_model_load_per_process(method_name, data, n, request,
                                                                     job_service, tmp_path):
    if data == "demo":
        table, index, settings = request.getfixturevalue("demo_tables")[0], request.getfixturevalue("demo_index"), \
            METHODS[method_name]
    else:
        table = request.getfixturevalue("imported") / "popqa" / "queries.parquet"
        index, settings = request.getfixturevalue("pooled_bm25"), POPQA_SETTINGS[method_name]
    # several row groups (bundles) and micro-batches
    queries = pq.read_table(table).slice(0, n)
    path = tmp_path / "queries.parquet"
    pq.write_table(pa.Table.from_batches(queries.to_batches(max_chunksize=4)), path, row_group_size=4)
    method = create_method(method_name, **settings)
    runtime = RuntimeConfig(index_dir=str(index)).with_roles(method.model_roles)
    runners = dict(RUNNERS, portable=["--runner=PortableRunner", f"--job_endpoint={job_service}",
                                      "--environment_type=LOOPBACK"])
    answers, manifests = {}, {}
    for name, args in runners.items():
        out = tmp_path / name
        manifests[name] = run_answer(AnswerJob(str(path), str(out), method, runtime, beam_args=tuple(args)))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        answers[name] = {r["id"]: (r["answer"], r["raw_output"]) for r in rows}
        assert not list(out.glob("dead_letters-*.parquet")) or not pq.read_table(
            sorted(out.glob("dead_letters-*.parquet"))).num_rows
    ids = set(queries.column("id").to_pylist())
    assert set(answers["fnapi-1"]) == ids
    assert answers["fnapi-2-processes"] == answers["fnapi-1"]
    assert answers["portable"] == answers["fnapi-1"]
    n_models = len(runtime.models)
    for name, manifest in manifests.items():
        counters = manifest["counters"]
        assert counters["answered"] == len(ids), name
        # every worker process started one engine and loaded each model once: never per bundle
        # or per DoFn instance (a process that ran no query of this job loads nothing)
        assert 1 <= counters["engines_started"] <= (2 if name == "fnapi-2-processes" else 1), (name, counters)
        assert counters["models_loaded"] <= counters["engines_started"] * n_models, (name, counters)

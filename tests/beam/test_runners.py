"""The same `specrag answer` job on several runner set-ups gives the same results, and each
worker process loads its models once: the FnApiRunner with one worker, with two worker
processes, the PortableRunner against a Beam job service (the Job API that Flink's and Spark's
job servers speak), LOOPBACK environment, and Prism (Beam's portable reference runner, built at
the installed Beam's version by `make install-prism`: its own keyed state, timers and shuffles);
and specrag installed from its sdist in a worker pool of its own (EXTERNAL environment), the
stand-in here for Flink's and Dataflow's workers."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import corpus_jobs, free_port, wait_listening
from specrag.methods import create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.transforms.runtime import RuntimeConfig

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def job_service():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc, "the Beam job service")
    except AssertionError:
        proc.kill()
        raise
    yield f"localhost:{port}"
    proc.terminate()
    proc.wait(timeout=30)


RUNNERS = {
    "fnapi-1": ["--runner=FnApiRunner"],
    "fnapi-2-processes": ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
}

METHODS = {  # small settings: the claim is about the runtime, not the method's quality
    "standard": {"top_k": 3, "max_new_tokens": 24, "batch_invariant": True},  # runners bundle differently
    "speculative-rag": {"top_k": 4, "drafts": 2, "docs_per_draft": 2, "rationale_max_new_tokens": 8,
                        "answer_max_new_tokens": 16, "batch_invariant": True},
}
# (method, data, questions): the demo set in CI; 64 PopQA questions over the pooled BM25 index
# with `make test-full` (6 and 18 minutes here: three runs each)
CASES = [("standard", "demo", 8), ("speculative-rag", "demo", 4), ("standard", "popqa", 64),
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
                                                                     job_service, prism, tmp_path):
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
    runners = dict(RUNNERS)
    if method_name == "standard" or data != "demo":  # the job service's path does not depend on the method
        runners["portable"] = ["--runner=PortableRunner", f"--job_endpoint={job_service}", "--environment_type=LOOPBACK"]
    runners["prism"] = ["--runner=PrismRunner", f"--prism_location={prism}"]  # fan-out and keyed re-join too
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
    assert answers.get("portable", answers["fnapi-1"]) == answers["fnapi-1"]
    assert answers["prism"] == answers["fnapi-1"]
    n_models = len(runtime.models)
    for name, manifest in manifests.items():
        counters = manifest["counters"]
        assert counters["answered"] == len(ids), name
        # every worker process started one engine and loaded each model once: never per bundle
        # or per DoFn instance (a process that ran no query of this job loads nothing)
        assert 1 <= counters["engines_started"] <= (2 if name == "fnapi-2-processes" else 1), (name, counters)
        assert counters["models_loaded"] <= counters["engines_started"] * n_models, (name, counters)
        assert counters.get("engine_start_ms", 0) > 0 or not counters["models_loaded"], (name, counters)


@pytest.fixture(scope="module")
def sdist_worker_pool(tmp_path_factory):
    """A Beam worker pool (EXTERNAL environment) running specrag installed from its sdist into
    a new virtual environment, started in a folder of its own: what a Flink task manager's or a
    Dataflow worker's Python sees. The environment has no specrag but the sdist's; the packages
    specrag depends on (torch, Beam, the model packages) come from this environment's
    site-packages through a path file, since the machine installs nothing from the network."""
    import site
    import sysconfig
    root = tmp_path_factory.mktemp("worker")
    dist, venv, folder = root / "dist", root / "venv", root / "elsewhere"
    folder.mkdir()
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist), str(REPO)],
                   check=True, capture_output=True, cwd=root)
    [sdist] = dist.glob("specrag-*.tar.gz")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (purelib / "specrag_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")  # no .pth of ours runs
    # the sdist becomes a wheel as pip would make it (with this environment's setuptools: the new
    # one's bundled setuptools has no bdist_wheel), and only that wheel goes into the new one
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", str(dist), str(sdist)], check=True, capture_output=True, cwd=root)
    [wheel] = dist.glob("specrag-*.whl")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, cwd=folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    where = subprocess.run([str(python), "-c", "import specrag.pipelines as p; print(p.__file__)"], check=True,
                           capture_output=True, text=True, cwd=folder, env=env).stdout.strip()
    assert where.startswith(str(purelib)), where  # the sdist's specrag, not the checkout's
    port = free_port()
    # the pool starts each worker through the sdist's launcher, which asks the runner for the
    # job's options; no credentials in the pool's environment
    env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_"))}
    pool = subprocess.Popen([str(venv / "bin" / "specrag-worker"), "pool", f"--port={port}"], cwd=folder, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, pool, "the worker pool")
    yield f"127.0.0.1:{port}"
    pool.terminate()
    pool.wait(timeout=30)


def test_an_sdist_worker_pool_in_another_folder_answers_like_the_fnapi_runner(sdist_worker_pool, job_service,
                                                                             demo_tables, demo_index, tmp_path,
                                                                             monkeypatch):
    """`specrag answer` through the PortableRunner and a local job service onto EXTERNAL workers
    that share neither the launcher's folder nor its Python: relative paths given on the
    launcher reach them made absolute, and the answers equal the FnApiRunner's."""
    from specrag.pipelines.cli import main
    monkeypatch.chdir(tmp_path)
    queries = pq.read_table(demo_tables[0]).slice(0, 8)
    pq.write_table(pa.Table.from_batches(queries.to_batches(max_chunksize=4)), "queries.parquet", row_group_size=4)
    os.symlink(demo_index, "index")
    answer = ["answer", "--queries", "queries.parquet", "--index", "index", "--method", "standard",
              "--set", "top_k=3", "--set", "max_new_tokens=16"]
    assert main([*answer, "--output", "fnapi"]) == 0
    assert main([*answer, "--output", "external", "--runner=PortableRunner", f"--job_endpoint={job_service}",
                 "--environment_type=EXTERNAL", f"--environment_config={sdist_worker_pool}"]) == 0
    rows = {name: {r["id"]: (r["answer"], r["raw_output"])
                   for r in pq.read_table(sorted((tmp_path / name).glob("results-*.parquet"))).to_pylist()}
            for name in ("fnapi", "external")}
    assert len(rows["fnapi"]) == 8 and rows["external"] == rows["fnapi"]
    manifest = json.loads((tmp_path / "external" / "manifest.json").read_text())
    assert manifest["counters"]["answered"] == 8 and str(tmp_path / "queries.parquet") in manifest["inputs"]



def test_external_workers_read_and_write_s3_with_the_options_given_on_the_launcher(sdist_worker_pool, job_service, s3,
                                                                                   demo_tables, demo_index, tmp_path):
    """The queries, the index and the output on S3 (moto), the endpoint and credentials given
    only as the launcher's flags: the pool's workers, with nothing in their environment, get
    them from the runner (specrag-worker) and answer as the FnApiRunner does on local files."""
    from conftest import S3_BUCKET
    from specrag.pipelines.cli import main
    client, flags = s3
    queries = tmp_path / "queries.parquet"
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 6), queries, row_group_size=3)
    client.upload_file(str(queries), S3_BUCKET, "external/queries.parquet")
    for f in demo_index.rglob("*"):
        if f.is_file():
            client.upload_file(str(f), S3_BUCKET, f"external/index/{f.relative_to(demo_index)}")
    # batch-invariant steps: the pool's workers batch other rows together than the local run, and a
    # batch's padding moves a greedy step's floats (without it demo-q02's answer differed on an AVX512 EPYC)
    answer = ["answer", "--method", "standard", "--set", "top_k=3", "--set", "max_new_tokens=12",
              "--set", "batch_invariant=true"]
    assert main([*answer, "--queries", str(queries), "--index", str(demo_index), "--output", str(tmp_path / "local")]) == 0
    out = f"s3://{S3_BUCKET}/external/out"
    assert main([*answer, "--queries", f"s3://{S3_BUCKET}/external/queries.parquet", "--index",
                 f"s3://{S3_BUCKET}/external/index", "--output", out, *flags, "--runner=PortableRunner",
                 f"--job_endpoint={job_service}", "--environment_type=EXTERNAL",
                 f"--environment_config={sdist_worker_pool}"]) == 0
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=S3_BUCKET, Prefix="external/out/")["Contents"]]
    results = [k for k in keys if k.rsplit("/", 1)[1].startswith("results-")]
    assert results and "external/out/manifest.json" in keys
    rows = []
    for k in results:
        client.download_file(S3_BUCKET, k, str(tmp_path / "part.parquet"))
        rows += pq.read_table(tmp_path / "part.parquet").to_pylist()
    local = pq.read_table(sorted((tmp_path / "local").glob("results-*.parquet"))).to_pylist()
    assert {r["id"]: r["answer"] for r in rows} == {r["id"]: r["answer"] for r in local} and len(rows) == 6

LAUNCHER = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from specrag.transforms.runtime import RuntimeConfig, worker_setup

class Hold(beam.DoFn):
    def __init__(self, folder):
        self.folder = folder
    def setup(self):
        worker_setup(RuntimeConfig(models=()))  # what every specrag DoFn's engine does first
        self.engine = ThreadPoolExecutor(1)  # interpreter exit waits for its queued calls: no exit on its own
    def process(self, x):
        with open(os.path.join(self.folder, f"worker-{os.getpid()}"), "w") as f:
            f.write(str(os.getpid()))
        self.engine.submit(time.sleep, 600).result()  # a long model call on the engine's threads
        yield x

opts = PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
with beam.Pipeline(options=opts) as p:
    p | beam.Create([1, 2]) | beam.Reshuffle() | beam.ParDo(Hold(sys.argv[1]))
"""


def _exited(pid: int) -> bool:
    try:  # a re-parented child may stay a zombie until its new parent reaps it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_local_workers_exit_when_the_job_that_launched_them_is_killed(tmp_path):
    from specrag.transforms.worker_guard import is_sdk_worker_process
    assert not is_sdk_worker_process()  # the job's own process is never watched (nohup is on purpose)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list(tmp_path.glob("worker-*")) and time.time() < deadline:
        assert launcher.poll() is None, "the launcher failed before its workers ran"
        time.sleep(0.2)
    workers = [int(f.read_text()) for f in tmp_path.glob("worker-*")]
    assert workers and all(w != launcher.pid for w in workers)
    launcher.kill()  # SIGKILL: no cleanup of its children
    launcher.wait()
    deadline = time.time() + 30
    while not all(_exited(w) for w in workers) and time.time() < deadline:
        time.sleep(0.5)
    alive = [w for w in workers if not _exited(w)]
    for w in alive:
        os.kill(w, 9)
    assert not alive, f"SDK workers {alive} kept running after their launcher was killed"


def test_build_index_on_prism_is_byte_identical(demo_tables, demo_index, prism, tmp_path):
    """build-index (BM25 and exact dense, embedding in the job) on Prism writes the very files the
    FnApiRunner wrote (the demo index): the passages, the BM25 arrays, the vectors and the FAISS
    index; the manifests differ only in their build record (runner, time), and the intermediate
    embedding shards in how many the runner cut."""
    from conftest import assert_same_index
    from specrag.pipelines.build_index import run_build_index
    out = tmp_path / "index"
    run_build_index(str(demo_tables[1]), str(out), ["bm25", "dense"],
                    beam_args=("--runner=PrismRunner", f"--prism_location={prism}"))
    assert_same_index(out, demo_index)


def test_build_datastore_and_extract_triplets_on_prism_equal_the_fnapi_runner(small_corpus, corpus_jobs_on_fnapi,
                                                                              prism, tmp_path):
    """KNN-LM's datastore (keys, values, FAISS file) and the triplet sets come out of Prism byte
    for byte as out of the FnApiRunner, and the invalid row is a dead letter in each job."""
    jobs = corpus_jobs(small_corpus, tmp_path, ("--runner=PrismRunner", f"--prism_location={prism}"))
    reference = corpus_jobs_on_fnapi
    assert reference["datastore_entries"] > 36 * 10 and len(reference["triplets"]) == reference["passages"] == 36
    assert reference["datastore_dead"] == reference["triplets_dead"] == [("notext", "validate")]
    assert "--runner=PrismRunner" in jobs["datastore_runner"]
    assert {k: v for k, v in jobs.items() if k != "datastore_runner"} == \
        {k: v for k, v in reference.items() if k != "datastore_runner"}

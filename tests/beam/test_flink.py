"""specrag's jobs on a real Flink session cluster (deploy/flink: a JobManager and two
TaskManagers of one slot each, from the pinned Maven jars, on 127.0.0.1) through Beam's
FlinkRunner, each TaskManager starting its SDK workers with specrag-worker (PROCESS
environment): answers equal to the FnApiRunner's (batch-invariant settings), RaLMSpec equal to
RaLMSeq token for token, build-index byte-identical, and a TaskManager killed with SIGKILL in
the middle of a job, after which --resume completes the run with every id once; and a watched
folder and a Kafka topic streamed on Flink across a TaskManager kill and a restart."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (assert_stopped_once, corpus_jobs, kafka_sender, load_script, sigint_drains, stream_rows,
                      wait_for)

from specrag.methods import create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.transforms.runtime import RuntimeConfig

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _launch_module():
    return load_script(REPO / "deploy" / "flink" / "launch.py", "specrag_flink_launch")


@pytest.fixture(scope="module")
def flink(tmp_path_factory):
    launch = _launch_module()
    launch.install()  # `make install-flink` did it; a no-op then
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    cluster = launch.Cluster(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=1, env=env)
    cluster.start()
    assert cluster.overview()["flink-version"].startswith(launch.FLINK_VERSION)
    yield cluster
    cluster.stop()
    assert not cluster.scratch.exists()  # its jobs' jars went with it (not left in /tmp)


@pytest.fixture(autouse=True)
def _every_taskmanager_back(request):
    """A test that kills a TaskManager and fails before restarting it leaves the next test the
    cluster it started with (not one slot short: NoResourceAvailableException)."""
    yield
    if "flink" in request.fixturenames:
        cluster = request.getfixturevalue("flink")
        names = [f"taskmanager-{i}" for i in range(1, cluster.taskmanagers + 1)]
        missing = [name for name in names if name not in cluster.processes]
        for name in missing:
            cluster.start_taskmanager(name)
        if missing:
            cluster.wait_for(cluster.taskmanagers)


def kill_a_busy_taskmanager(cluster) -> str:
    """SIGKILL a TaskManager that runs a subtask of the job now (so the job fails), by name."""
    deadline = time.time() + 60
    while not (busy := cluster.busy_taskmanagers()):
        assert time.time() < deadline, "no TaskManager ran a subtask of a running job for 60 s"
        time.sleep(0.2)
    cluster.kill(busy[0])
    return busy[0]


def _queries(table: Path, n: int, folder: Path) -> Path:
    """The first n rows in row groups of 4 (several bundles and micro-batches)."""
    path = folder / "queries.parquet"
    rows = pq.read_table(table).slice(0, n)
    pq.write_table(pa.Table.from_batches(rows.to_batches(max_chunksize=4)), path, row_group_size=4)
    return path


def _results(out: Path) -> dict:
    rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
    assert len(rows) == len({r["id"] for r in rows})  # each id once
    dead = sorted(out.glob("dead_letters-*.parquet"))
    assert not dead or not pq.read_table(dead).num_rows
    return {r["id"]: (r["answer"], r["raw_output"]) for r in rows}


@pytest.mark.parametrize("method_name, settings, n", [
    ("speculative-rag", {"top_k": 4, "drafts": 2, "docs_per_draft": 2, "rationale_max_new_tokens": 8,
                         "answer_max_new_tokens": 16, "batch_invariant": True}, 4),
], ids=["speculative-rag"])
def test_answers_on_flink_equal_the_fnapi_runner(method_name, settings, n, flink, demo_tables, demo_index, tmp_path):
    """Speculative RAG's fan-out into drafts and keyed re-join, on Flink's own shuffles and state
    across two TaskManagers, answers as the FnApiRunner does (standard RAG: the deployment guide's
    command below)."""
    queries = _queries(demo_tables[0], n, tmp_path)
    method = create_method(method_name, **settings)
    runtime = RuntimeConfig(index_dir=str(demo_index)).with_roles(method.model_roles)
    answers, manifests = {}, {}
    for name, args in (("fnapi", ("--runner=FnApiRunner",)), ("flink", tuple(flink.flags()))):
        manifests[name] = run_answer(AnswerJob(str(queries), str(tmp_path / name), method, runtime, beam_args=args))
        answers[name] = _results(tmp_path / name)
    assert len(answers["fnapi"]) == n and answers["flink"] == answers["fnapi"]
    counters = manifests["flink"]["counters"]
    # each SDK worker process loads each model once (Flink may start a stage's workers anew: more
    # engines for Speculative RAG's stages than TaskManagers, never one per bundle)
    assert counters["answered"] == n and counters["models_loaded"] <= counters["engines_started"] * len(runtime.models)
    assert "--runner=FlinkRunner" in manifests["flink"]["beam_args"]


def test_ralmspec_on_flink_equals_ralmseq(flink, demo_tables, demo_index, tmp_path):
    """RaLMSpec with every extra on (prefetch, OS³, asynchronous verification) on Flink gives
    RaLMSeq's output on the FnApiRunner, token for token."""
    queries = _queries(demo_tables[0], 8, tmp_path)
    common = dict(stride=4, max_new_tokens=16, doc_max_tokens=48, query_tokens=32)
    outputs = {}
    for name, extra, args in (("ralmseq", {}, ("--runner=FnApiRunner",)),
                              ("ralmspec", dict(prefetch=True, os3=True, async_verification=True,
                                                sequential_fallback=False), tuple(flink.flags()))):
        method = create_method(name, **common, **extra)
        out = tmp_path / name
        run_answer(AnswerJob(str(queries), str(out), method,
                             RuntimeConfig(index_dir=str(demo_index)).with_roles(method.model_roles),
                             batch_size=4, num_shards=2, beam_args=args))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        outputs[name] = {r["id"]: (r["raw_output"], r["trace"]["output_ids"]) for r in rows}
    assert len(outputs["ralmseq"]) == 8 and outputs["ralmspec"] == outputs["ralmseq"]


# The other answer methods, a few demo questions each, with the resources they read made by the
# corpus jobs (the demo corpus's KNN-LM datastore and triplet sets) and SARDI's denoiser a tiny
# adapted causal LM. One model call a row (max_batch=1): no float depends on what shares a batch,
# so every runner must give the FnApiRunner's tokens.
OTHER_METHODS = {
    "sps": {"top_k": 4, "groups": 2, "candidates": 2, "chunk_tokens": 8, "max_new_tokens": 16},
    "aed-rag": {"predictor": "similarity", "top_k": 3, "m": 2, "ss_max_new_tokens": 12, "max_new_tokens": 12},
    "sardi": {"max_new_tokens": 8, "steps": 8, "passage_words": 24},
    "knnlm": {"k": 8, "max_new_tokens": 12},
}
# the answer methods whose Beam graph is one of those already above (a baseline's, or a variant's
# of a tested one): the same check in the full tier (`make test-full`), out of make test's budget
FULL_TIER_METHODS = {
    "no-retrieval": {"max_new_tokens": 12},
    "knnlm-spec": {"k": 8, "max_new_tokens": 12, "speculation_stride": 3},
    "ar-retrieval": {"every": 4, "top_k": 3, "max_new_tokens": 12},
}


# what of each method's trace the runners must not change beside the answer (no float: an
# embedding batch is wider than one row); its first part is never empty for a query answered
TRACED = {"sps": lambda t: (t["output_ids"], [(s["doc_ids"], s["chosen"]) for s in t["stages"]]),
          "aed-rag": lambda t: (t["passage_ids"], t["chosen_passages"], t["streams"]),
          "sardi": lambda t: ([s["doc_ids"] for s in t["steps"]], t["response"]),
          "knnlm": lambda t: (t["output_ids"],),
          "knnlm-spec": lambda t: (t["output_ids"],),
          "ar-retrieval": lambda t: ([s["doc_ids"] for s in t["steps"]], t["queries"]),
          "no-retrieval": lambda t: (True,)}  # no trace: the answer and raw output only


def _method_runtime(method_name, method, demo_index, corpus_jobs_folder, request) -> RuntimeConfig:
    from specrag.inference import EngineConfig
    extra = {}
    if method_name == "sardi":
        from conftest import adapted_denoiser_folder
        folder = corpus_jobs_folder / "adapted_denoiser"
        if not (folder / "config.json").exists():
            adapted_denoiser_folder(folder, request.getfixturevalue("tiny_llama_folder"))
        extra["models"] = (("denoiser", str(folder)),)
    runtime = RuntimeConfig(index_dir=str(demo_index), datastore_dir=str(corpus_jobs_folder / "datastore"),
                            triplets_dir=str(corpus_jobs_folder / "triplets"), engine=EngineConfig(max_batch=1),
                            **extra)
    return runtime.with_roles(method.model_roles)


@pytest.mark.parametrize("method_name", [*sorted(OTHER_METHODS),
                                         *(pytest.param(m, marks=pytest.mark.full) for m in sorted(FULL_TIER_METHODS))])
def test_every_other_answer_method_on_prism_and_flink_equals_the_fnapi_runner(
        method_name, flink, prism, demo_tables, demo_index, corpus_jobs_on_fnapi, corpus_jobs_folder, request,
        tmp_path):
    """SPS (staged retrieval beside generation), AED-RAG (units scored over passages and their
    triplet sets, fused decoding), SARDI (retrieval inside the denoising loop) and KNN-LM (a
    datastore search each token) answer three demo questions on Prism and on the Flink cluster
    as on the FnApiRunner: the same answers, raw outputs and tokens, documents and choices in
    their traces."""
    rows = [r for r in pq.read_table(demo_tables[0]).to_pylist() if r.get("task_type", "short_form") == "short_form"]
    queries = tmp_path / "queries.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:3]), queries, row_group_size=2)
    method = create_method(method_name, **{**OTHER_METHODS, **FULL_TIER_METHODS}[method_name])
    runtime = _method_runtime(method_name, method, demo_index, corpus_jobs_folder, request)
    runners = {"fnapi": ("--runner=FnApiRunner",), "prism": ("--runner=PrismRunner", f"--prism_location={prism}"),
               "flink": tuple(flink.flags())}
    answers, traced = {}, {}
    for name, args in runners.items():
        manifest = run_answer(AnswerJob(str(queries), str(tmp_path / name), method, runtime, beam_args=args))
        assert manifest["counters"]["answered"] == 3, (name, manifest["counters"])
        answers[name] = _results(tmp_path / name)
        rows = pq.read_table(sorted((tmp_path / name).glob("results-*.parquet"))).to_pylist()
        traced[name] = {r["id"]: TRACED[method_name](r.get("trace") or {}) for r in rows}
    assert len(answers["fnapi"]) == 3 and all(parts[0] for parts in traced["fnapi"].values())
    assert answers["prism"] == answers["fnapi"] and traced["prism"] == traced["fnapi"]
    assert answers["flink"] == answers["fnapi"] and traced["flink"] == traced["fnapi"]


def test_the_clusters_temporary_files_are_in_its_folder(flink):
    """Each TaskManager's working folder, which keeps every job's jars, is in the cluster's
    scratch folder, which `stop` removes (the fixture checks that)."""
    assert sorted(p.name for p in flink.scratch.glob("tm_*")) == ["tm_taskmanager-1", "tm_taskmanager-2"]


def test_build_index_on_flink_is_byte_identical(flink, demo_tables, demo_index, tmp_path):
    """build-index (BM25 and exact dense, embedding in the job) on Flink writes the very search
    files the FnApiRunner wrote."""
    from conftest import assert_same_index
    from specrag.pipelines.build_index import run_build_index
    out = tmp_path / "index"
    run_build_index(str(demo_tables[1]), str(out), ["bm25", "dense"], beam_args=tuple(flink.flags()))
    assert_same_index(out, demo_index)


def test_build_datastore_and_extract_triplets_on_flink_equal_the_fnapi_runner(flink, small_corpus,
                                                                              corpus_jobs_on_fnapi, tmp_path):
    """KNN-LM's datastore (its last stage builds the FAISS file on one worker from a side input)
    and the triplet sets (RunInference, sharded writes) come out of Flink byte for byte as out
    of the FnApiRunner, the invalid row a dead letter in each."""
    jobs = corpus_jobs(small_corpus, tmp_path, tuple(flink.flags()))
    assert corpus_jobs_on_fnapi["datastore_dead"] == [("notext", "validate")]
    assert "--runner=FlinkRunner" in jobs["datastore_runner"]
    assert {k: v for k, v in jobs.items() if k != "datastore_runner"} == \
        {k: v for k, v in corpus_jobs_on_fnapi.items() if k != "datastore_runner"}


def test_the_deployment_guides_command_survives_a_killed_taskmanager_and_resumes(flink, demo_tables, demo_index,
                                                                                tmp_path):
    """`specrag answer ... $(python deploy/flink/launch.py flags)`, as docs/guide/deployment.md
    writes it, in a shell, against the running cluster; SIGKILL to a TaskManager while the job
    writes its shards: the job fails (its lease is released), the TaskManager comes back, and the
    same command with --resume finishes the run without redoing the finished shards. Every id is
    answered once, as the FnApiRunner answers it (batch-invariant decoding), each worker process
    loading its model once, and no jar shipped with the job."""
    queries = _queries(demo_tables[0], 16, tmp_path)  # 2 shards of 2 written before the kill, 12 rows after
    answer = ["answer", "--queries", str(queries), "--index", str(demo_index), "--method", "standard",
              "--set", "top_k=3", "--set", "max_new_tokens=24", "--set", "batch_invariant=true",
              "--shard-rows", "2"]
    from specrag.pipelines.cli import main
    assert main([*answer, "--output", str(tmp_path / "fnapi")]) == 0
    out = tmp_path / "flink"
    launcher = REPO / "deploy" / "flink" / "launch.py"
    specrag = Path(sys.executable).with_name("specrag")
    # exec: the shell's process becomes specrag's, so a signal or exit code is the job's own
    command = (f"exec {specrag} {' '.join(answer)} --output {out} {{resume}}"
               f"$({sys.executable} {launcher} flags --folder {flink.folder})")
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    # The REST API can still call a TaskManager busy for a moment after its last subtask ends: a kill
    # then lands after its share is done and the job finishes. Such a try is repeated on a fresh
    # folder; a job that survived every kill would fail the test (3 tries).
    for _ in range(3):
        shutil.rmtree(out, ignore_errors=True)
        job = subprocess.Popen(["bash", "-c", command.format(resume="")], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 600
        while len(list(out.glob("results-*.parquet"))) < 2:
            assert job.poll() is None, ("the job ended before a TaskManager could be killed: "
                                        f"{job.stderr.read()[-2000:]}")
            assert time.time() < deadline
            time.sleep(0.2)
        killed = kill_a_busy_taskmanager(flink)
        try:
            code = job.wait(timeout=300)
        finally:
            job.kill()
        flink.start_taskmanager(killed)
        flink.wait_for(2)
        if code != 0:
            break
    assert code != 0  # the job failed with its TaskManager
    assert not (out / "manifest.json").exists()  # written when a run finishes
    done = subprocess.run(["bash", "-c", command.format(resume="--resume ")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed"]["skipped_finished"] >= 4  # the two finished shards' rows were not redone
    assert "--runner=FlinkRunner" in manifest["beam_args"]
    # the cluster's TaskManagers hold Beam's runner: the job server ships none of its 161 jars
    assert "--pipeline_resources_detector_factory_class=specrag.flink.StageNoJars" in manifest["beam_args"]
    counters = manifest["counters"]
    assert counters["models_loaded"] <= counters["engines_started"]  # one model, once per worker process
    assert _results(out) == _results(tmp_path / "fnapi")
    assert len(_results(out)) == 16


def test_a_watched_folder_on_flink_answers_each_query_once_across_a_kill_and_a_restart(flink, demo_tables,
                                                                                          demo_index, tmp_path):
    """`specrag answer --streaming` over a watched folder on Flink, as a user runs it: files are
    answered as they land and a corrupt Parquet file's and a bad JSON line's dead letters are
    written while the job runs; SIGKILL to a TaskManager fails the job (manifest `failed`, lease
    released); `--resume` after the TaskManager is back reads the folder again, skips the ids
    answered, answers the new file, and SIGINT drains it to a `stopped` manifest. Every query is
    answered once, as a batch run of the same rows answers it."""
    from specrag.jobio.run_folder import LEASE_FILE
    rows = pq.read_table(demo_tables[0]).slice(0, 8).select(["id", "question"]).to_pylist()
    incoming, out = tmp_path / "incoming", tmp_path / "out"
    incoming.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:3]), incoming / "early.parquet")
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    answer = [sys.executable, "-m", "specrag.pipelines.cli", "answer", "--streaming", "--queries", f"{incoming}/",
              "--output", str(out), "--index", str(demo_index), "--method", "retrieve-only", "--poll-interval", "0.5",
              "--window", "5", "--stop-after", "900", *flink.flags()]
    job = subprocess.Popen(answer, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(stream_rows(out, "results")) == 3, job, "the first file's results")
        (incoming / "more.jsonl").write_text(json.dumps(rows[3]) + "\nnot json\n")
        (incoming / "broken.parquet").write_bytes(b"PAR1 this is not a Parquet file")
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 2, job, "the dead letters, while the job runs")
        wait_for(lambda: len(stream_rows(out, "results")) == 4, job, "the JSON file's good row")
        killed = kill_a_busy_taskmanager(flink)
        assert job.wait(timeout=300) != 0  # the job fails with its TaskManager
    finally:
        job.kill()
    failed = json.loads((out / "manifest.json").read_text())
    assert failed["status"] == "failed" and failed["error"] and not (out / LEASE_FILE).exists()
    assert sorted(d["stage"] for d in stream_rows(out, "dead_letters")) == ["read", "read"]

    flink.start_taskmanager(killed)
    flink.wait_for(2)
    pq.write_table(pa.Table.from_pylist(rows[4:] + rows[:1]), incoming / "late.parquet")  # rows[0] again: skipped
    job = subprocess.Popen([*answer, "--resume"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len({r["id"] for r in stream_rows(out, "results")}) == 8, job, "the new file's results")
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 2, job, "the dead letters, judged again")
        sigint_drains(job)
    finally:
        job.kill()
    assert_no_job_left(flink)
    assert_stopped_once(out, {"results": 8, "duplicated": 0, "dead_letters": 2}, rows, demo_index, tmp_path)


def test_a_kafka_stream_on_flink_answers_each_query_once_across_a_kill_and_a_restart(flink, kafka, demo_tables,
                                                                                       demo_index, tmp_path):
    """`--queries kafka://127.0.0.1:PORT/TOPIC` on Flink (ReadFromKafka through Beam's Java
    expansion service and a Java worker pool; a real broker): messages answered as they arrive,
    corrupt ones dead letters while the job runs; a TaskManager killed fails the job (`failed`);
    `--resume` reads the topic again, skips the answered ids and a message sent twice, answers
    the new ones, and SIGINT drains it to `stopped`: every query once, as a batch run answers it."""
    from specrag.jobio.run_folder import LEASE_FILE
    rows = pq.read_table(demo_tables[0]).slice(0, 6).select(["id", "question"]).to_pylist()
    send = kafka_sender(kafka.bootstrap, "flink-queries")
    send(*(json.dumps(r).encode() for r in rows[:3]), b"not json")
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    answer = [sys.executable, "-m", "specrag.pipelines.cli", "answer", "--streaming",
              "--queries", f"kafka://{kafka.bootstrap}/flink-queries", "--output", str(out),
              "--index", str(demo_index), "--method", "retrieve-only", "--window", "5", *flink.flags(), *kafka.flags()]
    job = subprocess.Popen(answer, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(stream_rows(out, "results")) == 3, job, "the first messages' results", timeout=300)
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 1, job, "the dead letter, while the job runs")
        killed = kill_a_busy_taskmanager(flink)
        assert job.wait(timeout=300) != 0  # the job fails with its TaskManager
    finally:
        job.kill()
    failed = json.loads((out / "manifest.json").read_text())
    assert failed["status"] == "failed" and any(a.startswith("--shutdown_sources_after_idle_ms=") for a in failed["beam_args"])
    assert not (out / LEASE_FILE).exists()

    flink.start_taskmanager(killed)
    flink.wait_for(2)
    send(*(json.dumps(r).encode() for r in rows[3:] + rows[:1]))  # rows[0] again: skipped
    job = subprocess.Popen([*answer, "--resume"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len({r["id"] for r in stream_rows(out, "results")}) == 6, job, "the new messages' results",
                 timeout=300)
        # the topic's two partitions are read in any order: a bad message read after the signal is
        # not admitted (the next run reads it again), so the stop waits for it to be judged again
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 1, job, "the dead letter, judged again")
        sigint_drains(job)
    finally:
        job.kill()
    assert_no_job_left(flink)
    assert_stopped_once(out, {"results": 6, "duplicated": 0, "dead_letters": 1}, rows, demo_index, tmp_path)


def assert_no_job_left(flink) -> None:
    """A stopped streaming job is cancelled on the cluster too (its sources are kept up there, so
    it does not end by itself; Beam's portable cancel alone left it running, slots held)."""
    deadline = time.time() + 30
    while flink.overview()["jobs-running"] and time.time() < deadline:
        time.sleep(0.5)
    assert flink.overview()["jobs-running"] == 0

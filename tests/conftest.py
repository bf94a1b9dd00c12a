"""Shared fixtures: the shared benchmark data, imported tables, demo tables and indexes.

Benchmark data is read from ../shared/data (or $SPECRAG_DATA); a missing folder fails the
tests that need it instead of skipping them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from specrag.inference.engine import ModelBackend  # noqa: E402 (after the offline settings)

REPO = Path(__file__).resolve().parents[1]
PRISM = REPO / ".engines" / "bin" / "prism"  # make install-prism
BEAM_ARGS = ("--runner=FnApiRunner",)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("SPECRAG_DATA", REPO.parent / "shared" / "data"))
    if not (path / "DATA.md").exists():
        pytest.fail(f"benchmark data not found at {path}; set SPECRAG_DATA")
    return path


@pytest.fixture(scope="session")
def imported(data_dir, tmp_path_factory) -> Path:
    from specrag.importers import FORMATS, import_datasets
    out = tmp_path_factory.mktemp("imported")
    import_datasets(data_dir, list(FORMATS), out, pool=True)
    return out


@pytest.fixture
def chromium(tmp_path) -> list[str]:
    """Headless Chromium's command line (Debian's package, which `make test` installs), with a
    fresh profile and the flags that keep it off the network."""
    import shutil
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("headless Chromium is missing: `make test` installs Debian's chromium package")
    return [path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,1400", "--hide-scrollbars"]


@pytest.fixture(scope="session")
def demo_tables(tmp_path_factory):
    from specrag.importers.demo import write_demo_tables
    return write_demo_tables(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def demo_index(demo_tables, tmp_path_factory) -> Path:
    from specrag.pipelines.build_index import run_build_index
    index = tmp_path_factory.mktemp("demo_index")
    run_build_index(str(demo_tables[1]), str(index), ["bm25", "dense"], beam_args=BEAM_ARGS)
    return index


def _pooled_key(corpus: Path, kinds: list[str], vectors: Path | None = None) -> str:
    """What decides an index's content: the corpus, the kinds, the code that writes the index
    files and embeds the passages, and the embedder's weights (not the job around them); with
    committed ``vectors``, their content."""
    import hashlib
    import inspect
    from specrag.inference.local_encoder import LocalEncoder
    from specrag.inference.models import model_identity
    from specrag.pipelines.build_index import embedding_block
    from specrag.retrieval.index import assemble_vectors, finish_index
    from specrag.transforms.model_handler import BlockHandler
    h = hashlib.sha256(corpus.read_bytes())
    h.update(",".join(kinds).encode())
    if vectors is not None:
        h.update(vectors.read_bytes())
    for name in ("base", "bm25", "lucene", "dense"):
        h.update((REPO / "retrieval" / f"{name}.py").read_bytes())
    for obj in (finish_index, assemble_vectors, LocalEncoder, embedding_block, BlockHandler):  # how it embeds
        h.update(inspect.getsource(obj).encode())
    if {"dense", "hnsw", "ivf"} & set(kinds):
        h.update(model_identity("all-minilm-l6-v2").encode())
    return h.hexdigest()[:16]


def _pooled_index(imported: Path, tmp_path_factory, kinds: list[str], only: tuple[str, ...] = (),
                  vectors: Path | None = None) -> Path:
    """Pooled-corpus indexes, cached under a content-hash key (``_pooled_key``). ``vectors``: the
    passages' committed embeddings (``write_golden_vectors``), given to build-index as precomputed
    (its --embeddings), so a fresh machine embeds none of them."""
    import shutil
    from specrag.inference.models import cache_dir
    from specrag.pipelines.build_index import run_build_index
    corpus = imported / "pooled_corpus.parquet"
    if only:  # the pooled corpus restricted to some datasets' passages (same ids, same order)
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        keep = set().union(*(pq.read_table(imported / name / "corpus.parquet", columns=["id"]).column("id").to_pylist()
                             for name in only))
        table = pq.read_table(corpus)
        corpus = imported / f"pooled_{'_'.join(only)}_corpus.parquet"
        pq.write_table(table.filter(pc.is_in(table.column("id"), value_set=pa.array(sorted(keep)))), corpus)
    key = _pooled_key(corpus, kinds, vectors)
    cached = cache_dir() / "test-fixtures" / f"pooled_{'_'.join(kinds)}_{key}"
    with _building(cached):
        if not (cached / ".complete").exists():
            staging = tmp_path_factory.mktemp("pooled_" + "_".join(kinds))
            embeddings = _embeddings_parquet(vectors, tmp_path_factory.mktemp("embeddings")) if vectors else None
            run_build_index(str(corpus), str(staging), kinds, beam_args=BEAM_ARGS, num_threads=2,
                            embeddings=embeddings)
            (staging / ".complete").write_text(str(corpus))
            shutil.rmtree(cached, ignore_errors=True)
            shutil.copytree(staging, cached)
    return cached


GOLDEN = REPO / "tests" / "golden"
POOLED_DENSE_VECTORS = GOLDEN / "pooled_dense" / "vectors.npz"  # ids and float16 MiniLM vectors


def _embeddings_parquet(vectors: Path, folder: Path) -> str:
    """Committed vectors as build-index's precomputed (id, vector) Parquet."""
    import numpy as np
    import pyarrow.parquet as pq
    from specrag.pipelines.build_index import EMBEDDINGS
    with np.load(vectors) as golden:
        ids, matrix = golden["ids"].tolist(), golden["vectors"].astype(np.float32)
    path = folder / "vectors.parquet"
    pq.write_table(pa.Table.from_pydict({"id": ids, "vector": [row.tolist() for row in matrix]}, schema=EMBEDDINGS), path)
    return str(path)


def write_golden_vectors(index: Path, out: Path) -> None:
    """An index's passage vectors (ids, float16: half the bytes, ~3e-4 from float32) as committed."""
    import numpy as np
    import pyarrow.parquet as pq
    ids = pq.read_table(index / "passages.parquet", columns=["id"]).column("id").to_pylist()
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, ids=np.array(ids), vectors=np.load(index / "vectors.npy").astype(np.float16))


@contextlib.contextmanager
def _building(cached: Path):
    """One builder of a cached fixture across the test workers (pytest-xdist processes): the
    others wait for it and reuse its folder instead of building the same thing beside it."""
    import fcntl
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / f".{cached.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def pooled_bm25(imported, tmp_path_factory) -> Path:
    return _pooled_index(imported, tmp_path_factory, ["bm25"])


@pytest.fixture(scope="session")
def pooled_dense(imported, tmp_path_factory) -> Path:
    """Flat, HNSW and IVF indexes of the NQ and PopQA passages of the pooled corpus (~4k), from
    their committed MiniLM vectors: embedding them took 6.5 minutes of a fresh machine's `make
    test`, its longest fixture. test_dense.py's test_committed_vectors_equal_a_fresh_embedding
    embeds a sample again; SPECRAG_WRITE_GOLDEN=1 embeds them all and rewrites the file."""
    kinds, only = ["dense", "hnsw", "ivf"], ("nq", "popqa")
    if os.environ.get("SPECRAG_WRITE_GOLDEN"):
        write_golden_vectors(_pooled_index(imported, tmp_path_factory, kinds, only=only), POOLED_DENSE_VECTORS)
    return _pooled_index(imported, tmp_path_factory, kinds, only=only, vectors=POOLED_DENSE_VECTORS)


@pytest.fixture(scope="session")
def pooled_lucene_index(imported, tmp_path_factory) -> Path:
    return _pooled_index(imported, tmp_path_factory, ["lucene"])


def cached_fixture(name: str, parts: list[bytes], build) -> Path:
    """A fixture folder cached under a content-hash key of ``parts`` (inputs and the code
    that makes it): ``build(folder)`` runs once per key on a machine."""
    import hashlib
    import shutil
    import tempfile
    from specrag.inference.models import cache_dir
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    cached = cache_dir() / "test-fixtures" / f"{name}_{h.hexdigest()[:16]}"
    with _building(cached):
        if not (cached / ".complete").exists():
            staging = Path(tempfile.mkdtemp(prefix=f"{name}-"))
            build(staging)
            (staging / ".complete").write_text(name)
            shutil.rmtree(cached, ignore_errors=True)
            shutil.copytree(staging, cached)
            shutil.rmtree(staging, ignore_errors=True)
    return cached


@pytest.fixture(scope="session")
def generator():
    from specrag.transforms.runtime import load_backend
    return load_backend("local", "smollm2-135m-instruct", 1)


@pytest.fixture(scope="session")
def scorer():
    from specrag.transforms.runtime import load_backend
    return load_backend("local", "gemma3-270m", 1)


@pytest.fixture(scope="session")
def embedder():
    from specrag.transforms.runtime import load_backend
    return load_backend("local", "all-minilm-l6-v2", 1)


@pytest.fixture(scope="session")
def prefix_generator(generator):
    """The session's SmolLM2 weights behind a second backend object with prefix KV reuse
    (blocks of 4 continuation tokens, RaLM's stride); each call gives it a fresh cache
    (``budget`` bytes), as a new worker would have."""
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.prefix_cache import BLOCK_TOKENS, PrefixKVCache
    impl = generator._impl
    clone = object.__new__(type(impl))
    clone.__dict__.update(impl.__dict__)
    clone.config = LocalModelConfig(impl.config.model, prefix_cache_mb=64, prefix_block_tokens=BLOCK_TOKENS)
    clone.stats = dict(impl.stats)
    backend = object.__new__(type(generator))
    backend.__dict__.update(generator.__dict__)
    backend._impl = clone

    def fresh(budget: int = 64 << 20):
        clone.prefix_cache = PrefixKVCache(BLOCK_TOKENS, budget)
        return backend
    return fresh


class StepMemo(ModelBackend):
    """The real generator behind a memo of its batch-invariant greedy steps and next-token states.

    Such a step's output depends only on its request (test_batch_invariant_steps_do_not_depend_
    on_the_batch checks that on the same model), so answering a repeated request from the memo
    gives the very tokens the model would: the ablation runs then pay only for the steps that
    differ (mis-speculated documents), not for the whole generation again.
    """

    def __init__(self, backend):
        self.backend, self.memo, self.name = backend, {}, backend.name
        self.capabilities = backend.capabilities

    def next_token(self, requests):
        todo = list(dict.fromkeys(r for r in requests if r not in self.memo))
        for r, g in zip(todo, self.backend.next_token(todo) if todo else []):
            self.memo[r] = g
        return [self.memo[r] for r in requests]

    @property
    def eos_ids(self):
        return self.backend.eos_ids

    def generate(self, requests):
        if not all(r.batch_invariant and r.temperature == 0 for r in requests):
            raise ValueError("only batch-invariant greedy steps can be memoised")
        todo = list(dict.fromkeys(r for r in requests if r not in self.memo))
        for r, g in zip(todo, self.backend.generate(todo) if todo else []):
            self.memo[r] = g
        return [self.memo[r] for r in requests]

    def tokenize(self, texts):
        return self.backend.tokenize(texts)

    def detokenize(self, ids):
        return self.backend.detokenize(ids)


@pytest.fixture(scope="session")
def step_memo(generator):
    """A fresh StepMemo over the session's generator (call it for one per test)."""
    return lambda: StepMemo(generator)


def tiny_llama_config(vocab_size: int = 49152):
    """A 2-layer Llama of width 16 (SmolLM2's vocabulary size by default): loads in a second."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """A transformers folder of a tiny random Llama with SmolLM2's tokenizer (and chat template):
    a user's own model, for the loading paths (--model ROLE=FOLDER, Triton repositories)."""
    import shutil
    import torch
    from transformers import LlamaForCausalLM
    from specrag.inference.models import materialise
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(folder)
    for f in materialise("smollm2-135m-instruct").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy(f, folder / f.name)
    return folder


def adapted_denoiser_folder(folder, base):
    """A causal LM (here the tiny random Llama) adapted as train-denoiser --base adapts one, untrained."""
    from specrag.inference.ar_denoiser import new_ar_denoiser
    from specrag.training.denoiser import DenoiserReport, DenoiserTrainingConfig, save_trained
    model, tokenizer = new_ar_denoiser(base)
    save_trained(model, tokenizer, DenoiserTrainingConfig(response_tokens=8, max_positions=64), DenoiserReport(),
                 folder, str(base), True, {})
    return folder


def stream_rows(out: Path, kind: str) -> list[dict]:
    """The rows of a streaming run's shards of one kind (``results``, ``dead_letters``)."""
    import pyarrow.parquet as pq
    files = sorted(Path(out).glob(f"{kind}-stream-*.parquet"))
    return pq.read_table(files).to_pylist() if files else []


def wait_for(condition, proc, what: str, timeout: float = 180) -> None:
    """Wait for ``condition()`` while the job process ``proc`` runs; fail with its output if it ends."""
    import time
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"the job ended while waiting for {what}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


def sigint_drains(job, within_s: float = 30) -> None:
    """SIGINT to a streaming job's launcher: it exits 0 within ``within_s`` (drained, stopped)."""
    import signal
    import time
    signalled = time.time()
    job.send_signal(signal.SIGINT)
    code = job.wait(timeout=120)
    assert code == 0, job.stdout.read()[-3000:]
    assert time.time() - signalled < within_s


def assert_stopped_once(out: Path, account: dict, rows: list[dict], index: Path, folder: Path) -> None:
    """A streaming run stopped by SIGINT: manifest ``stopped``, ``account`` as given, the lease and
    the stop marker gone, and each answer equal to a batch retrieve-only run of ``rows``."""
    import json
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.jobio.run_folder import LEASE_FILE
    from specrag.pipelines.cli import main
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped_by"].startswith("SIGINT")
    assert manifest["account"] == account
    assert not (out / LEASE_FILE).exists() and not (out / ".stop").exists()
    pq.write_table(pa.Table.from_pylist(rows), folder / "batch.parquet")
    assert main(["answer", "--queries", str(folder / "batch.parquet"), "--index", str(index),
                 "--method", "retrieve-only", "--output", str(folder / "batch")]) == 0
    batch = pq.read_table(sorted((folder / "batch").glob("results-*.parquet"))).to_pylist()
    assert {r["id"]: r["answer"] for r in stream_rows(out, "results")} == {r["id"]: r["answer"] for r in batch}


def kafka_sender(bootstrap: str, topic: str):
    """send(*messages): each message to ``topic``, flushed."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap)

    def send(*messages: bytes) -> None:
        for message in messages:
            producer.send(topic, message)
        producer.flush()
    return send


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    """A Kafka broker (KRaft), Beam's Kafka expansion service and a Java worker pool on
    127.0.0.1, from the pinned jars `make install-flink` resolved (deploy/flink/kafka_services.py)."""
    module = load_script(REPO / "deploy" / "flink" / "kafka_services.py", "specrag_kafka_services")
    module.install()  # `make install-flink` did it; a no-op then
    services = module.Kafka(tmp_path_factory.mktemp("kafka")).start()
    yield services
    services.stop()


@pytest.fixture(scope="session")
def prism() -> str:
    """The Prism binary `make install-prism` built, checked to be the installed Beam's version."""
    import re
    import subprocess

    import apache_beam
    if not PRISM.is_file():
        pytest.fail(f"no Prism binary at {PRISM}: run `make install-prism`")
    info = subprocess.run(["go", "version", "-m", str(PRISM)], capture_output=True, text=True, check=True).stdout
    built = re.search(r"^\s*mod\s+github\.com/apache/beam/sdks/v2\s+(\S+)", info, re.M)
    assert built and built.group(1) == f"v{apache_beam.__version__}", info
    return str(PRISM)


def load_script(path: Path, name: str):
    """A script of the repository (a benchmark, a deploy launcher: not a package) as a module. Its
    folder is on sys.path while it loads (its own imports, e.g. ``workloads``) and off again after,
    so a folder named like a real package (deploy/vllm) shadows nothing; the module is registered
    under ``name`` (a dataclass looks its module up there)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    saved = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the tests' servers bind nothing else)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, process, what: str, timeout_s: float = 60) -> None:
    """Wait until ``process`` listens on 127.0.0.1:``port``; fail in one line if it exits or is slow."""
    import socket
    import time
    deadline = time.time() + timeout_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert process.poll() is None and time.time() < deadline, f"{what} did not start"
        time.sleep(0.2)


def assert_same_index(built: Path, reference: Path) -> None:
    """``built`` has the very files search reads that ``reference`` has (passages, BM25 arrays,
    vectors, FAISS index: the embeddings' shards are the runner's to cut), and the manifests
    differ only in their build record (runner, time)."""
    import json

    from specrag.transforms.runtime import manifest_fingerprint

    def content(folder):
        return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and
                      (p.parent.name in ("bm25", "dense") or p.name in ("passages.parquet", "vectors.npy")))
    files = content(reference)
    assert len(files) >= 9 and files == content(built)
    for name in files:
        assert (built / name).read_bytes() == (reference / name).read_bytes(), name
    assert manifest_fingerprint(json.loads((built / "manifest.json").read_text())) == \
        manifest_fingerprint(json.loads((reference / "manifest.json").read_text()))


S3_BUCKET = "specrag-test"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free local port, its bucket, and the flags that reach it."""
    import subprocess
    import sys

    import boto3  # the dev extra: boto3 (Beam's S3 filesystem) and moto's server
    from apache_beam.io.filesystems import FileSystems
    port = free_port()
    # its own process: in the test's, its request threads would share one GIL with the jobs
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    wait_listening(port, server, "moto's S3 server")
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="s3cret-testing", region_name="us-east-1")
    client.create_bucket(Bucket=S3_BUCKET)
    flags = [f"--s3_endpoint_url={endpoint}", "--s3_access_key_id=testing",
             "--s3_secret_access_key=s3cret-testing", "--s3_region_name=us-east-1"]
    yield client, flags
    FileSystems.set_options(None)
    server.terminate()
    server.wait()


GCS_BUCKET = "specrag-gcs-test"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A GCS JSON-API server (gcp-storage-emulator, from PyPI) on 127.0.0.1 with a bucket, its
    client, and the flags a job takes. Beam has no option for a GCS endpoint: google-cloud-storage
    reads the emulator's address from STORAGE_EMULATOR_HOST, which is set here for this process
    and the processes it starts (the address of a server, not a credential)."""
    import subprocess
    import sys

    from apache_beam.io.filesystems import FileSystems
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--default-bucket", GCS_BUCKET, "--in-memory", "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, server, "the GCS emulator")
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    client = storage.Client(project="specrag-test", credentials=AnonymousCredentials())
    yield client, ["--project=specrag-test"]
    FileSystems.set_options(None)
    if before is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = before
    server.terminate()
    server.wait()


def corpus_jobs(corpus: Path, out: Path, beam_args: tuple[str, ...]) -> dict:
    """build-datastore (exact kind) and extract-triplets (spaCy rules) over ``corpus`` on the
    runner ``beam_args`` names; what a runner must not change: the datastore's keys, values and
    FAISS file byte for byte, the triplet sets, and the dead letters (id, stage)."""
    import json

    import pyarrow.parquet as pq

    from specrag.pipelines.build_datastore import run_build_datastore
    from specrag.pipelines.extract_triplets import ExtractJob, run_extract_triplets
    from specrag.retrieval.triplets import TripletStore
    from specrag.transforms.triplets import ExtractorConfig
    datastore = out / "datastore"
    job = run_build_datastore(str(corpus), str(datastore), max_tokens=48, kinds=("flat",), beam_args=beam_args)
    triplets = out / "triplets"
    extracted = run_extract_triplets(ExtractJob(str(corpus), str(triplets), ExtractorConfig(), batch_size=8,
                                                beam_args=beam_args))

    def dead(folder):
        return sorted((r["id"], r["stage"]) for f in sorted(folder.glob("dead_letters*.parquet"))
                      for r in pq.read_table(f).to_pylist())
    return {"datastore": {name: (datastore / name).read_bytes() for name in ("keys.npy", "values.npy", "flat.faiss")},
            "datastore_entries": json.loads((datastore / "manifest.json").read_text())["entries"],
            "datastore_dead": dead(datastore), "datastore_runner": job["beam_args"],
            "triplets": TripletStore.open(str(triplets)).sets, "triplets_dead": dead(triplets),
            "passages": extracted["passages"]}


@pytest.fixture(scope="session")
def small_corpus(demo_tables, tmp_path_factory) -> Path:
    """The demo corpus (36 passages) and one invalid row (no text): a dead letter in every job."""
    import pyarrow.parquet as pq
    rows = pq.read_table(demo_tables[1]).to_pylist() + [{"id": "notext", "title": "Broken", "text": None}]
    path = tmp_path_factory.mktemp("small_corpus") / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=8)
    return path


@pytest.fixture(scope="session")
def corpus_jobs_folder(tmp_path_factory) -> Path:
    """Where `corpus_jobs_on_fnapi` writes: its datastore/ and triplets/ of the demo corpus serve
    the KNN-LM and AED-RAG answer jobs of the runner tests."""
    return tmp_path_factory.mktemp("corpus_jobs_fnapi")


@pytest.fixture(scope="session")
def corpus_jobs_on_fnapi(small_corpus, corpus_jobs_folder) -> dict:
    """`corpus_jobs` on the FnApiRunner: the reference the other runners must equal."""
    return corpus_jobs(small_corpus, corpus_jobs_folder, BEAM_ARGS)

"""specrag's jobs on gs:// (a GCS JSON-API server from PyPI, gcp-storage-emulator, on 127.0.0.1)
through Beam's own GCS filesystem: build-index, answer and evaluate on the bucket equal the same
jobs on local files, on the FnApiRunner's worker processes and on an EXTERNAL worker pool whose
workers get the job's options from the runner (specrag-worker)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import GCS_BUCKET as BUCKET  # tests/conftest.py, whose `gcs` fixture serves it
from conftest import free_port, wait_listening
from specrag.pipelines.cli import main

pytestmark = pytest.mark.slow


def _download(client, prefix: str, dest: Path) -> Path:
    for blob in client.list_blobs(BUCKET, prefix=prefix):
        target = dest / blob.name[len(prefix):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
    return dest


def _upload(client, folder: Path, prefix: str) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            client.bucket(BUCKET).blob(f"{prefix}/{f.relative_to(folder)}").upload_from_filename(str(f))


def _answers(folder: Path) -> dict:
    rows = [r for f in sorted(folder.glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(rows) == len({r["id"] for r in rows})
    return {r["id"]: r["answer"] for r in rows}


@pytest.fixture(scope="module")
def worker_pool(gcs):
    """specrag-worker's pool from this environment, on 127.0.0.1 (started after the emulator: its
    workers reach it through STORAGE_EMULATOR_HOST, as the launcher does)."""
    port = free_port()
    pool = subprocess.Popen([str(Path(sys.executable).with_name("specrag-worker")), "pool", f"--port={port}"],
                            env=dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, pool, "the worker pool")
    yield f"127.0.0.1:{port}"
    pool.terminate()
    pool.wait(timeout=30)


def test_index_answer_and_evaluate_on_gs_equal_local_runs(gcs, worker_pool, demo_tables, demo_index, tmp_path):
    client, flags = gcs
    queries, corpus = tmp_path / "queries.parquet", demo_tables[1]
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 8), queries, row_group_size=2)
    client.bucket(BUCKET).blob("in/queries.parquet").upload_from_filename(str(queries))
    client.bucket(BUCKET).blob("in/corpus.parquet").upload_from_filename(str(corpus))
    q, c = f"gs://{BUCKET}/in/queries.parquet", f"gs://{BUCKET}/in/corpus.parquet"

    # build-index on the bucket: the passages and the BM25 files are the local build's
    assert main(["build-index", "--corpus", c, "--index", f"gs://{BUCKET}/idx", "--kinds", "bm25", *flags]) == 0
    index = _download(client, "idx", tmp_path / "idx")
    assert pq.read_table(index / "passages.parquet").equals(pq.read_table(demo_index / "passages.parquet"))
    for f in sorted((demo_index / "bm25").iterdir()):
        assert (index / "bm25" / f.name).read_bytes() == f.read_bytes(), f.name

    # answer from the bucket into the bucket, with two worker processes, and through EXTERNAL workers
    answer = ["answer", "--method", "standard", "--set", "top_k=2", "--set", "max_new_tokens=8", "--shard-rows", "2"]
    local = tmp_path / "local"
    assert main([*answer, "--queries", str(queries), "--index", str(demo_index), "--output", str(local)]) == 0
    on_gs = [*answer, "--queries", q, "--index", f"gs://{BUCKET}/idx", *flags]
    assert main([*on_gs, "--output", f"gs://{BUCKET}/out", "--direct_num_workers=2",
                 "--direct_running_mode=multi_processing"]) == 0
    _upload(client, demo_index, "dense-idx")  # the demo index with its dense kind, for the pool's run
    assert main([*answer, "--queries", q, "--index", f"gs://{BUCKET}/dense-idx", *flags,
                 "--output", f"gs://{BUCKET}/external", "--runner=PortableRunner", "--job_endpoint=embed",
                 "--environment_type=EXTERNAL", f"--environment_config={worker_pool}"]) == 0
    whole = _answers(local)
    assert len(whole) == 8
    assert _answers(_download(client, "out", tmp_path / "out")) == whole
    assert _answers(_download(client, "external", tmp_path / "external")) == whole
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counters"]["answered"] == 8 and q in manifest["inputs"]

    # evaluate reads the run and the gold queries from the bucket
    assert main(["evaluate", "--queries", q, "--json", str(tmp_path / "gs.json"), f"gs://{BUCKET}/out", *flags]) == 0
    assert main(["evaluate", "--queries", str(queries), "--json", str(tmp_path / "local.json"), str(local)]) == 0
    timing = lambda k: k == "run" or k.endswith("_s") or "latency" in k  # noqa: E731 (the runs' clocks differ)
    drop = lambda rows: [{k: v for k, v in r.items() if not timing(k)} for r in rows]  # noqa: E731
    assert drop(json.loads((tmp_path / "gs.json").read_text())) == drop(json.loads((tmp_path / "local.json").read_text()))

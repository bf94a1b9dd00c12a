"""specrag's jobs on a real S3 protocol server (moto's, from PyPI, on 127.0.0.1) with Beam's own
S3 options, as a user runs them against a bucket: build-index, answer killed with SIGKILL and
resumed (with worker processes that must get the credentials), evaluate and extract-triplets,
each equal to the same job on local files."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import S3_BUCKET as BUCKET  # tests/conftest.py, whose `s3` fixture serves it
from specrag.pipelines.cli import main

pytestmark = pytest.mark.slow


def _download(client, prefix: str, dest: Path) -> Path:
    for obj in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
        target = dest / obj["Key"][len(prefix):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, obj["Key"], str(target))
    return dest


def _rows(folder: Path, name: str) -> list[dict]:
    return [r for f in sorted(folder.glob(f"{name}-*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_index_answer_resume_evaluate_and_triplets_on_s3_equal_local_runs(s3, demo_tables, demo_index, tmp_path):
    client, flags = s3
    queries, corpus = tmp_path / "queries.parquet", demo_tables[1]
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 12), queries)  # 12 questions: 6 shards of 2
    client.upload_file(str(queries), BUCKET, "in/queries.parquet")
    client.upload_file(str(corpus), BUCKET, "in/corpus.parquet")
    q, c = f"s3://{BUCKET}/in/queries.parquet", f"s3://{BUCKET}/in/corpus.parquet"

    # build-index: the passages and the BM25 index are the local build's
    assert main(["build-index", "--corpus", c, "--index", f"s3://{BUCKET}/idx", "--kinds", "bm25", *flags]) == 0
    index = _download(client, "idx", tmp_path / "idx")
    assert pq.read_table(index / "passages.parquet").equals(pq.read_table(demo_index / "passages.parquet"))
    assert json.loads((index / "manifest.json").read_text())["kinds"].keys() == {"bm25"}

    # answer: killed with SIGKILL while two worker processes (which get the credentials only
    # through the job's options) write shards to the bucket, then --resume
    answer = ["answer", "--method", "standard", "--set", "top_k=2", "--set", "max_new_tokens=6",
              "--shard-rows", "2", "--max-in-flight", "2", "--engine-batch", "2"]
    cli = [sys.executable, "-m", "specrag.pipelines.cli", *answer, "--queries", q, "--index", f"s3://{BUCKET}/idx",
           "--output", f"s3://{BUCKET}/out", *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECRAG_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cli + ["--direct_num_workers=2", "--direct_running_mode=multi_processing"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    written = lambda: [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="out/results-000-")
                       .get("Contents", [])]
    deadline = time.time() + 600
    while time.time() < deadline and len(written()) < 2:
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    n = pq.read_metadata(queries).num_rows
    before = _rows(_download(client, "out", tmp_path / "killed"), "results-000")
    assert 4 <= len(before) < n and not (tmp_path / "killed" / "manifest.json").exists()
    assert main([*cli[3:], "--resume"]) == 0
    resumed_dir = _download(client, "out", tmp_path / "resumed")
    manifest = json.loads((resumed_dir / "manifest.json").read_text())
    assert manifest["resumed"]["skipped_finished"] == len(before)  # finished work was not redone
    assert "s3cret-testing" not in (resumed_dir / "manifest.json").read_text()  # no secret in the bucket
    # the launcher fingerprinted the input by the store's checksum, without reading it
    assert manifest["inputs"][q].keys() == {"checksum", "size", "rows"} and manifest["inputs"][q]["checksum"][:3] == "s3:"

    local = tmp_path / "local"
    assert main([*answer, "--queries", str(queries), "--index", str(demo_index), "--output", str(local)]) == 0
    resumed, whole = _rows(resumed_dir, "results"), {r["id"]: r["answer"] for r in _rows(local, "results")}
    assert len(resumed) == len({r["id"] for r in resumed}) == n  # each id once
    assert {r["id"]: r["answer"] for r in resumed} == whole

    # evaluate reads the run and the gold queries from the bucket
    assert main(["evaluate", "--queries", q, "--json", str(tmp_path / "s3.json"), f"s3://{BUCKET}/out", *flags]) == 0
    assert main(["evaluate", "--queries", str(queries), "--json", str(tmp_path / "local.json"), str(local)]) == 0
    s3_rows, local_rows = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("s3", "local"))
    timing = lambda k: k == "run" or k.endswith("_s") or "latency" in k  # noqa: E731 (the runs' clocks differ)
    drop = lambda rows: [{k: v for k, v in r.items() if not timing(k)} for r in rows]  # noqa: E731
    assert drop(s3_rows) == drop(local_rows)

    # extract-triplets: the same triplet sets as over the local corpus
    extract = ["extract-triplets", "--max-chars", "400"]
    assert main([*extract, "--corpus", c, "--output", f"s3://{BUCKET}/triplets", *flags]) == 0
    assert main([*extract, "--corpus", str(corpus), "--output", str(tmp_path / "triplets")]) == 0
    key = lambda r: (r["passage_id"], r["head"], r["relation"], r["tail"])
    ours = _rows(_download(client, "triplets", tmp_path / "s3-triplets"), "triplets")
    assert ours and sorted(map(key, ours)) == sorted(map(key, _rows(tmp_path / "triplets", "triplets")))

"""`specrag answer --streaming --queries kafka://HOST:PORT/TOPIC` against a real broker (KRaft,
from the pinned Maven jars; deploy/flink/kafka_services.py), read by Beam's ReadFromKafka through
Beam's Java expansion service and a Java worker pool, the Python stages on Prism. Messages are
answered as they arrive, bad ones are dead letters written with their window, a kill -9 of the
whole job and a `--resume` answer each query once, SIGINT drains the job to `stopped`."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow


def _rows(out: Path, kind: str) -> list[dict]:
    files = sorted(out.glob(f"{kind}-stream-*.parquet"))
    return pq.read_table(files).to_pylist() if files else []


def _wait(condition, proc, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"the job ended while waiting for {what}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


def test_a_kafka_stream_answers_each_query_once_across_a_kill_and_a_restart(kafka, prism, demo_tables, demo_index,
                                                                            tmp_path):
    from kafka import KafkaProducer
    from specrag.jobio.run_folder import LEASE_FILE
    from specrag.pipelines.cli import main
    rows = pq.read_table(demo_tables[0]).slice(0, 7).select(["id", "question"]).to_pylist()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)

    def send(*messages: bytes) -> None:
        for message in messages:
            producer.send("queries", message)
        producer.flush()

    send(*(json.dumps(r).encode() for r in rows[:3]), b"not json", b'["not", "an object"]')
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECRAG_THREADS="1", OMP_NUM_THREADS="1")
    answer = [sys.executable, "-m", "specrag.pipelines.cli", "answer", "--streaming",
              "--queries", f"kafka://{kafka.bootstrap}/queries", "--output", str(out), "--index", str(demo_index),
              "--method", "retrieve-only", "--window", "5", "--runner=PrismRunner", f"--prism_location={prism}",
              *kafka.flags()]
    # its own process group: the kill takes the launcher, Prism and the workers at once
    job = subprocess.Popen(answer, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        _wait(lambda: len(_rows(out, "results")) == 3, job, "the first messages' results")
        _wait(lambda: len(_rows(out, "dead_letters")) == 2, job, "the dead letters, while the job runs")
        send(json.dumps(rows[3]).encode())
        _wait(lambda: len(_rows(out, "results")) == 4, job, "a message sent while the job runs")
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert sorted(d["message"].split(" (")[0] for d in _rows(out, "dead_letters")) == [
        "message is not JSON", "message is not a JSON object"]

    send(*(json.dumps(r).encode() for r in rows[4:] + rows[:1]))  # rows[0] again: skipped
    job = subprocess.Popen([*answer, "--resume"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        _wait(lambda: len({r["id"] for r in _rows(out, "results")}) == 7, job, "the new messages' results")
        signalled = time.time()
        job.send_signal(signal.SIGINT)
        code = job.wait(timeout=120)
        log = job.stdout.read()
        (tmp_path / "resumed.log").write_text(log)
        assert code == 0, log[-3000:]
        assert time.time() - signalled < 30  # drained: what was admitted is written, then the job is cancelled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped_by"].startswith("SIGINT")
    assert manifest["account"] == {"results": 7, "duplicated": 0, "dead_letters": 2}
    assert not (out / LEASE_FILE).exists() and not (out / ".stop").exists()
    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows), batch)
    assert main(["answer", "--queries", str(batch), "--index", str(demo_index), "--method", "retrieve-only",
                 "--output", str(tmp_path / "batch")]) == 0
    assert {r["id"]: r["answer"] for r in _rows(out, "results")} == {
        r["id"]: r["answer"] for r in pq.read_table(sorted((tmp_path / "batch").glob("results-*.parquet"))).to_pylist()}


def test_a_kafka_address_is_checked_at_start(tmp_path):
    from specrag.pipelines.streaming import check_streaming_input
    from specrag.transforms.streams import kafka_source
    assert kafka_source("kafka://127.0.0.1:9092,127.0.0.1:9093/a,b?max.poll.records=5") == (
        {"bootstrap.servers": "127.0.0.1:9092,127.0.0.1:9093", "auto.offset.reset": "earliest",
         "max.poll.records": "5"}, ["a", "b"])
    with pytest.raises(ValueError, match="kafka://HOST:PORT/TOPIC"):
        check_streaming_input("kafka://127.0.0.1:9092/", True, "FlinkRunner", None)
    with pytest.raises(ValueError, match="never ends: pass --streaming"):
        check_streaming_input("kafka://127.0.0.1:9092/q", False, "FlinkRunner", None)
    with pytest.raises(ValueError, match="a Kafka source is a Java transform"):
        check_streaming_input("kafka://127.0.0.1:9092/q", True, "FnApiRunner", None)

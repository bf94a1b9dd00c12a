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

import pyarrow.parquet as pq
import pytest
from conftest import assert_stopped_once, kafka_sender, sigint_drains, stream_rows, wait_for

pytestmark = pytest.mark.slow


def test_a_kafka_stream_answers_each_query_once_across_a_kill_and_a_restart(kafka, prism, demo_tables, demo_index,
                                                                            tmp_path):
    rows = pq.read_table(demo_tables[0]).slice(0, 7).select(["id", "question"]).to_pylist()
    send = kafka_sender(kafka.bootstrap, "queries")

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
        wait_for(lambda: len(stream_rows(out, "results")) == 3, job, "the first messages' results")
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 2, job, "the dead letters, while the job runs")
        send(json.dumps(rows[3]).encode())
        wait_for(lambda: len(stream_rows(out, "results")) == 4, job, "a message sent while the job runs")
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert sorted(d["message"].split(" (")[0] for d in stream_rows(out, "dead_letters")) == [
        "message is not JSON", "message is not a JSON object"]

    send(*(json.dumps(r).encode() for r in rows[4:] + rows[:1]))  # rows[0] again: skipped
    job = subprocess.Popen([*answer, "--resume"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        wait_for(lambda: len({r["id"] for r in stream_rows(out, "results")}) == 7, job, "the new messages' results")
        # the topic's two partitions are read in any order: a bad message read after the signal is
        # not admitted (the next run reads it again), so the stop waits for it to be judged again
        wait_for(lambda: len(stream_rows(out, "dead_letters")) == 2, job, "the dead letters, judged again")
        sigint_drains(job)  # drained: what was admitted is written, then the job is cancelled
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert_stopped_once(out, {"results": 7, "duplicated": 0, "dead_letters": 2}, rows, demo_index, tmp_path)


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

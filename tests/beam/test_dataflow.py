"""Dataflow, as far as it goes offline: Beam's own Dataflow runner builds the job that Dataflow
would run for `specrag answer` and `build-index` — the pipeline staged (pipeline.pb, under
--staging_location on the GCS emulator), the job's description written as a classic template
(--template_location) — with no Google Cloud project and nothing submitted. The test reads what
Dataflow would get: the worker image the Dockerfile builds on, at the installed Beam's version;
specrag's options among the ones every worker receives; the keyed stateful steps in the graph."""
import json
import re
import sys
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

from conftest import GCS_BUCKET as BUCKET  # tests/conftest.py, whose `gcs` fixture serves it
from specrag.pipelines.cli import main

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _worker_image() -> str:
    """The Beam SDK image deploy/beam/Dockerfile builds specrag's worker on (its last FROM)."""
    return re.findall(r"^FROM (\S+)", (REPO / "deploy" / "beam" / "Dockerfile").read_text(), re.M)[-1]


def _stateful_steps(client, options: dict) -> list[str]:
    """The staged pipeline's transforms that keep per-key state or set timers."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2
    url = options["pipelineUrl"]
    name = url.split(f"{BUCKET}/", 1)[1]
    pipeline = beam_runner_api_pb2.Pipeline.FromString(client.bucket(BUCKET).blob(name).download_as_bytes())
    steps = []
    for t in pipeline.components.transforms.values():
        if t.spec.urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            if payload.state_specs or payload.timer_family_specs:
                steps.append(t.unique_name)
    return sorted(steps)


def test_answer_and_build_index_are_built_as_dataflow_jobs_offline(gcs, demo_tables, tmp_path, capsys):
    client, flags = gcs
    image = _worker_image()
    assert image == f"apache/beam_python{sys.version_info.major}.{sys.version_info.minor}_sdk:{beam.version.__version__}"
    queries = tmp_path / "queries.parquet"
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 4), queries)
    client.bucket(BUCKET).blob("df/queries.parquet").upload_from_filename(str(queries))
    client.bucket(BUCKET).blob("df/corpus.parquet").upload_from_filename(str(demo_tables[1]))
    q, c, idx = (f"gs://{BUCKET}/df/queries.parquet", f"gs://{BUCKET}/df/corpus.parquet", f"gs://{BUCKET}/df/idx")
    assert main(["build-index", "--corpus", c, "--index", idx, "--kinds", "bm25", *flags]) == 0  # what answer reads
    dataflow = ["--runner=DataflowRunner", "--project=specrag-test", "--region=europe-west1",
                f"--temp_location=gs://{BUCKET}/tmp", f"--staging_location=gs://{BUCKET}/staging", "--no_auth",
                "--sdk_location=container", f"--sdk_container_image={image}"]
    capsys.readouterr()

    out = f"gs://{BUCKET}/df/out"
    assert main(["answer", "--queries", q, "--index", idx, "--method", "speculative-rag", "--set", "top_k=4",
                 "--output", out, *dataflow, f"--template_location={tmp_path / 'answer.json'}"]) == 0
    assert "wrote the Dataflow template of this answer job" in capsys.readouterr().out
    assert not list(client.list_blobs(BUCKET, prefix="df/out"))  # nothing ran, no lease was taken
    job = json.loads((tmp_path / "answer.json").read_text())
    env = job["environment"]
    assert job["type"] == "JOB_TYPE_BATCH"
    assert {i["containerImage"] for pool in env["workerPools"] for i in pool["sdkHarnessContainerImages"]} == {image}
    options = env["sdkPipelineOptions"]["options"]
    assert options["method"] == "speculative-rag" and options["index"] == idx and options["output"] == out
    assert options["set"] == ["top_k=4"] and options["queries"] == q  # specrag's own options reach every worker
    # the keyed joins: Select gathers a query's scored drafts (state, and a timer for drafts that never come)
    stateful = _stateful_steps(client, options)
    assert any(s.startswith("Select") for s in stateful), stateful

    assert main(["build-index", "--corpus", c, "--index", f"gs://{BUCKET}/df/idx2", "--kinds", "bm25,dense",
                 *dataflow, f"--template_location={tmp_path / 'index.json'}"]) == 0
    assert not list(client.list_blobs(BUCKET, prefix="df/idx2"))
    job = json.loads((tmp_path / "index.json").read_text())
    options = job["environment"]["sdkPipelineOptions"]["options"]
    assert options["kinds"] == "bm25,dense" and options["corpus"] == c
    from apache_beam.portability.api import beam_runner_api_pb2
    url = options["pipelineUrl"].split(f"{BUCKET}/", 1)[1]
    names = {t.unique_name for t in beam_runner_api_pb2.Pipeline.FromString(
        client.bucket(BUCKET).blob(url).download_as_bytes()).components.transforms.values()}
    assert {"Embed", "EmbeddingBlocks", "FinishIndex", "WritePassages"} <= {n.split("/")[0] for n in names}

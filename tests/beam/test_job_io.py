"""Job I/O through Beam's FileSystems (a test scheme stands in for gs:// and s3://), corrupt
inputs and strict options; a run killed with SIGKILL that --resume completes is in
test_object_store.py (on S3, against an uninterrupted local run)."""
import hashlib
import json
import shutil
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.evaluation.report import evaluate_run
from specrag.methods import MethodConfig, create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.pipelines.cli import main
from specrag.schemas import QUERIES
from specrag.jobio.files import UnreadableInput
from specrag.transforms.runtime import RuntimeConfig

import remotefs  # the specragtest:// scheme (tests/remotefs.py)
from echo_method import Echo  # tests/echo_method.py


def _read(folder, name):
    rows = []
    for f in sorted(folder.glob(f"{name}-*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


@pytest.fixture
def remote(tmp_path):
    root = tmp_path / "bucket"
    root.mkdir()
    remotefs.ROOT["path"] = str(root)
    remotefs.CALLS["n"] = 0
    yield root
    remotefs.ROOT["path"] = None


def test_answer_job_on_a_non_local_scheme(remote, demo_tables, demo_index):
    (remote / "in").mkdir()
    shutil.copy(demo_tables[0], remote / "in" / "queries.parquet")
    shutil.copytree(demo_index, remote / "index")
    method = create_method("retrieve-only", top_k=3)
    runtime = RuntimeConfig(index_dir="specragtest://index").with_roles(method.model_roles)
    job = lambda **kw: AnswerJob("specragtest://in/*.parquet", "specragtest://runs/a", method, runtime,
                                 shard_rows=8, **kw)
    manifest = run_answer(job())
    out = remote / "runs" / "a"
    results = _read(out, "results-000")
    n = pq.read_metadata(demo_tables[0]).num_rows
    assert len(results) == n and len({r["id"] for r in results}) == n
    assert len(list(out.glob("results-000-*.parquet"))) == -(-n // 8)  # shards of at most 8 rows
    assert {len(r["retrieved"][0]["doc_ids"]) for r in results} <= {1, 2, 3}  # the index answered
    assert max(len(r["retrieved"][0]["doc_ids"]) for r in results) == 3
    assert json.loads((out / "manifest.json").read_text())["inputs"].keys() == {"specragtest://in/queries.parquet"}
    assert (out / "identity.json").exists() and manifest["counters"]["answered"] == n
    assert remotefs.CALLS["n"] > 0
    report = evaluate_run("specragtest://runs/a", "specragtest://in/*.parquet")
    assert report["coverage"]["answered"] == n and report["coverage"]["duplicate_results"] == 0
    again = run_answer(job(resume=True))  # resume reads the earlier shards through FileSystems
    assert again["resumed"] == {"attempt": 1, "skipped_finished": n}
    assert not list(out.glob("results-001-*.parquet"))


@pytest.mark.slow
def test_build_index_on_a_non_local_scheme_equals_a_local_build(remote, demo_tables, demo_index):
    """The corpus is read, the shards written and the index published through FileSystems
    (embedding through RunInference); the published index searches like the local one."""
    import numpy as np
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    from specrag.transforms.runtime import load_backend
    (remote / "corpus").mkdir()
    shutil.copy(demo_tables[1], remote / "corpus" / "c.parquet")
    manifest = run_build_index("specragtest://corpus/*.parquet", "specragtest://idx", ["bm25", "dense"])
    built = remote / "idx"
    assert json.loads((built / "manifest.json").read_text())["kinds"].keys() == {"bm25", "dense"}
    assert manifest["embedding"] == {"backend": "local", "model": "all-minilm-l6-v2"}
    embed = load_backend("local", "all-minilm-l6-v2", 1).embed
    questions = [q["question"] for q in pq.read_table(demo_tables[0]).to_pylist()[:8]]
    for kind in ("bm25", "dense"):
        ours = open_retriever(built, kind, embed).search(questions, 3)
        local = open_retriever(demo_index, kind, embed).search(questions, 3)
        assert [[h.doc_id for h in hs] for hs in ours] == [[h.doc_id for h in hs] for hs in local]
        np.testing.assert_allclose([h.score for hs in ours for h in hs], [h.score for hs in local for h in hs],
                                   rtol=1e-5)


def test_corrupt_parquet_is_an_error_naming_the_file_or_one_dead_letter(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "first"}, {"id": "b", "question": "second"}],
                                        schema=QUERIES), tmp_path / "part-0.parquet")
    (tmp_path / "part-1.parquet").write_bytes(b"PAR1 this is not parquet at all")
    job = lambda **kw: AnswerJob(str(tmp_path / "part-*.parquet"), str(tmp_path / "out"), Echo(MethodConfig()),
                                 RuntimeConfig(models=()), **kw)
    with pytest.raises(UnreadableInput, match=r"part-1\.parquet: not a readable Parquet file"):
        run_answer(job())
    run_answer(job(bad_files="dead-letter"))
    assert sorted((r["id"], r["answer"]) for r in _read(tmp_path / "out", "results")) == [("a", "FIRST"), ("b", "SECOND")]
    [dead] = _read(tmp_path / "out", "dead_letters")
    assert dead["stage"] == "read" and dead["error_type"] == "UnreadableInput" and "part-1.parquet" in dead["message"]


def test_cli_rejects_unknown_flags_and_mistyped_settings(tmp_path, capsys):
    path = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "q"}], schema=QUERIES), path)
    base = ["answer", "--queries", str(path), "--output", str(tmp_path / "o"), "--method", "standard"]
    assert main(base + ["--set", "top_k=abc"]) == 2
    assert "--set top_k=abc: top_k expects an integer, got 'abc'" in capsys.readouterr().err
    assert main(base + ["--set", "topk=3"]) == 2
    assert "has no setting 'topk'" in capsys.readouterr().err
    assert main(base + ["--batchsize=4"]) == 2
    assert "unknown option(s) --batchsize (did you mean --batch-size?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the stray value names its flag, not "unexpected arguments: ['dense']"
        main(base + ["--retreiver", "dense"])
    assert "unknown option(s) --retreiver (did you mean --retriever?)" in capsys.readouterr().err
    assert main(["answer", "--output", str(tmp_path / "o")]) == 2
    assert "specrag answer needs --queries" in capsys.readouterr().err
    assert main(base + ["--model", "generator"]) == 2
    assert "--model expects ROLE=NAME" in capsys.readouterr().err
    assert main(["build-index", "--corpus", str(path)]) == 2
    assert "specrag build-index needs --index" in capsys.readouterr().err


def test_job_options_are_beam_pipeline_options_that_travel_with_the_job():
    """specrag's flags are PipelineOptions classes: Beam parses them (dashed or underscored),
    they survive the round trip a runner makes of a job's options, and they are checked."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.pipelines.options import unknown_beam_flags
    from specrag.pipelines.options import AnswerOptions, OutputOptions, ReplaceOptions, RuntimeOptions
    flags = ["--queries=q.parquet", "--output", "out", "--max-in-flight=8", "--max_failure_fraction=0.1",
             "--set", "top_k=3", "--model", "generator=gemma3-270m", "--runner=FnApiRunner"]
    assert unknown_beam_flags(flags) == [] and unknown_beam_flags(flags + ["--max-inflight=3"]) == ["--max-inflight=3"]
    options = PipelineOptions(flags)
    answer, runtime = options.view_as(AnswerOptions), options.view_as(RuntimeOptions)
    assert (answer.queries, answer.set) == ("q.parquet", ["top_k=3"])
    assert options.view_as(ReplaceOptions).max_failure_fraction == 0.1
    config = runtime.runtime_config()
    assert config.engine.max_in_flight == 8 and dict(config.models)["generator"] == "gemma3-270m"
    from apache_beam.options.pipeline_options import PortableOptions
    from specrag.pipelines.options import LONG_JOB_TIMEOUT_S, pipeline_options
    # a portable runner reads the job's state stream under --job_server_timeout (300 s by
    # default): a long job would fail although healthy, unless given a deadline that fits
    portable = ["--runner=PortableRunner", "--job_endpoint=localhost:1"]
    assert pipeline_options(portable).view_as(PortableOptions).job_server_timeout == LONG_JOB_TIMEOUT_S
    assert pipeline_options(portable + ["--job_server_timeout=60"]).view_as(PortableOptions).job_server_timeout == 60
    assert pipeline_options(["--runner=FnApiRunner"]).view_as(PortableOptions).job_server_timeout == 300
    travelled = PipelineOptions.from_dictionary(options.get_all_options(drop_default=True))
    assert travelled.view_as(OutputOptions).output == "out"
    assert travelled.view_as(RuntimeOptions).runtime_config() == config


def test_vllm_embed_moves_the_embedder_to_vllm_only_when_asked():
    """--vllm-embed puts the dense retriever's MiniLM on vLLM's pooling runner (and says so in the
    run's identity); without it the embedder runs in the worker; it is an option of --backend vllm."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.inference.vllm import VllmConfig
    from specrag.pipelines.options import RuntimeOptions
    config = lambda *flags: PipelineOptions(list(flags)).view_as(RuntimeOptions).runtime_config()  # noqa: E731
    embedder = "all-minilm-l6-v2"
    assert config("--backend=vllm").backend_for(embedder) == "local"
    on = config("--backend=vllm", "--vllm-embed")
    assert on.settings().config_of(VllmConfig).embed and on.backend_for(embedder) == "vllm"
    assert on.backend_for("smollm2-135m-instruct") == "vllm"
    assert on.identity()["embed_backend"] == "vllm" and "embed_backend" not in config("--backend=vllm").identity()
    with pytest.raises(ValueError, match="--vllm-embed is an option of --backend vllm"):
        config("--vllm-embed")


def test_prefix_reuse_is_on_by_default_on_the_local_backend_and_a_resumed_run_keeps_its_own(tmp_path):
    """Not told, the CLI reuses prefixes on the local backend only (vLLM and Triton keep their
    own caches); a run made without it (its identity has no ``prefill_segments``) resumes
    without it, and ``--prefix-cache-mb`` or ``--overwrite`` decide for themselves."""
    import json
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.pipelines.answer import answer_job_from_flags
    from specrag.pipelines.options import RuntimeOptions
    from specrag.transforms.runtime import default_prefix_cache_mb
    DEFAULT_PREFIX_CACHE_MB = default_prefix_cache_mb("local")
    cache = lambda *flags: PipelineOptions(list(flags)).view_as(RuntimeOptions).runtime_config().prefix_cache_mb  # noqa: E731
    assert (cache(), cache("--backend=vllm"), cache("--prefix-cache-mb=0")) == (DEFAULT_PREFIX_CACHE_MB, 0, 0)
    out = tmp_path / "out"
    base = ["--queries=q.parquet", f"--output={out}", "--resume"]
    assert answer_job_from_flags(base).runtime.prefix_cache_mb == DEFAULT_PREFIX_CACHE_MB  # nothing there yet
    out.mkdir()
    (out / "identity.json").write_text(json.dumps({"method": "standard", "backend": "local"}))
    assert answer_job_from_flags(base).runtime.prefix_cache_mb == 0
    assert "prefill_segments" not in answer_job_from_flags(base).runtime.identity()
    assert answer_job_from_flags(base + ["--prefix-cache-mb=64"]).runtime.prefix_cache_mb == 64
    assert answer_job_from_flags(base[:2] + ["--overwrite"]).runtime.prefix_cache_mb == DEFAULT_PREFIX_CACHE_MB


def test_secret_options_are_redacted_in_manifests_and_runner_spellings_are_read_from_the_options(tmp_path):
    """Beam's S3/GCS credentials travel as options; no manifest (nor the report, which embeds
    manifests) writes them. The runner is read as Beam parses it, in every spelling."""
    from apache_beam.options.pipeline_options import PortableOptions
    from specrag.pipelines.options import is_portable_runner, pipeline_options
    from specrag.redaction import REDACTED, redact
    assert redact(["--s3_secret_access_key=hunter2", "--s3_access_key_id", "AKID", "--s3_region_name=eu-1",
                   "--gcp-oauth-token", "tok", "--keys=3"]) == [
        f"--s3_secret_access_key={REDACTED}", "--s3_access_key_id", REDACTED, "--s3_region_name=eu-1",
        "--gcp-oauth-token", REDACTED, "--keys=3"]
    assert redact({"api_token": "x", "password": "", "prompt_tokens": 7, "nested": [{"db_password": "p"}]}) == \
        {"api_token": REDACTED, "password": "", "prompt_tokens": 7, "nested": [{"db_password": REDACTED}]}
    pq.write_table(pa.table({"id": ["q1", "q2"], "question": ["Who wrote Hamlet?", "What is H2O?"]}),
                   tmp_path / "q.parquet")
    method = create_method("no-retrieval", max_new_tokens=4)
    secrets = ("--s3_secret_access_key=hunter2", "--s3_access_key_id", "AKIDEXAMPLE")
    run_answer(AnswerJob(str(tmp_path / "q.parquet"), str(tmp_path / "out"), method,
                         RuntimeConfig().with_roles(method.model_roles),
                         beam_args=("--runner=FnApiRunner", *secrets, "--s3_region_name=eu-1")))
    text = (tmp_path / "out" / "manifest.json").read_text()
    assert "hunter2" not in text and "AKIDEXAMPLE" not in text and "eu-1" in text
    assert json.loads(text)["beam_args"][1] == f"--s3_secret_access_key={REDACTED}"
    for spelling in (["--runner=PortableRunner"], ["--runner", "portable"], ["--runner=flink"], ["--runner=prism"],
                     ["--runner=apache_beam.runners.portability.portable_runner.PortableRunner"]):
        options = pipeline_options(spelling)
        assert is_portable_runner(options) and options.view_as(PortableOptions).job_server_timeout > 300, spelling
    assert pipeline_options(["--runner=flink", "--job-server-timeout", "30"]).view_as(PortableOptions).job_server_timeout == 30
    assert not is_portable_runner(pipeline_options(["--runner=FnApiRunner"]))


def test_a_filesystem_that_cannot_be_used_is_an_error_with_its_cause_not_an_empty_match(tmp_path, capsys,
                                                                                       monkeypatch):
    from apache_beam.io.filesystems import FileSystems
    from specrag.jobio.files import match_files
    assert match_files(str(tmp_path / "missing" / "*.parquet")) == []  # nothing there: empty
    from apache_beam.options.value_provider import RuntimeValueProvider
    FileSystems.set_options(None)  # and no options an earlier job of this process left behind
    monkeypatch.setattr(RuntimeValueProvider, "runtime_options", None)
    # without boto3: "Missing boto3 requirement"; with it but no options: "Must provide one of client or options"
    with pytest.raises(OSError, match=r"cannot list s3://b/q.parquet: \w+: (Missing boto3|Must provide one of)"):
        match_files("s3://b/q.parquet")
    # the launcher checks a command's buckets once, without Beam's minutes of retries
    for env in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    answer = ["answer", "--queries", "s3://b/q.parquet", "--output", str(tmp_path / "out"), "--method", "no-retrieval",
              "--s3_region_name=us-east-1"]
    assert main(answer) == 2
    assert "no S3 credentials for bucket 'b': pass --s3_access_key_id" in capsys.readouterr().err
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert main(answer + [f"--s3_endpoint_url=http://127.0.0.1:{closed}", "--s3_access_key_id=a",
                          "--s3_secret_access_key=b"]) == 2
    assert "cannot reach S3 for bucket 'b': Could not connect" in capsys.readouterr().err


def test_flex_template_parameters_become_one_answer_command():
    """Dataflow hands a Flex Template one value per parameter; the entry point turns them into the
    `specrag answer` flags (repeatable ones from lists), and every parameter is an answer option."""
    from pathlib import Path
    from conftest import load_script
    from specrag.pipelines.options import JOB_OPTIONS
    folder = Path(__file__).resolve().parents[2] / "deploy" / "beam" / "flex_template"
    entry = load_script(folder / "main.py", "flex_main")
    assert entry.answer_argv(["--queries=gs://b/q/*.parquet", "--output=gs://b/out", "--settings=top_k=10, max_new_tokens=64",
                              "--models=generator=gemma3-270m", "--resume=true", "--overwrite=false"]) == [
        "answer", "--queries=gs://b/q/*.parquet", "--output=gs://b/out", "--set=top_k=10", "--set=max_new_tokens=64",
        "--model=generator=gemma3-270m", "--resume", "--runner=DataflowRunner"]
    with pytest.raises(SystemExit, match="--resume takes true or false"):
        entry.answer_argv(["--resume=yes"])
    import argparse
    parser = argparse.ArgumentParser()
    from apache_beam.options.pipeline_options import StandardOptions
    for cls in (*JOB_OPTIONS["answer"], StandardOptions):
        cls._add_argparse_args(parser)  # noqa: SLF001
    known = {a.dest for a in parser._actions}  # noqa: SLF001
    parameters = json.loads((folder / "metadata.json").read_text())["parameters"]
    assert {p["name"] for p in parameters} - {"settings", "models"} <= known


def test_evaluate_counts_each_id_once_and_refuses_a_folder_without_a_run(tmp_path, capsys):
    rows = [{"id": f"q{i}", "question": f"capital {i}", "answers": [f"CAPITAL {i}" if i % 2 else "other"],
             "task_type": "short_form", "dataset": "toy"} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows, schema=QUERIES), tmp_path / "q.parquet")
    out = tmp_path / "run"
    run_answer(AnswerJob(str(tmp_path / "q.parquet"), str(out), Echo(MethodConfig()), RuntimeConfig(models=())))
    [shard] = out.glob("results-000-*.parquet")
    shutil.copy(shard, out / "results-001-from-a-second-writer.parquet")  # every id twice
    report = evaluate_run(str(out), str(tmp_path / "q.parquet"))
    [row] = report["rows"]
    assert row["n"] == 6 and row["contains"] == 50.0  # not n=12
    assert report["coverage"]["duplicate_results"] == 6 and report["coverage"]["answered"] == 6
    assert main(["evaluate", "--queries", str(tmp_path / "q.parquet"), str(out)]) == 0
    assert "6 duplicate results ignored (the first result of each id counts)" in capsys.readouterr().out
    missing = tmp_path / "no-such-run"
    assert main(["evaluate", "--queries", str(tmp_path / "q.parquet"), str(missing)]) == 2
    assert "is not a run of `specrag answer`" in capsys.readouterr().err and not missing.exists()


def test_an_index_folder_is_checked_at_start(demo_index, tmp_path, capsys):
    """A results folder given as --index, or an index whose files were partly deleted, is one
    line at start (it was `error: 'kinds'`, or tracebacks from every worker); an existing index
    is not rebuilt over without --overwrite."""
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "q"}], schema=QUERIES), tmp_path / "q.parquet")
    answer = ["answer", "--queries", str(tmp_path / "q.parquet"), "--method", "standard"]
    results = tmp_path / "results"
    results.mkdir()
    (results / "manifest.json").write_text(json.dumps({"job": "answer", "counters": {}}))
    assert main([*answer, "--index", str(results), "--output", str(tmp_path / "o1")]) == 2
    assert "is not an index folder: its manifest.json is a `specrag answer` manifest" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(demo_index, broken)
    shutil.rmtree(broken / "bm25")
    assert main([*answer, "--index", str(broken), "--output", str(tmp_path / "o2")]) == 2
    assert "lists a 'bm25' index but lacks bm25/" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    # and build-index does not replace an index without --overwrite
    before = sorted(p.name for p in broken.iterdir())
    pq.write_table(pa.Table.from_pylist([{"id": "p", "text": "a passage"}]), tmp_path / "c.parquet")
    assert main(["build-index", "--corpus", str(tmp_path / "c.parquet"), "--index", str(broken)]) == 2
    assert "already holds an index: pass --overwrite to rebuild it" in capsys.readouterr().err
    assert sorted(p.name for p in broken.iterdir()) == before


def test_an_earlier_run_is_kept_without_overwrite_and_resumed_only_with_the_same_inputs(tmp_path):
    table = lambda rows: pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES)  # noqa: E731
    pq.write_table(table([("a", ""), ("b", "   ")]), tmp_path / "blank.parquet")  # both rows dead letters
    pq.write_table(table([("a", "first"), ("b", "second")]), tmp_path / "q.parquet")
    pq.write_table(table([("c", "third")]), tmp_path / "other.parquet")
    job = lambda queries, **kw: AnswerJob(str(tmp_path / queries), str(tmp_path / "out"), Echo(MethodConfig()),  # noqa: E731
                                          RuntimeConfig(models=()), max_failure_fraction=1.0, **kw)
    run_answer(job("blank.parquet"))  # no result, two dead letters and a manifest
    with pytest.raises(ValueError, match=r"already holds an earlier run \(dead letters, a manifest\)"):
        run_answer(job("q.parquet"))
    assert len(_read(tmp_path / "out", "dead_letters")) == 2  # nothing was deleted
    run_answer(job("q.parquet", overwrite=True))
    with pytest.raises(ValueError, match="made from other input files"):
        run_answer(job("other.parquet", resume=True))  # would mix two query sets in one folder
    shutil.copy(tmp_path / "q.parquet", tmp_path / "copy.parquet")
    again = run_answer(job("copy.parquet", resume=True))  # the same queries under another name
    assert again["resumed"]["skipped_finished"] == 2
    assert sorted(r["id"] for r in _read(tmp_path / "out", "results")) == ["a", "b"]


def test_a_run_grows_over_more_queries_keeping_the_earlier_answers_only_when_they_are_the_same_rows(tmp_path):
    """--grow-from: a run over the first 2 questions resumed over the first 4 answers only the 2 new
    ones; refused without it, from a file other than the one the run answered, or when an earlier
    question changed in the new input (same id, other text)."""
    table = lambda rows: pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES)  # noqa: E731
    rows = [("a", "one"), ("b", "two"), ("c", "three"), ("d", "four")]
    pq.write_table(table(rows[:2]), tmp_path / "first-2.parquet")
    pq.write_table(table(rows), tmp_path / "first-4.parquet")
    pq.write_table(table([rows[0], ("b", "changed"), *rows[2:]]), tmp_path / "changed.parquet")
    pq.write_table(table(rows[1:3]), tmp_path / "other-2.parquet")
    out = tmp_path / "out"
    job = lambda queries, **kw: AnswerJob(str(tmp_path / queries), str(out), Echo(MethodConfig()),  # noqa: E731
                                          RuntimeConfig(models=()), **kw)
    run_answer(job("first-2.parquet"))
    with pytest.raises(ValueError, match="--grow-from EARLIER_QUERIES when these queries hold the earlier ones"):
        run_answer(job("first-4.parquet", resume=True))
    with pytest.raises(ValueError, match="needs --resume"):
        run_answer(job("first-4.parquet", grow_from=str(tmp_path / "first-2.parquet")))
    with pytest.raises(ValueError, match=r"made from other input files \(2 rows\) than .*other-2.parquet"):
        run_answer(job("first-4.parquet", resume=True, grow_from=str(tmp_path / "other-2.parquet")))
    with pytest.raises(ValueError, match="1 of its rows are not in the new input unchanged \\(first: id 'b'\\)"):
        run_answer(job("changed.parquet", resume=True, grow_from=str(tmp_path / "first-2.parquet")))
    assert sorted(r["id"] for r in _read(out, "results")) == ["a", "b"]  # the refusals touched nothing
    grown = run_answer(job("first-4.parquet", resume=True, grow_from=str(tmp_path / "first-2.parquet")))
    assert grown["resumed"]["skipped_finished"] == 2 and grown["counters"]["answered"] == 2
    assert grown["reconciliation"]["input_rows"] == 4 and grown["reconciliation"]["results"] == 4
    earlier = hashlib.sha256((tmp_path / "first-2.parquet").read_bytes()).hexdigest()
    assert grown["attempts"][-1]["grew_from"] == [{"rows": 2, "sha256": earlier}]  # what the first 2 came from
    results = {r["id"]: r for r in _read(out, "results")}
    assert sorted(results) == ["a", "b", "c", "d"] and results["c"]["answer"] == "THREE"
    again = run_answer(job("first-4.parquet", resume=True))  # now a run over the 4: resumes as any other
    assert again["resumed"]["skipped_finished"] == 4


def test_every_input_row_is_accounted_for_across_resumes(tmp_path):
    """A duplicate id stays a dead letter when its first row was answered earlier; the failure
    share and the reconciliation cover the whole run; a resume with nothing to do keeps both."""
    from specrag.jobio.run_folder import RunFailed
    flag = tmp_path / "failing"
    flag.touch()
    rows = [("a", "one"), ("b", "two"), ("a", "again"), ("c", "  "), ("d", f"fail-while:{flag}")]
    pq.write_table(pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES),
                   tmp_path / "q.parquet")
    out = tmp_path / "out"
    job = lambda **kw: AnswerJob(str(tmp_path / "q.parquet"), str(out), Echo(MethodConfig()),  # noqa: E731
                                 RuntimeConfig(models=()), max_failure_fraction=0.5, **kw)
    with pytest.raises(RunFailed, match=r"3 of 5 input rows ended as dead letters \(60%"):
        run_answer(job())
    first = json.loads((out / "manifest.json").read_text())["reconciliation"]
    assert first == {"input_rows": 5, "results": 2, "dead_letters": 3, "unreadable_files": 0, "lost": 0,
                     "duplicated": 0}
    flag.unlink()
    manifest = run_answer(job(resume=True))  # d is answered now: 2 of 5 fail over the run
    dead = _read(out, "dead_letters")
    assert sorted((r["id"], r["stage"]) for r in dead) == [("a", "validate"), ("c", "validate")]
    assert "duplicate id 'a'" in next(r["message"] for r in dead if r["id"] == "a")
    assert manifest["reconciliation"] == {**first, "results": 3, "dead_letters": 2}
    assert manifest["dead_letter_share"] == 0.4 and manifest["resumed"]["skipped_finished"] == 2
    idle = run_answer(job(resume=True))  # nothing left to do: the run's account is unchanged
    assert idle["reconciliation"] == manifest["reconciliation"] and idle["resumed"]["skipped_finished"] == 3
    assert [a["attempt"] for a in idle["attempts"]] == [0, 1, 2]
    assert [a["counters"].get("answered", 0) for a in idle["attempts"]] == [2, 1, 0]


def test_overwrite_puts_the_earlier_run_back_when_the_new_run_fails(tmp_path):
    """--overwrite with an input that turns out unreadable once the job runs leaves the earlier
    run as it was (results, manifest, identity); a run that succeeds replaces it entirely."""
    table = lambda rows: pa.Table.from_pylist([{"id": i, "question": q} for i, q in rows], schema=QUERIES)  # noqa: E731
    pq.write_table(table([("a", "first"), ("b", "second")]), tmp_path / "q.parquet")
    pq.write_table(table([("c", "third")]), tmp_path / "next.parquet")
    (tmp_path / "bad").mkdir()
    pq.write_table(table([("d", "fourth")]), tmp_path / "bad" / "part-0.parquet")
    (tmp_path / "bad" / "part-1.parquet").write_bytes(b"PAR1 not parquet")
    out = tmp_path / "out"
    job = lambda queries, **kw: AnswerJob(str(tmp_path / queries), str(out), Echo(MethodConfig()),  # noqa: E731
                                          RuntimeConfig(models=()), **kw)
    run_answer(job("q.parquet"))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(UnreadableInput):
        run_answer(job("bad/*.parquet", overwrite=True))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # put back as it was
    assert not list(out.glob(".replaced-*"))
    run_answer(job("next.parquet", overwrite=True))
    assert [r["id"] for r in _read(out, "results")] == ["c"] and not list(out.glob(".replaced-*"))
    assert json.loads((out / "manifest.json").read_text())["counters"]["answered"] == 1


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_runs(demo_tables, demo_index, tmp_path):
    """Two real processes into one folder: the second (a plain run, then a --resume) is refused
    with one line while the first holds the folder's lease; the first answers every id once."""
    import subprocess
    import sys
    import time
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 10), tmp_path / "q.parquet")
    cli = [sys.executable, "-m", "specrag.pipelines.cli", "answer", "--queries", str(tmp_path / "q.parquet"), "--index",
           str(demo_index), "--method", "standard", "--set", "top_k=2", "--set", "max_new_tokens=16",
           "--max-in-flight", "2", "--shard-rows", "2", "--output", str(tmp_path / "out")]  # ~20 s
    first = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "out" / ".lease").exists():
        assert first.poll() is None and time.time() < deadline, first.stderr.read()
        time.sleep(0.05)
    seconds = [subprocess.Popen(cli + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for extra in ([], ["--resume"])]
    for second in seconds:
        assert second.wait(timeout=300) == 2
        error = second.stderr.read()
        assert "is being written by another run" in error, error
    assert first.poll() is None  # the refusals came while the first run was writing
    assert first.wait(timeout=600) == 0, first.stderr.read()
    ids = [r["id"] for r in _read(tmp_path / "out", "results")]
    assert len(ids) == len(set(ids)) == 10
    assert not (tmp_path / "out" / ".lease").exists()  # given back


def test_a_stale_lease_is_taken_over_and_a_lost_lease_stops_commits(tmp_path):
    import socket
    from specrag.jobio.lease import Lease, LeaseHeld, check
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "q"}], schema=QUERIES), tmp_path / "q.parquet")
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess_pid_that_exited()
    (out / ".lease").write_text(json.dumps({"token": "f" * 32, "host": socket.gethostname(), "pid": dead,
                                            "started": 0, "heartbeat": 0}))
    run_answer(AnswerJob(str(tmp_path / "q.parquet"), str(out), Echo(MethodConfig()), RuntimeConfig(models=()),
                         resume=True))  # a killed run's lease: its process is gone
    assert [r["id"] for r in _read(out, "results")] == ["a"] and not (out / ".lease").exists()
    with Lease(str(out)) as lease:
        check(str(out), lease.token)
        (out / ".lease").write_text(json.dumps({"token": "0" * 32, "host": "elsewhere", "pid": 1,
                                                "started": 0, "heartbeat": 9e9}))
        with pytest.raises(LeaseHeld, match="this run's lease was taken over by run 00000000"):
            check(str(out), lease.token)
        with pytest.raises(LeaseHeld, match="is being written by another run 00000000"):
            Lease(str(out)).acquire()


def subprocess_pid_that_exited() -> int:
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_training_command_over_an_earlier_output_behaves_as_answer_does(remote, tmp_path, capsys):
    """A training command's model folder goes through the one job lifecycle (jobio/job_run.py):
    an earlier model is refused without a flag, and --resume is refused where there is no killed
    run to continue; --overwrite is a transaction (a training that fails puts the earlier model
    back and keeps its own files aside); a killed run's checkpoint is continued only with
    --resume and dropped with --overwrite; an object-store --output gets its files as a local one."""
    from specrag.jobio.files import exists, read_parquet
    from specrag.pipelines.training_inputs import DEAD_LETTERS_FILE
    from specrag.training.state import partial_dir
    labels = [{"query_id": "q1", "question": "who?", "answer": "x", "unit": i, "kind": "passage", "unit_id": "p",
               "text": "t", "cppl": c} for i, c in enumerate([1.5, float("nan"), float("inf")])]
    pq.write_table(pa.Table.from_pylist(labels), tmp_path / "labels.parquet")  # 2 of 3 unusable: fails before training
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"the earlier model")
    train = ["train-utility", "--labels", str(tmp_path / "labels.parquet"), "--output"]
    assert main([*train, str(model)]) == 2
    assert "already holds files (a model or its dead letters): pass --overwrite" in capsys.readouterr().err
    assert main([*train, str(model), "--resume"]) == 2
    assert "holds a model and no checkpoint of a killed run to resume" in capsys.readouterr().err
    assert main([*train, str(model), "--overwrite"]) == 1
    assert f"the earlier run is back in {model}" in capsys.readouterr().err
    assert (model / "model.safetensors").read_bytes() == b"the earlier model" and not (model / DEAD_LETTERS_FILE).exists()
    [failed] = model.glob(".failed-*")
    assert (failed / DEAD_LETTERS_FILE).is_file()
    assert not list(model.glob(".replaced-*")) and not (model / ".lease").exists()

    killed = tmp_path / "killed"  # a run killed mid-training: its checkpoint beside the folder
    partial_dir(killed).mkdir(parents=True)
    (partial_dir(killed) / "state.pt").write_bytes(b"a checkpoint")
    assert main([*train, str(killed)]) == 2
    assert f"a killed training run left its checkpoint in {partial_dir(killed)}: pass --resume" in \
        capsys.readouterr().err
    assert main([*train, str(killed), "--resume"]) == 1  # let through: its inputs fail before the checkpoint is read
    assert "2 of 3 label rows cannot be used" in capsys.readouterr().err and partial_dir(killed).is_dir()
    assert main([*train, str(killed), "--overwrite"]) == 1 and not partial_dir(killed).exists()  # trained anew
    stored = "specragtest://models/utility"  # staged on this machine, its files put in the store at the end
    assert main([*train, stored]) == 1
    assert f"the reasons are in {stored}/{DEAD_LETTERS_FILE}" in capsys.readouterr().err
    assert read_parquet(f"{stored}/{DEAD_LETTERS_FILE}").num_rows == 2 and not exists(f"{stored}/.lease")
    assert main([*train, stored]) == 2  # the store's folder holds them: refused as a local one
    assert "already holds files (a model or its dead letters)" in capsys.readouterr().err


def test_build_and_train_commands_refuse_earlier_output_and_fail_on_too_many_bad_rows(tmp_path, capsys):
    """build-index exits 1 when most passages are dead letters (the index is still written);
    train-utility writes unusable label rows as dead letters and trains nothing when they are
    too many; both training commands keep an earlier --output without --overwrite."""
    from specrag.pipelines.cli import main
    from specrag.pipelines.training_inputs import DEAD_LETTERS_FILE
    passages = [{"id": "p1", "title": "T", "text": "a real passage"}] + [{"id": f"b{i}", "title": "T", "text": "  "}
                                                                        for i in range(3)]
    pq.write_table(pa.Table.from_pylist(passages), tmp_path / "corpus.parquet")
    index = tmp_path / "index"
    assert main(["build-index", "--corpus", str(tmp_path / "corpus.parquet"), "--index", str(index),
                 "--max-failure-fraction=0.5"]) == 1
    assert "3 of 4 passages ended as dead letters (75% > --max-failure-fraction 0.5)" in capsys.readouterr().err
    assert (index / "manifest.json").exists()
    labels = [{"query_id": "q1", "question": "who?", "answer": "x", "unit": i, "kind": "passage", "unit_id": "p",
               "text": "t", "cppl": c} for i, c in enumerate([1.5, float("nan"), float("inf")])]
    pq.write_table(pa.Table.from_pylist(labels), tmp_path / "labels.parquet")
    model = tmp_path / "model"
    assert main(["train-utility", "--labels", str(tmp_path / "labels.parquet"), "--output", str(model)]) == 1
    assert "2 of 3 label rows cannot be used (67% > --max-failure-fraction 0.5); nothing was trained" in \
        capsys.readouterr().err
    dead = pq.read_table(model / DEAD_LETTERS_FILE).to_pylist()
    assert [(d["id"], d["message"].split(" got")[0]) for d in dead] == [("q1", "cppl: expected a finite number,")] * 2
    for command in (["train-utility", "--labels", str(tmp_path / "labels.parquet")],
                    ["train-denoiser", "--queries", "q.parquet", "--index", str(index)]):
        assert main([*command, "--output", str(model)]) == 2
        assert "already holds files (a model or its dead letters): pass --overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_stops_a_batch_answer_in_seconds_with_one_line_and_resume_finishes_it(demo_tables, demo_index,
                                                                                      tmp_path):
    """Ctrl-C on a batch `specrag answer` (2026-12-07: Beam printed a 96-line traceback of a
    'RuntimeError: KeyboardInterrupt', and the process then hung for minutes while the engine's
    pools ran their queued model calls): it exits 130 within seconds with one line saying how to
    continue, no traceback, the lease released; --resume answers every question."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    from specrag.jobio.run_folder import LEASE_FILE
    rows = pq.read_table(demo_tables[0]).to_pylist()
    many = [{**r, "id": f"{r['id']}-{i}"} for i in range(2) for r in rows]  # a minute of SmolLM2 on one thread
    pq.write_table(pa.Table.from_pylist(many), tmp_path / "q.parquet")
    out = tmp_path / "out"
    args = ["answer", "--queries", str(tmp_path / "q.parquet"), "--index", str(demo_index), "--output", str(out),
            "--method", "standard", "--threads", "1", "--shard_rows", "1"]
    # SIGINT's default action, whatever this process inherited (a shell's `cmd &` runs pytest with
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler in the job)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "specrag"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 300
        while not list(out.glob("results-*.parquet")) and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        waited = time.time() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    output = proc.stdout.read()
    assert code == 130 and waited < 30, (code, waited, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("specrag answer: interrupted") and "--resume" in last, last
    assert "(interrupted)" in output.strip().splitlines()[-2], output[-3000:]  # the progress line's why
    assert not (out / LEASE_FILE).exists()
    assert main([*args, "--resume"]) == 0
    assert sorted(r["id"] for r in _read(out, "results")) == sorted(r["id"] for r in many)

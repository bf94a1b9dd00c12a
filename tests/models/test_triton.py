"""Triton: wire protocol, the model repository, and a real server against the local backend.

The server is the real tritonserver bundled in nvidia-pytriton, installed into its own
venv by the project's launcher (deploy/triton/launch.py) and started per test session.
If it cannot start the tests fail with its log; they never skip.

Equality with the local backend: text and token ids are exact. Floats (logprobs,
embeddings) are bit-equal when the server runs a row alone (as the local call does) and
within 1e-4 when Triton's dynamic batcher groups it with others — a batched matmul sums in
another order, as in the local backend's own batched calls.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_script

from specrag.inference.triton_protocol import OPS, decode_requests, decode_results, encode_requests, encode_results
from specrag.inference.types import (FusedDecodeRequest, GenerateRequest, Generation, RerankRequest, ScoreRequest,
                                     Scored)

REPO = Path(__file__).resolve().parents[2]
BEAM_ARGS = ("--runner=FnApiRunner",)


launch = load_script(REPO / "deploy" / "triton" / "launch.py", "specrag_triton_launch")


def _start(tmp_path: Path, repo: Path = REPO / "model_repo", **kwargs):
    """Start a real server; a failure fails the test with the server's log."""
    try:
        venv = launch.install()
        return launch.TritonServer(repo, venv, log_path=tmp_path / "tritonserver.log", **kwargs).start()
    except launch.TritonStartError as e:
        pytest.fail(f"Triton server did not start:\n{e}")


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory):
    server = _start(tmp_path_factory.mktemp("triton"))
    yield server
    server.stop()


def _backend(server, model, **kw):
    from specrag.inference.triton import TritonBackend, TritonConfig
    return TritonBackend(model, TritonConfig(server.grpc_url, **kw))


def _metric(server, name: str, model: str) -> float:
    m = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', server.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def _questions(demo_tables, n: int) -> list[str]:
    return pq.read_table(demo_tables[0]).column("question").to_pylist()[:n]


# -- no server needed ---------------------------------------------------------------------
def test_protocol_round_trips_every_operation():
    gens = [GenerateRequest("Qué es ß? ✓", max_new_tokens=7, stop=("\n", "Q:"), temperature=0.7, top_p=0.9,
                            seed=11, chat=False, continuation_ids=(5, 9), batch_invariant=True),
            GenerateRequest("plain")]
    assert decode_requests("generate", encode_requests("generate", gens)) == gens
    scores = [ScoreRequest("p", " c ✓"), ScoreRequest("", "x"), ScoreRequest.of_segments("q", (" a ✓", "\nb", " Yes")),
              ScoreRequest("ctx q", "a", contrast_prompt="", alpha=0.5, chat=True),
              ScoreRequest("ctx q", "a", contrast_prompt="q ✓", alpha=0.3)]
    assert decode_requests("score", encode_requests("score", scores)) == scores
    fused = [FusedDecodeRequest(("a ✓", "b", "c"), (0.5, 0.3, 0.2), max_new_tokens=9, stop=("\n",), chat=False),
             FusedDecodeRequest(("x",), (1.0,))]
    assert decode_requests("fused_decode", encode_requests("fused_decode", fused)) == fused
    pairs = [RerankRequest("q ✓", "unit"), RerankRequest("", "")]
    assert decode_requests("rerank", encode_requests("rerank", pairs)) == pairs
    assert decode_results("rerank", encode_results("rerank", [0.25, -3.5])) == [0.25, -3.5]
    assert decode_requests("embed", encode_requests("embed", ["a", "b ✓"])) == ["a", "b ✓"]
    out = [Generation("Paris ✓", [5, 6, 7], [-0.5, -1.25, -3.0], 12, "stop"), Generation("", [], [], 3, "length")]
    assert decode_results("generate", encode_results("generate", out)) == out
    assert decode_results("fused_decode", encode_results("fused_decode", out)) == out
    scored = [Scored([-0.25, -2.5], 4, ["▁a", "b"]), Scored([-1.0], 1, ["x"]), Scored([-1.0, -2.0], 1, ["x", "y"], [1, 1])]
    assert decode_results("score", encode_results("score", scored)) == scored
    vecs = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    assert np.array_equal(np.stack(decode_results("embed", encode_results("embed", vecs))), vecs)


def _check_repository(repo: Path, kind: str) -> dict[str, dict]:
    """Every config declares the protocol's tensors, a known model and dynamic batching."""
    from specrag.inference.models import MODELS
    served = {}
    for config in sorted(repo.glob("*/config.pbtxt")):
        text = config.read_text()
        params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))
        assert params["specrag_model"] in MODELS
        spec = OPS[params["specrag_op"]]
        head, tail = text.split("output [")
        as_triton = lambda pairs: [(n, "BYTES" if t == "STRING" else t) for n, t in pairs]  # noqa: E731
        assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', head)) == list(spec.inputs), config
        assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', tail)) == list(spec.outputs), config
        assert f"kind: {kind}" in text and "dynamic_batching" in text
        assert (config.parent / "1" / "model.py").exists()
        served[params["specrag_op"]] = params
    return served


def test_model_repository_configs_match_the_protocol():
    served = _check_repository(REPO / "model_repo", "KIND_CPU")
    assert {op: p["specrag_model"] for op, p in served.items()} == {
        "generate": "smollm2-135m-instruct", "score": "gemma3-270m", "embed": "all-minilm-l6-v2",
        "fused_decode": "smollm2-135m-instruct"}


def test_utility_model_template_matches_the_protocol(tmp_path):
    """The rerank model is a template launch.py fills with a trained predictor's folder."""
    model = tmp_path / "predictor"
    model.mkdir()
    (model / "specrag_model.json").write_text('{"kind": "cross-encoder"}')
    repo = launch.with_utility_model(REPO / "model_repo", model, tmp_path / "repo")
    text = (repo / "utility" / "config.pbtxt").read_text()
    head, tail = text.split("output [")
    as_triton = lambda pairs: [(n, "BYTES" if t == "STRING" else t) for n, t in pairs]  # noqa: E731
    assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', head)) == list(OPS["rerank"].inputs)
    assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', tail)) == list(OPS["rerank"].outputs)
    assert f'string_value: "{model.resolve()}"' in text and (repo / "generator" / "config.pbtxt").exists()
    with pytest.raises(launch.TritonStartError, match="not a model specrag trained"):
        launch.with_utility_model(REPO / "model_repo", tmp_path, tmp_path / "repo2")


def test_denoiser_template_matches_the_protocol(tmp_path):
    """SARDI's denoiser is a template too (--denoiser-model); both trained models can be served at once."""
    folders = {}
    for name in ("utility", "denoiser"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "specrag_model.json").write_text("{}")
    repo = launch.with_trained_models(REPO / "model_repo", folders, tmp_path / "repo")
    text = (repo / "denoiser" / "config.pbtxt").read_text()
    head, tail = text.split("output [")
    as_triton = lambda pairs: [(n, "BYTES" if t == "STRING" else t) for n, t in pairs]  # noqa: E731
    assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', head)) == list(OPS["denoise"].inputs)
    assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', tail)) == list(OPS["denoise"].outputs)
    assert f'string_value: "{folders["denoiser"].resolve()}"' in text and (repo / "utility" / "config.pbtxt").exists()
    assert "DenoiseModel" in (repo / "denoiser" / "1" / "model.py").read_text()


def test_a_repository_is_generated_for_the_models_a_run_names(tmp_path):
    """One Triton model per operation of each named model, from its operation's template, unless
    the repository already serves that (operation, model)."""
    repo = launch.with_models(REPO / "model_repo", ["gemma3-270m", "all-minilm-l6-v2"], tmp_path / "repo",
                              kinds={"gemma3-270m": "causal-lm", "all-minilm-l6-v2": "encoder"})
    made = sorted(p.name for p in repo.iterdir() if not p.is_symlink())
    assert [n.rsplit("-", 1)[0] for n in made] == ["fused_decode-gemma3-270m", "generate-gemma3-270m"]
    assert {("score", "gemma3-270m"), ("generate", "gemma3-270m"), ("embed", "all-minilm-l6-v2")} \
        <= launch.served_pairs(repo)  # the scorer and the embedder were there already
    text = (repo / made[1] / "config.pbtxt").read_text()
    assert f'name: "{made[1]}"' in text and 'string_value: "gemma3-270m"' in text
    head, tail = text.split("output [")
    as_triton = lambda pairs: [(n, "BYTES" if t == "STRING" else t) for n, t in pairs]  # noqa: E731
    assert as_triton(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', head)) == list(OPS["generate"].inputs)
    with pytest.raises(launch.TritonStartError, match="kind 'masked-lm'; Triton serves"):
        launch.with_models(REPO / "model_repo", ["x"], tmp_path / "repo2", kinds={"x": "masked-lm"})


def test_denoise_protocol_round_trip():
    from specrag.inference.triton_protocol import decode_requests, decode_results, encode_requests, encode_results
    from specrag.inference.types import Denoised, DenoiseRequest
    reqs = [DenoiseRequest("ctx é", (103, 5, 103)), DenoiseRequest("", (7,), chat=False)]
    assert decode_requests("denoise", encode_requests("denoise", reqs)) == reqs
    outs = [Denoised([5, 6, 7], [0.5, 1.0, 0.25], 12, 3), Denoised([1], [0.75], 0)]
    assert decode_results("denoise", encode_results("denoise", outs)) == outs


def test_gpu_repository_variant_keeps_the_models_and_changes_the_instances(tmp_path):
    out = tmp_path / "gpu_repo"
    subprocess.run([sys.executable, str(REPO / "deploy" / "triton" / "gpu" / "make_gpu_repo.py"), str(out)], check=True)
    served = _check_repository(out, "KIND_GPU")
    assert served["generate"]["dtype"] == "bfloat16" and served["embed"]["dtype"] == "float32"
    assert "count: 2" in (out / "generator" / "config.pbtxt").read_text()


def test_unreachable_server_is_a_clear_error_at_start():
    from specrag.inference.triton import TritonConfig, TritonUnavailable
    from specrag.transforms.runtime import RuntimeConfig
    with pytest.raises(ValueError, match="--triton-url"):
        RuntimeConfig(backend="triton").validate(("generator",))
    dead = TritonConfig(f"grpc://127.0.0.1:{launch.free_port()}", retries=0)
    with pytest.raises(TritonUnavailable, match="cannot reach Triton"):
        RuntimeConfig(backend="triton", backend_configs=(dead,)).validate(("generator",))


def test_a_capability_the_backend_lacks_fails_at_start():
    """KNN-LM needs next_token (hidden states per step), which the served models do not return:
    the run is refused before it starts (no server contacted), naming what is missing."""
    from specrag.inference.capabilities import MissingCapability
    from specrag.inference.triton import TritonConfig
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob
    from specrag.transforms.runtime import RuntimeConfig
    method = create_method("knnlm")
    server = TritonConfig(f"grpc://127.0.0.1:{launch.free_port()}")
    runtime = RuntimeConfig(backend="triton", backend_configs=(server,),
                            datastore_dir="unused").with_roles(method.model_roles)
    with pytest.raises(MissingCapability, match="knnlm' needs next_token from its generator .*triton backend"):
        AnswerJob("unused.parquet", "unused", method, runtime).validate()
    with pytest.raises(ValueError, match="grpc://host:port"):
        TritonConfig("ftp://127.0.0.1:1")


# -- a real server -------------------------------------------------------------------------
@pytest.mark.slow
def test_greedy_generation_equals_local(triton_server, generator, demo_tables):
    prompts = [f"Answer briefly. {q}" for q in _questions(demo_tables, 8)]
    requests = [GenerateRequest(p, max_new_tokens=24) for p in prompts]
    requests += [GenerateRequest(prompts[0], max_new_tokens=24, stop=(".",)),
                 GenerateRequest("The capital of France is", max_new_tokens=8, chat=False)]
    remote = _backend(triton_server, "smollm2-135m-instruct")
    batched = remote.generate(requests)  # sent at once: the dynamic batcher groups them
    local = generator.generate(requests)
    for r, l in zip(batched, local):
        assert (r.text, r.token_ids, r.prompt_tokens, r.finish_reason) == (l.text, l.token_ids, l.prompt_tokens,
                                                                         l.finish_reason)
        np.testing.assert_allclose(r.token_logprobs, l.token_logprobs, atol=1e-4)
    for req in requests[:3] + requests[-2:]:  # alone on the server as locally: bit-equal
        assert remote.generate([req]) == generator.generate([req])
    sampled = GenerateRequest(prompts[1], max_new_tokens=16, temperature=0.8, top_p=0.95, seed=7)
    assert remote.generate([sampled]) == generator.generate([sampled])


@pytest.mark.slow
def test_fused_decoding_and_contrastive_scores_through_triton_equal_local(triton_server, generator, scorer):
    """AED-RAG's operations served: fused decoding (the fused_decoder model) and CPPL's
    contrastive score (the scorer) give the local backend's outputs."""
    from specrag.methods.prompts import aed_prompt
    q = "What is the capital of Australia?"
    prompts = tuple(aed_prompt(c, q) for c in ("Canberra is the capital of Australia.",
                                               "<Canberra; is; capital of Australia>", "Australia is big."))
    requests = [FusedDecodeRequest(prompts, (0.5, 0.3, 0.2), max_new_tokens=16),
                FusedDecodeRequest(prompts[:1], (1.0,), max_new_tokens=16)]
    remote = _backend(triton_server, "smollm2-135m-instruct")
    for r in requests:  # alone on the server as locally: the same tokens
        [got], [want] = remote.fused_decode([r]), generator.fused_decode([r])
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
        np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, atol=1e-4)
    contrast = [ScoreRequest(p, "Canberra", chat=False, contrast_prompt=aed_prompt("", q), alpha=0.5) for p in prompts]
    served = _backend(triton_server, "gemma3-270m").score(contrast)
    for got, want in zip(served, scorer.score(contrast)):
        np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, atol=1e-3)


@pytest.mark.slow
def test_triplet_extraction_through_triton_equals_local(triton_server, generator):
    """The generator as triplet extractor (the paper's way) gives the same triplets served."""
    from specrag.retrieval.triplets import GeneratorTripletExtractor, Passage
    passages = [Passage("curie", "Marie Curie", "Marie Curie was born in Warsaw. She discovered radium in 1898."),
                Passage("paris", "Paris", "Paris is the capital of France. The Seine flows through Paris.")]
    remote = GeneratorTripletExtractor(_backend(triton_server, "smollm2-135m-instruct"), "smollm2-135m-instruct",
                                       max_new_tokens=48).extract(passages)
    local = GeneratorTripletExtractor(generator, "smollm2-135m-instruct", max_new_tokens=48).extract(passages)
    for r, l in zip(remote, local):
        assert [(t.head, t.relation, t.tail, t.sentence) for t in r.triplets] == \
               [(t.head, t.relation, t.tail, t.sentence) for t in l.triplets]
        np.testing.assert_allclose([t.score for t in r.triplets], [t.score for t in l.triplets], atol=1e-3)


@pytest.mark.slow
def test_scores_and_embeddings_equal_local(triton_server, scorer, embedder, demo_tables):
    questions = _questions(demo_tables, 6)
    requests = [ScoreRequest(f"Question: {q}\nAnswer:", " I do not know.") for q in questions]
    requests.append(ScoreRequest.of_segments("Question: Who?\nAnswer:", (" Ada.\nRationale: she did.", "\nSupported?", " Yes")))
    remote = _backend(triton_server, "gemma3-270m")
    for r, l in zip(remote.score(requests), scorer.score(requests)):
        assert (r.tokens, r.prompt_tokens, r.segment_lengths) == (l.tokens, l.prompt_tokens, l.segment_lengths)
        np.testing.assert_allclose(r.token_logprobs, l.token_logprobs, atol=1e-4)
    assert remote.score(requests[:1]) == scorer.score(requests[:1])
    emb = _backend(triton_server, "all-minilm-l6-v2")
    np.testing.assert_allclose(emb.embed(questions), embedder.embed(questions), atol=1e-5)
    assert np.array_equal(emb.embed(questions[:1]), embedder.embed(questions[:1]))


@pytest.mark.slow
def test_errors_are_clear_and_fail_only_their_row(triton_server):
    from specrag.inference.triton import TritonError, TritonTimeout
    remote = _backend(triton_server, "smollm2-135m-instruct")
    too_long, fine = GenerateRequest("word " * 5000, max_new_tokens=4), GenerateRequest("Say hi.", max_new_tokens=4)
    bad, good = remote.generate([too_long, fine], return_exceptions=True)
    assert isinstance(bad, TritonError) and "max_prompt_tokens" in str(bad)
    assert isinstance(good, Generation) and good.token_ids
    with pytest.raises(TritonError, match="max_prompt_tokens"):
        remote.generate([too_long])
    with pytest.raises(TritonError, match=r"no READY model serving generate\(\) with weights 'gemma3-270m'.*scorer"):
        _backend(triton_server, "gemma3-270m").check(["generate"])
    slow = _backend(triton_server, "smollm2-135m-instruct", timeout_s=0.05)
    with pytest.raises(TritonTimeout, match="no answer within 0.05s"):
        slow.generate([GenerateRequest("Write a long story about a dragon.", max_new_tokens=200)])


@pytest.mark.slow
def test_a_model_that_fails_to_load_is_reported(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "model_repo" / "embedder", repo / "broken")
    config = repo / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "embedder"', 'name: "broken"')
                      .replace("all-minilm-l6-v2", "no-such-model"))
    strict = launch.TritonServer(repo, launch.install(), log_path=tmp_path / "strict.log")
    with pytest.raises(launch.TritonStartError, match="unknown model 'no-such-model'"):
        strict.start()  # default: the server refuses to start, and the error carries its log
    server = _start(tmp_path / "lenient", repo, extra_args=("--exit-on-error=false", "--strict-readiness=false"))
    try:
        from specrag.inference.triton import TritonError
        with pytest.raises(TritonError, match=r"broken \(\?, \?, UNAVAILABLE: .*unknown model 'no-such-model'"):
            _backend(server, "all-minilm-l6-v2").check(["embed"])
    finally:
        server.stop()


def _answer_cmd(queries, out, index, server, *extra) -> list[str]:
    return [sys.executable, "-m", "specrag.pipelines.cli", "answer", "--queries", str(queries), "--output", str(out),
            "--method", "standard", "--set", "top_k=3", "--index", str(index), "--backend", "triton",
            "--triton-url", server.grpc_url, *extra]


@pytest.mark.slow
def test_pipeline_through_triton_equals_local(triton_server, demo_tables, demo_index, tmp_path):
    from specrag.methods import create_method
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.inference.triton import TritonConfig
    from specrag.transforms.runtime import RuntimeConfig
    method = create_method("standard", top_k=3)
    answers = {}
    for backend in ("local", "triton"):
        runtime = RuntimeConfig(backend=backend, index_dir=str(demo_index),
                                backend_configs=(TritonConfig(triton_server.grpc_url),) if backend == "triton" else ())
        out = tmp_path / backend
        run_answer(AnswerJob(str(demo_tables[0]), str(out), method, runtime.with_roles(method.model_roles),
                             batch_size=8, num_shards=2, beam_args=BEAM_ARGS))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        answers[backend] = {r["id"]: r["answer"] for r in rows}
        assert not pq.read_table(sorted(out.glob("dead_letters-*.parquet"))).num_rows
    assert len(answers["local"]) == pq.read_table(demo_tables[0]).num_rows
    assert answers["triton"] == answers["local"]


@pytest.mark.slow
def test_killed_server_sends_queries_to_dead_letters_and_resume_answers_only_those(demo_tables, demo_index, tmp_path):
    out = tmp_path / "run"
    # half the demo questions, of every task type (generated answers, and scored closed-set options)
    subset, left = [], {"short_form": 8, "multiple_choice": 4, "claim_verification": 4}
    for r in pq.read_table(demo_tables[0]).to_pylist():
        if left.get(r["task_type"], 0):
            left[r["task_type"]] -= 1
            subset.append(r)
    queries_file = tmp_path / "queries.parquet"
    pq.write_table(pa.Table.from_pylist(subset), queries_file)
    server = _start(tmp_path / "first")
    ids = [r["id"] for r in subset]
    cmd = _answer_cmd(queries_file, out, demo_index, server, "--batch-size", "2", "--engine-batch", "2",
                      "--shards", "1", "--triton-retries", "1",
                      "--max-failure-fraction", "1")  # most queries fail on purpose
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while _metric(server, "nv_inference_request_success", "generator") < 4:
            assert run.poll() is None, f"the run ended before the server was killed:\n{run.stdout.read()}"
            assert time.monotonic() < deadline, "no generation reached the server"
            time.sleep(0.2)
        server.kill()
        log, _ = run.communicate(timeout=900)
    finally:
        server.kill()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, log
    answered = pq.read_table(sorted(out.glob("results-*.parquet"))).column("id").to_pylist()
    dead = pq.read_table(sorted(out.glob("dead_letters-*.parquet"))).to_pylist()
    assert answered and dead, (len(answered), len(dead))
    assert sorted(answered + [d["id"] for d in dead]) == sorted(ids)  # every query exactly once
    for d in dead:
        assert (d["stage"], d["error_type"]) == ("Generate", "TritonUnavailable") and "unavailable" in d["message"], d

    again = _start(tmp_path / "second")
    try:
        resumed = subprocess.run(_answer_cmd(queries_file, out, demo_index, again, "--resume"),
                                 capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        # only the missing ones: a generation per open question, a score per option surface form
        # (generator_scorer: closed-set tasks score their labels with the generator's weights)
        from specrag.methods.common import _surface_forms, option_labels
        queries = {q["id"]: q for q in subset}
        redone = [queries[d["id"]] for d in dead]
        scores = sum(len(_surface_forms(lab)) for q in redone for lab in option_labels(q) or [])
        assert _metric(again, "nv_inference_request_success", "generator") == sum(not option_labels(q) for q in redone)
        assert _metric(again, "nv_inference_request_success", "generator_scorer") == scores
    finally:
        again.stop()
    final = pq.read_table(sorted(out.glob("results-*.parquet"))).column("id").to_pylist()
    assert sorted(final) == sorted(ids)
    dead_after = sorted(out.glob("dead_letters-*.parquet"))  # dead letters are written only when there are some
    assert not dead_after or not pq.read_table(dead_after).num_rows
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed"]["skipped_finished"] == len(answered)


def _untrained_model_folder(folder, new, save, card: dict):
    """A model folder as the train-* commands write it (MiniLM base, a fresh seeded head, the
    tokenizer and the card), without the training: serving parity does not need trained weights."""
    import json as _json
    from transformers import AutoTokenizer
    from specrag.inference.models import CARD, materialise
    folder.mkdir()
    base = materialise("all-minilm-l6-v2")
    save(new(base, seed=0), folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    (folder / CARD).write_text(_json.dumps(card))
    return folder


@pytest.mark.slow
def test_utility_predictor_served_by_triton_equals_local(tmp_path):
    """A predictor folder (here: the untrained cross-encoder, saved as train-utility saves)
    served as the `utility` model by launch.py --utility-model gives the local scores."""
    from specrag.inference.cross_encoder import new_cross_encoder, save_cross_encoder
    from specrag.inference.types import RerankRequest
    from specrag.transforms.runtime import load_backend
    folder = _untrained_model_folder(tmp_path / "predictor", new_cross_encoder, save_cross_encoder,
                                     {"kind": "cross-encoder", "max_length": 128})
    empty = tmp_path / "empty"
    empty.mkdir()
    repo = launch.with_utility_model(empty, folder, tmp_path / "repo")  # the utility model alone
    server = _start(tmp_path, repo)
    try:
        pairs = [RerankRequest("What is the capital of Australia?", t) for t in
                 ("Canberra is the capital of Australia.", "<Canberra; is; capital of Australia>", "Bananas.")]
        served = _backend(server, str(folder)).rerank(pairs)
        np.testing.assert_allclose(served, load_backend("local", str(folder), 1).rerank(pairs), atol=1e-4)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder-mlm", "ar-adapted"])
def test_denoiser_served_by_triton_equals_local(tmp_path, family, tiny_llama_folder):
    """A denoiser served as the `denoiser` model by launch.py --denoiser-model gives the local
    argmax and confidences, masks and context cut too: MiniLM with a fresh tied MLM head, and a
    causal LM adapted as Dream was (served with its prompt cache, as locally)."""
    from specrag.inference.denoiser import new_denoiser, save_denoiser
    from specrag.inference.types import DenoiseRequest
    from specrag.transforms.runtime import load_backend
    if family == "ar-adapted":
        from conftest import adapted_denoiser_folder
        folder = adapted_denoiser_folder(tmp_path / "denoiser", tiny_llama_folder)
    else:
        folder = _untrained_model_folder(tmp_path / "denoiser", new_denoiser, save_denoiser,
                                         {"kind": "masked-diffusion", "max_positions": 64})
    empty = tmp_path / "empty"
    empty.mkdir()
    repo = launch.with_trained_models(empty, {"denoiser": folder}, tmp_path / "repo")
    server = _start(tmp_path, repo)
    try:
        local = load_backend("local", str(folder), 1)
        m = local.mask_id
        requests = [DenoiseRequest("Question: who wrote hamlet? Facts: [1] Hamlet is by Shakespeare.", (m,) * 8),
                    DenoiseRequest("a context far longer than the window allows " * 10, (2000, m, m, 102)),
                    DenoiseRequest("", (m,))]
        triton = _backend(server, str(folder))
        served, expected = triton.denoise(requests), local.denoise(requests)
        assert triton.mask_id == m and triton.eos_ids == local.eos_ids
        for s, e in zip(served, expected):
            assert s.argmax == e.argmax and (s.context_tokens, s.truncated_tokens) == (e.context_tokens, e.truncated_tokens)
            np.testing.assert_allclose(s.confidence, e.confidence, atol=1e-5)
        assert expected[1].truncated_tokens > 0 and expected[1].argmax[0] == 2000
        assert triton.detokenize([[2000, 102]]) == local.detokenize([[2000, 102]])
    finally:
        server.stop()


@pytest.mark.slow
def test_a_model_named_by_path_is_served_from_a_generated_repository_as_locally(tmp_path, tiny_llama_folder):
    """`launch.py serve --model FOLDER`: a user's transformers folder, its kind read by specrag in
    the server's venv, served for generate/score/fused_decode; greedy tokens equal local ones."""
    from specrag.inference.types import GenerateRequest
    from specrag.transforms.runtime import load_backend
    empty = tmp_path / "empty"
    empty.mkdir()
    repo = launch.with_models(empty, [str(tiny_llama_folder)], tmp_path / "repo")
    assert sorted(p.name.split("-")[0] for p in repo.iterdir()) == ["fused_decode", "generate", "score"]
    server = _start(tmp_path, repo)
    try:
        requests = [GenerateRequest("Who wrote Hamlet?", max_new_tokens=6), GenerateRequest("Name a river.", 4)]
        served = _backend(server, str(tiny_llama_folder)).generate(requests)
        local = load_backend("local", str(tiny_llama_folder), 1).generate(requests)
        assert [g.token_ids for g in served] == [g.token_ids for g in local]
    finally:
        server.stop()

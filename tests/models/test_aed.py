"""AED-RAG: utilities and weights, fused decoding, contrastive perplexity, the predictor's
training, the method's stages and ablations, and the train/eval splits."""
from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from specrag.inference import Engine, EngineConfig, ModelBackend, Services
from specrag.inference.types import FusedDecodeRequest, GenerateRequest, Generation, ScoreRequest
from specrag.methods import create_method
from specrag.methods.aed_rag import AEDRAGTrace, contrastive_perplexity, sequential_utility, softmax
from specrag.methods.base import QueryState
from specrag.methods.prompts import aed_prompt
from specrag.retrieval.base import Hit, Retriever
from specrag.retrieval.triplets import Triplet
from specrag.training.utility_predictor import (LabelledQuery, informative, spearman, split_held_out,
                                                 teacher_distribution, top_units)


# --- the paper's formulas ------------------------------------------------------------------

def test_sequential_utility_weights_the_top_m_by_beta():
    u, top = sequential_utility([0.2, 1.0, -0.5, 0.7], m=2, beta=0.5)
    assert top == [1, 3] and u == pytest.approx(1.0 + 0.5 * 0.7)
    assert sequential_utility([0.2, 1.0], m=1, beta=0.5) == (1.0, [1])
    assert sequential_utility([0.3, 0.3, 0.1], m=2, beta=0.0) == (0.3, [0, 1])  # beta 0: top-1 only, stable ties
    w = softmax([1.0, 0.0, -1.0])
    assert sum(w) == pytest.approx(1) and w == pytest.approx(list(np.exp([1, 0, -1]) / np.exp([1, 0, -1]).sum()))


def test_teacher_prefers_low_perplexity_and_useless_questions_are_dropped():
    p = teacher_distribution([1.0, 3.0, 9.0])
    assert p == pytest.approx(np.array([1 / 2, 1 / 4, 1 / 10]) / (1 / 2 + 1 / 4 + 1 / 10))
    assert informative([1.0, 1.5]) and not informative([1.0, 1.0 + 1e-12])
    q = LabelledQuery("q", "Q?", ["a", "b", "c"], ["passage"] * 3, [5.0, 1.2, 3.0])
    assert top_units(q, 2).units == ["b", "c"]  # lowest CPPL kept, in their original order


def test_spearman_and_the_held_out_split():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    queries = [LabelledQuery(f"q{i}", "", [], [], []) for i in range(200)]
    train, held = split_held_out(queries, 0.2, seed=0)
    assert {q.qid for q in train}.isdisjoint(q.qid for q in held) and len(train) + len(held) == 200
    assert 20 < len(held) < 60
    again = split_held_out(list(reversed(queries)), 0.2, seed=0)[1]
    assert {q.qid for q in again} == {q.qid for q in held}  # by id, not by order


def test_training_and_evaluation_splits_are_disjoint_files():
    from specrag.evaluation.splits import load_split, split_fingerprint
    train, evaluation = load_split("aed_train"), load_split("aed_eval")
    assert len(train) >= 1000 and set(train).isdisjoint(evaluation)
    assert {i.split(":")[0] for i in train} == {"nq", "hotpotqa"}
    assert {i.split(":")[0] for i in evaluation} == {"nq", "hotpotqa", "popqa", "webquestions"}
    assert split_fingerprint("aed_train").startswith("aed_train@sha256:")


# --- the method's stages on fake services (orchestration) --------------------------------

DOCS = [Hit("d1", 1.0, "Canberra", "Canberra is the capital of Australia."),
        Hit("d2", 0.9, "Sydney", "Sydney is the largest city of Australia."),
        Hit("d3", 0.8, "Perth", "Perth is in Western Australia.")]
TRIPLETS = {"d1": (Triplet("Canberra", "is", "capital of Australia", 0),),
            "d2": (Triplet("Sydney", "is", "largest city of Australia", 0),), "d3": ()}


class FakeRetriever(Retriever):
    def search(self, queries, k):
        return [DOCS[:k] for _ in queries]


class FakeStore(dict):
    pass


class FakeGenerator(ModelBackend):
    name, capabilities = "fake-lm", frozenset({"generate", "fused_decode"})

    def __init__(self):
        self.fused, self.generated, self._lock = [], [], threading.Lock()

    def generate(self, requests):
        with self._lock:
            self.generated += requests
        return [Generation("Canberra." if "Answer the question" in r.prompt else "Australia's capital is Canberra.",
                           [1], [0.0], 10, "stop") for r in requests]

    def fused_decode(self, requests):
        with self._lock:
            self.fused += requests
        return [Generation("Canberra", [1], [0.0], 30, "stop") for _ in requests]


class FakeUtility(ModelBackend):
    """A deterministic S_phi: the capital passage and its triplets score high."""

    name, capabilities = "fake-utility", frozenset({"rerank"})

    def rerank(self, requests):
        return [2.0 if "capital of Australia" in r.text else (1.0 if "capital" in r.text else 0.1 * len(r.text) / 40)
                for r in requests]


def _run(method, generator=None):
    generator = generator or FakeGenerator()
    services = Services(models={"generator": generator, "utility": FakeUtility()}, retriever=FakeRetriever(),
                        resources={"triplets": FakeStore(TRIPLETS)})
    engine = Engine(services, EngineConfig(max_batch=8))
    query = {"id": "q1", "question": "What is the capital of Australia?", "task_type": "short_form", "answers": []}
    [outcome] = engine.run_stages(method.stages(), [QueryState(query=query)])
    engine.close()
    assert outcome.error is None, outcome.error_traceback
    return outcome.outputs[0], generator


def test_aed_weights_are_the_softmax_of_the_stream_utilities():
    item, gen = _run(create_method("aed-rag", top_k=3, m=2))
    t = item.trace.method
    assert isinstance(t, AEDRAGTrace) and item.answer == "Canberra"
    assert t.passage_ids == ["d1", "d2", "d3"] and t.triplet_counts == [1, 1, 0]
    assert math.isnan(t.triplet_scores[2])  # an empty set is no unit
    assert t.chosen_passages[0] == "d1" and t.chosen_triplet_sets[0] == "d1"
    s = t.passage_scores
    assert t.utility_passages == pytest.approx(sorted(s, reverse=True)[0] + 0.5 * sorted(s, reverse=True)[1])
    assert t.weights == pytest.approx(softmax([t.utility_passages, t.utility_triplets, t.utility_self]))
    [request] = gen.fused
    assert request.weights == pytest.approx(tuple(t.weights)) and len(request.prompts) == 3
    assert "Canberra is the capital of Australia." in request.prompts[0]
    assert "<Canberra; is; capital of Australia>" in request.prompts[1]
    assert request.prompts[2] == aed_prompt("Australia's capital is Canberra.", "What is the capital of Australia?")
    assert [s.name for s in create_method("aed-rag").stages()] == ["Retrieve", "ScoreUnits", "SelfSufficiency",
                                                                  "FusedDecode"]


@pytest.mark.parametrize("settings, streams", [
    ({"triplets": False}, ["passages", "self"]),
    ({"self_sufficiency": False}, ["passages", "triplets"]),
    ({"fusion": False}, ["passages"]),
    ({"m": 1}, ["passages", "triplets", "self"]),
])
def test_ablations_change_the_streams(settings, streams):
    item, gen = _run(create_method("aed-rag", top_k=3, **settings))
    t = item.trace.method
    assert t.streams == streams
    assert [w > 0 for w in t.weights] == [s in streams for s in ("passages", "triplets", "self")]
    if settings.get("fusion") is False:  # rerank only: one prompt with the top-m passages, greedy
        assert not gen.fused and "Canberra is the capital" in gen.generated[-1].prompt
        assert not any("background" in r.prompt for r in gen.generated)  # no d_ss
    if settings.get("m") == 1:
        assert len(t.chosen_passages) == 1 and t.utility_passages == max(t.passage_scores)


def test_standard_rag_with_the_papers_prompt_is_the_baseline():
    item, gen = _run(create_method("standard", top_k=2, prompt="aed"))
    [request] = gen.generated
    assert request.prompt.startswith("Canberra\nCanberra is the capital of Australia.")
    assert request.prompt.endswith("### Input: \n What is the capital of Australia?") and request.stop == ()
    assert item.answer == "Canberra"
    with pytest.raises(ValueError, match="prompt must be one of"):
        create_method("standard", prompt="fancy")


def test_aed_declares_what_each_setting_needs():
    full = create_method("aed-rag")
    assert full.needs == {"generator": ("generate", "fused_decode"), "utility": ("rerank",)} and full.resources == ("triplets",)
    rerank_only = create_method("aed-rag", fusion=False)
    assert rerank_only.needs["generator"] == ("generate",) and not rerank_only.resources
    untrained = create_method("aed-rag", predictor="similarity")
    assert untrained.needs["embedder"] == ("embed",) and "utility" not in untrained.needs
    with pytest.raises(ValueError, match="m=3 exceeds top_k=2"):
        create_method("aed-rag", top_k=2, m=3)


def test_aed_run_without_triplets_or_utility_model_fails_at_start(tmp_path, demo_index):
    from specrag.pipelines.answer import AnswerJob
    from specrag.transforms.runtime import RuntimeConfig
    method = create_method("aed-rag")
    runtime = RuntimeConfig(index_dir=str(demo_index)).with_roles(method.model_roles)
    with pytest.raises(ValueError, match="model role"):
        AnswerJob("q.parquet", str(tmp_path), method, runtime).validate()
    runtime = RuntimeConfig(index_dir=str(demo_index), models=(("generator", "smollm2-135m-instruct"),
                                                                ("utility", "all-minilm-l6-v2")))
    with pytest.raises(ValueError, match="needs rerank from its utility"):
        AnswerJob("q.parquet", str(tmp_path), method, runtime).validate()
    with pytest.raises(ValueError, match="pass --triplets"):
        AnswerJob("q.parquet", str(tmp_path), create_method("aed-rag", predictor="similarity"),
                  RuntimeConfig(index_dir=str(demo_index))).validate()


# --- real models: exactness of the backend operations ------------------------------------

QUESTION = "What is the capital of Australia?"
CONTEXTS = ["Canberra is the capital city of Australia. It was chosen as a compromise between Sydney and Melbourne.",
            "<Canberra; is; capital city of Australia>\n<Canberra; was chosen as; compromise>",
            "Australia is a country in the southern hemisphere."]


def test_contrastive_perplexity_matches_a_direct_computation(generator):
    """log p~ = log softmax((1+a)·logit(.|q,c) - a·logit(.|q)) at the gold tokens, by hand."""
    import torch
    impl = generator._impl
    answer, alpha = "Canberra", 0.5
    base = aed_prompt("", QUESTION)
    scored = generator.score([ScoreRequest(aed_prompt(c, QUESTION), answer, chat=True, contrast_prompt=base,
                                           alpha=alpha) for c in CONTEXTS])
    cont = impl.tokenizer(answer, add_special_tokens=False)["input_ids"]

    def logits(prompt):
        ids = impl.prompt_ids(prompt, True) + cont
        with torch.inference_mode():
            out = impl.model(input_ids=torch.tensor([ids])).logits[0].float()
        return out[len(ids) - len(cont) - 1: len(ids) - 1]

    l_base = logits(base)
    for c, s in zip(CONTEXTS, scored):
        mixed = torch.log_softmax((1 + alpha) * logits(aed_prompt(c, QUESTION)) - alpha * l_base, dim=-1)
        expected = mixed.gather(-1, torch.tensor(cont).unsqueeze(-1)).squeeze(-1).tolist()
        np.testing.assert_allclose(s.token_logprobs, expected, atol=2e-4)
        assert contrastive_perplexity(s.token_logprobs) >= 1.0
    cppl = [contrastive_perplexity(s.token_logprobs) for s in scored]
    assert cppl[0] < cppl[2]  # the passage that holds the answer is the more useful
    # alpha 0 is the plain log-probability (the score operation without contrast)
    plain = generator.score([ScoreRequest(aed_prompt(CONTEXTS[0], QUESTION), answer, chat=True)])[0]
    zero = generator.score([ScoreRequest(aed_prompt(CONTEXTS[0], QUESTION), answer, chat=True,
                                         contrast_prompt=base, alpha=0.0)])[0]
    np.testing.assert_allclose(zero.token_logprobs, plain.token_logprobs, atol=2e-4)


def test_fused_decoding_reduces_to_greedy(generator):
    prompts = tuple(aed_prompt(c, QUESTION) for c in CONTEXTS)
    for i, prompt in enumerate(prompts):
        greedy = generator.generate([GenerateRequest(prompt, max_new_tokens=20)])[0]
        one_hot = tuple(1.0 if j == i else 0.0 for j in range(3))
        fused = generator.fused_decode([FusedDecodeRequest(prompts, one_hot, max_new_tokens=20)])[0]
        assert fused.token_ids == greedy.token_ids and fused.text == greedy.text
        twin = generator.fused_decode([FusedDecodeRequest((prompt, prompt), (0.5, 0.5), max_new_tokens=20)])[0]
        assert twin.token_ids == greedy.token_ids
        np.testing.assert_allclose(twin.token_logprobs, greedy.token_logprobs, atol=1e-4)
    # many queries' streams in one batch: each as if decoded alone
    requests = [FusedDecodeRequest(prompts, (0.5, 0.3, 0.2), max_new_tokens=16),
                FusedDecodeRequest(prompts[:2], (0.6, 0.4), max_new_tokens=16),
                FusedDecodeRequest(prompts[1:], (0.1, 0.9), max_new_tokens=8)]
    together = generator.fused_decode(requests)
    for r, t in zip(requests, together):
        assert t.token_ids == generator.fused_decode([r])[0].token_ids
    with pytest.raises(ValueError, match="one weight per prompt"):
        FusedDecodeRequest(prompts, (1.0,))
    with pytest.raises(ValueError, match="weights must be >= 0"):
        FusedDecodeRequest(prompts[:2], (0.0, 0.0))


# --- training on real training-split questions (slow; labels cached per content) --------

TRAIN_QUESTIONS = {"nq": 18, "hotpotqa": 6}
GOLDEN_LABELS = Path(__file__).parents[1] / "golden" / "aed_labels"  # labels.parquet + the run's manifest.json


def _training_rows(imported) -> list[dict]:
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    train = set(load_split("aed_train"))
    rows = []
    for dataset, n in TRAIN_QUESTIONS.items():
        table = pq.read_table(imported / dataset / "queries.parquet").to_pylist()
        rows += [r for r in table if r["id"] in train][:n]
    return rows


def _eval_rows(imported) -> list[dict]:
    """Six NQ questions of the aed_eval split (the answer job's)."""
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    evaluation = set(load_split("aed_eval"))
    return [r for r in pq.read_table(imported / "nq" / "queries.parquet").to_pylist() if r["id"] in evaluation][:6]


@pytest.fixture(scope="module")
def pooled_triplets(imported, pooled_bm25) -> Path:
    """Triplet sets (spaCy rules) of the pooled-corpus passages these tests' questions retrieve:
    BM25's top 10 of the 24 training and 6 evaluation questions (the jobs read their top 3 and 4).
    The whole corpus's ~15k passages took 77 s of a fresh make test, and no test reads the rest."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from conftest import BEAM_ARGS, REPO, cached_fixture
    from specrag.pipelines.extract_triplets import ExtractJob, run_extract_triplets
    from specrag.retrieval import open_retriever
    from specrag.transforms.triplets import ExtractorConfig
    questions = [r["question"] for r in _training_rows(imported) + _eval_rows(imported)]
    ids = sorted({h.doc_id for hits in open_retriever(pooled_bm25, "bm25").search(questions, 10) for h in hits})
    table = pq.read_table(imported / "pooled_corpus.parquet")
    sink = pa.BufferOutputStream()
    pq.write_table(table.filter(pc.is_in(table.column("id"), value_set=pa.array(ids))), sink)
    corpus = sink.getvalue().to_pybytes()

    def build(out):
        (out / "corpus.parquet").write_bytes(corpus)
        run_extract_triplets(ExtractJob(str(out / "corpus.parquet"), str(out / "triplets"), ExtractorConfig(),
                                        beam_args=BEAM_ARGS))

    code = [(REPO / "retrieval" / f).read_bytes() for f in ("triplets.py", "triplet_rules.py")]
    code.append((REPO / "transforms" / "triplets.py").read_bytes())
    return cached_fixture("aed_triplets", [corpus, *code], build) / "triplets"


def _label(rows, out, pooled_bm25, pooled_triplets, workers: int) -> Path:
    """The label-utility job over ``rows`` (top-3 BM25 passages, their triplet sets and a 24-token
    self-generated passage each); returns its run folder, labels.parquet written."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import split_fingerprint
    from specrag.inference.engine import EngineConfig
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.pipelines.utility import write_labels
    from specrag.transforms.runtime import RuntimeConfig
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "queries.parquet")
    method = create_method("aed-label", top_k=3, gen_max_new_tokens=24)
    # a few questions in flight: each stage's wait for the shared scoring batches stays short
    runtime = RuntimeConfig(index_dir=str(pooled_bm25), triplets_dir=str(pooled_triplets),
                            engine=EngineConfig(max_in_flight=8)).with_roles(method.model_roles)
    beam_args = ("--runner=FnApiRunner",) + (("--direct_num_workers=2", "--direct_running_mode=multi_processing")
                                             if workers > 1 else ())
    run_answer(AnswerJob(str(out / "queries.parquet"), str(out / "run"), method, runtime, beam_args=beam_args,
                         extra_manifest={"split": split_fingerprint("aed_train")}))
    write_labels(str(out / "run"))
    return out / "run"


@pytest.fixture(scope="module")
def training_labels(imported, pooled_bm25, pooled_triplets, tmp_path_factory):
    """CPPL labels of 24 aed_train questions (18 NQ, 6 HotpotQA) over the pooled corpus, committed:
    computing them takes ~4-6 minutes, so `make test` recomputes two of them and compares
    (test_committed_labels_equal_a_fresh_computation). SPECRAG_WRITE_GOLDEN=1 recomputes all 24
    and rewrites the committed files (after a change to the labels' code, prompts or model)."""
    import os
    import shutil
    if os.environ.get("SPECRAG_WRITE_GOLDEN"):
        run = _label(_training_rows(imported), tmp_path_factory.mktemp("aed_labels"), pooled_bm25, pooled_triplets,
                     workers=2)  # both cores
        GOLDEN_LABELS.mkdir(parents=True, exist_ok=True)
        for name in ("labels.parquet", "manifest.json"):
            shutil.copyfile(run / name, GOLDEN_LABELS / name)
    return GOLDEN_LABELS


@pytest.mark.slow
def test_committed_labels_equal_a_fresh_computation(imported, pooled_bm25, pooled_triplets, training_labels, tmp_path):
    """Two of the committed questions (an NQ and a HotpotQA one) labelled again by today's code:
    the same units, texts and CPPL (up to the float noise of other batch compositions)."""
    import pyarrow.parquet as pq
    rows = _training_rows(imported)
    spot = [rows[0], rows[TRAIN_QUESTIONS["nq"]]]
    fresh = pq.read_table(_label(spot, tmp_path, pooled_bm25, pooled_triplets, workers=1) / "labels.parquet").to_pylist()
    ids = {r["id"] for r in spot}
    golden = [r for r in pq.read_table(training_labels / "labels.parquet").to_pylist() if r["query_id"] in ids]
    hint = "the committed AED labels are stale: rewrite them with SPECRAG_WRITE_GOLDEN=1 pytest tests/models/test_aed.py"
    key = lambda r: (r["query_id"], r["unit"], r["kind"], r["unit_id"], r["text"])  # noqa: E731
    assert [key(r) for r in fresh] == [key(r) for r in golden], hint
    np.testing.assert_allclose([r["cppl"] for r in fresh], [r["cppl"] for r in golden], rtol=1e-3, err_msg=hint)


@pytest.mark.slow
def test_label_utility_scores_every_unit_of_training_questions(training_labels):
    import json as _json
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    labels = pq.read_table(training_labels / "labels.parquet").to_pylist()
    by_q: dict[str, list] = {}
    for r in labels:
        by_q.setdefault(r["query_id"], []).append(r)
    assert len(by_q) == sum(TRAIN_QUESTIONS.values()) and set(by_q) <= set(load_split("aed_train"))
    for units in by_q.values():
        kinds = [u["kind"] for u in units]
        assert kinds.count("passage") == 3 and kinds.count("self") == 1 and kinds.count("triplets") <= 3
        assert [u["unit"] for u in units] == list(range(len(units)))
        assert all(u["cppl"] >= 1.0 and u["text"] for u in units)
        assert all(u["unit_id"] for u in units if u["kind"] != "self")
    manifest = _json.loads((training_labels / "manifest.json").read_text())
    assert manifest["split"].startswith("aed_train@sha256:") and manifest["identity"]["triplets"]
    assert manifest["counters"].get("dead_letters", 0) == 0
    # the passage that holds the gold answer is, on average, more useful than one that does not
    holds = [u["cppl"] for u in labels if u["kind"] == "passage" and u["answer"].lower() in u["text"].lower()]
    lacks = [u["cppl"] for u in labels if u["kind"] == "passage" and u["answer"].lower() not in u["text"].lower()]
    assert holds and lacks and np.median(holds) < np.median(lacks)


@pytest.fixture(scope="module")
def trained_predictor(training_labels):
    """The predictor trained on those labels (6 epochs, ~1 minute), cached under the labels,
    the configuration and the training code: training is deterministic given the seed."""
    import dataclasses
    import json as _json
    from conftest import REPO, cached_fixture
    from specrag.pipelines.utility import run_train_utility
    from specrag.training.utility_predictor import UtilityTrainingConfig
    # one thread: the other test process computes beside it, and two threads each on 2 cores thrash
    # (6 epochs took 295 s so in make test, ~1 minute alone)
    config = UtilityTrainingConfig(epochs=6, batch_queries=4, max_length=128, held_out=0.25, seed=3, threads=1)

    def build(out):
        import torch
        threads = torch.get_num_threads()
        try:
            report = run_train_utility(str(training_labels), str(out / "model"), config)
        finally:  # the later tests' models run with the session's one thread
            torch.set_num_threads(threads)
        (out / "report.json").write_text(_json.dumps(report, default=str))

    parts = [(training_labels / "labels.parquet").read_bytes(),
             _json.dumps(dataclasses.asdict(config), sort_keys=True, default=str).encode()]
    parts += [(REPO / f).read_bytes() for f in ("training/utility_predictor.py", "inference/cross_encoder.py",
                                                 "pipelines/utility.py")]
    cached = cached_fixture("aed_predictor", parts, build)
    return cached / "model", config, _json.loads((cached / "report.json").read_text())


@pytest.mark.slow
def test_train_utility_distils_the_teacher(training_labels, trained_predictor, tmp_path, capsys):
    """The KL loss falls; on held-back training questions the trained predictor ranks units
    more like the CPPL teacher than the untrained cross-encoder (printed beside MiniLM
    similarity, the untrained-predictor ablation); the saved folder serves `rerank`; training
    is deterministic given the seed."""
    import pyarrow as pa
    from specrag.pipelines.utility import run_train_utility
    from specrag.transforms.runtime import load_backend
    from specrag.inference.types import RerankRequest
    folder, config, report = trained_predictor
    with capsys.disabled():
        print(f"\nutility predictor: epoch KL {report['epoch_loss']}; held-out Spearman with the CPPL teacher: "
              f"trained {report['spearman_trained']:.3f}, before training {report['spearman_initial']:.3f}, "
              f"untrained MiniLM similarity {report['spearman_untrained']:.3f} ({report['held_out_questions']} "
              "questions)")
    assert report["epoch_loss"][-1] < report["epoch_loss"][0]
    assert report["held_out_questions"] >= 4 and report["spearman_trained"] > report["spearman_initial"]
    backend = load_backend("local", str(folder), 1)
    assert "rerank" in backend.capabilities
    scores = backend.rerank([RerankRequest("What is the capital of Australia?", "Canberra is the capital."),
                             RerankRequest("What is the capital of Australia?", "Bananas are yellow.")])
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)
    card = (folder / "specrag_model.json").read_text()
    assert "BGE-reranker-base" in card and "all-MiniLM-L6-v2" in card  # the departure, recorded
    assert (folder / "head.safetensors").exists()
    # deterministic given the seed: two short trainings on a few of the questions agree exactly
    import dataclasses
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    labels = pq.read_table(training_labels / "labels.parquet")
    few = sorted(set(labels.column("query_id").to_pylist()))[:8]
    pq.write_table(labels.filter(pc.is_in(labels.column("query_id"), value_set=pa.array(few))),
                   tmp_path / "few.parquet")
    short = dataclasses.replace(config, epochs=1, held_out=0.0, threads=1)
    first = run_train_utility(str(tmp_path / "few.parquet"), str(tmp_path / "a"), short)
    second = run_train_utility(str(tmp_path / "few.parquet"), str(tmp_path / "b"), short)
    assert first["step_loss"] == second["step_loss"] and len(first["step_loss"]) == 2


@pytest.mark.slow
def test_the_predictor_can_start_from_the_reranker_that_installs(training_labels, tmp_path):
    """--base ms-marco-minilm-l12-v2: a cross-encoder as the paper's start (BGE-reranker-base), its own
    relevance head tuned, saved as the classifier folder it came as (no new head file), recorded as
    the departure, served by `rerank`; a base that is neither an encoder nor a cross-encoder is refused."""
    import dataclasses
    import json as _json
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from specrag.inference.types import RerankRequest
    from specrag.pipelines.utility import run_train_utility
    from specrag.training.utility_predictor import UtilityTrainingConfig
    from specrag.transforms.runtime import load_backend
    labels = pq.read_table(training_labels / "labels.parquet")
    few = sorted(set(labels.column("query_id").to_pylist()))[:8]
    pq.write_table(labels.filter(pc.is_in(labels.column("query_id"), value_set=pa.array(few))),
                   tmp_path / "few.parquet")
    config = UtilityTrainingConfig(epochs=1, batch_queries=2, max_length=128, held_out=0.25, seed=3, threads=1)
    report = run_train_utility(str(tmp_path / "few.parquet"), str(tmp_path / "model"), config,
                               base="ms-marco-minilm-l12-v2")
    folder = tmp_path / "model"
    assert report["steps"] >= 2 and all(math.isfinite(x) for x in report["step_loss"])
    assert math.isfinite(report["spearman_initial"])  # the reranker's own ranking, before training
    assert not (folder / "head.safetensors").exists()
    assert _json.loads((folder / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    card = _json.loads((folder / "specrag_model.json").read_text())
    assert "ms-marco-minilm-l12-v2" in card["departure"] and card["base_model"].startswith("ms-marco-minilm-l12-v2@")
    backend = load_backend("local", str(folder), 1)
    scores = backend.rerank([RerankRequest("What is the capital of Australia?", "Canberra is the capital."),
                             RerankRequest("What is the capital of Australia?", "Bananas are yellow.")])
    assert scores[0] > scores[1]
    with pytest.raises(ValueError, match="is a causal-lm: the utility predictor starts from an encoder or a cross"):
        run_train_utility(str(tmp_path / "few.parquet"), str(tmp_path / "bad"), dataclasses.replace(config),
                          base="smollm2-135m-instruct")


@pytest.mark.slow
def test_aed_rag_answers_evaluation_questions_with_the_trained_predictor(imported, pooled_bm25, pooled_triplets,
                                                                        trained_predictor, tmp_path):
    """The whole method in the answer job: aed_eval questions only, every unit scored, weights
    a distribution over the three streams, answers evaluated."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.report import evaluate_run
    from specrag.pipelines.answer import AnswerJob, run_answer
    from specrag.transforms.runtime import RuntimeConfig
    rows = _eval_rows(imported)
    queries = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows), queries)
    method = create_method("aed-rag", top_k=4, ss_max_new_tokens=32, max_new_tokens=16)
    runtime = RuntimeConfig(index_dir=str(pooled_bm25), triplets_dir=str(pooled_triplets),
                            models=(("generator", "smollm2-135m-instruct"), ("utility", str(trained_predictor[0]))))
    manifest = run_answer(AnswerJob(str(queries), str(tmp_path / "run"), method, runtime.with_roles(method.model_roles)))
    assert manifest["counters"]["answered"] == 6 and manifest["counters"].get("dead_letters", 0) == 0
    results = [r for f in sorted((tmp_path / "run").glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()]
    for r in results:
        t = r["trace"]
        assert len(t["passage_ids"]) == 4 and len(t["passage_scores"]) == 4
        assert set(t["chosen_passages"]) <= set(t["passage_ids"]) and len(t["chosen_passages"]) == 2
        assert sum(t["weights"]) == pytest.approx(1.0) and t["streams"][0] == "passages"
        assert t["self_passage"] and [s["stage"] for s in r["stages"]] == ["Retrieve", "ScoreUnits",
                                                                          "SelfSufficiency", "FusedDecode"]
    [row] = evaluate_run(str(tmp_path / "run"), str(queries))["rows"]
    assert row["method"] == "aed-rag" and row["n"] == 6 and {"contains", "f1"} <= set(row)

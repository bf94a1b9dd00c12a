"""Closed-set tasks answered by scoring the options (the harness convention), not by parsing
free text: the choice is the label the generator finds most probable as its reply."""
import math
import threading

import numpy as np
import pytest

from specrag.inference import Engine, EngineConfig, Generation, ModelBackend, Scored, Services
from specrag.methods.base import create_method
from specrag.methods.base import QueryState
from specrag.methods.local_run import run_method
from specrag.retrieval.base import Hit, Retriever
from specrag.methods.prompts import build_prompt

ARC = {"id": "arc-1", "question": "Which gas do plants take in?", "task_type": "multiple_choice",
       "choices": ["oxygen", "carbon dioxide", "helium", "neon"], "choice_labels": ["A", "B", "C", "D"],
       "answers": ["B"]}
CLAIM = {"id": "ph-1", "question": "Vaccines cause autism.", "task_type": "claim_verification",
         "choices": [], "choice_labels": [], "answers": ["false"]}


class FakeScorer(ModelBackend):
    """log P(continuation) from a table; generation says something no parser could read."""

    name, capabilities = "fake-lm", frozenset({"generate", "score"})

    def __init__(self, table: dict[str, float]):
        self.table, self.scored, self.generated, self._lock = table, [], [], threading.Lock()

    def score(self, requests):
        with self._lock:
            self.scored += requests
        return [Scored([self.table.get(r.continuation, -20.0)], 100) for r in requests]

    def generate(self, requests):
        with self._lock:
            self.generated += requests
        return [Generation("Hmm, hard to say.", [1], [0.0], 10, "stop") for r in requests]


def _answer(method, query, lm):
    engine = Engine(Services(models={"generator": lm}), EngineConfig(max_batch=8))
    try:
        [outcome] = engine.run_stages(method.stages(), [QueryState(query=dict(query))])
    finally:
        engine.close()
    assert outcome.error is None, outcome.error_traceback
    return outcome.outputs[0]


def test_multiple_choice_takes_the_most_probable_label():
    lm = FakeScorer({"A": -2.0, "B": -0.5, "C": -3.0, "D": -0.7})
    item = _answer(create_method("no-retrieval"), ARC, lm)
    assert item.choice == item.answer == "B" and not lm.generated
    assert item.raw_output == "B (log-probabilities: A -2.000, B -0.500, C -3.000, D -0.700)"
    prompt = build_prompt(ARC)
    assert sorted(r.continuation for r in lm.scored) == ["A", "B", "C", "D"]
    assert all(r.prompt == prompt and r.chat for r in lm.scored)


def test_ties_go_to_the_first_option():
    lm = FakeScorer({"A": -1.0, "B": -1.0, "C": -1.0, "D": -1.0})
    assert _answer(create_method("no-retrieval"), ARC, lm).choice == "A"


def test_true_false_sums_both_casings():
    # "false" alone is less likely than "true", but "False" + "false" outweighs "True" + "true"
    lm = FakeScorer({"true": math.log(0.30), "True": math.log(0.05), "false": math.log(0.20), "False": math.log(0.25)})
    item = _answer(create_method("no-retrieval"), CLAIM, lm)
    assert item.choice == "false"
    assert sorted(r.continuation for r in lm.scored) == ["False", "True", "false", "true"]
    assert f"false {math.log(0.45):.3f}" in item.raw_output and f"true {math.log(0.35):.3f}" in item.raw_output


class PromptAwareScorer(FakeScorer):
    """A model that prefers "false" everywhere, and "true" a little less so for the real claim."""

    def score(self, requests):
        with self._lock:
            self.scored += requests

        def lp(r):
            content_free = "Statement: N/A" in r.prompt
            return {"true": math.log(0.30 if content_free else 0.40), "false": math.log(0.70 if content_free else 0.60)}.get(
                r.continuation.lower(), -20.0)
        return [Scored([lp(r)], 100) for r in requests]


def test_calibrated_scoring_divides_by_the_content_free_prompt():
    """Contextual calibration: "false" is more probable for the claim (0.6 vs 0.4), but less so
    than for "N/A" (0.7 vs 0.3), so the calibrated choice is "true"; plain scoring says "false"."""
    assert _answer(create_method("no-retrieval"), CLAIM, PromptAwareScorer({})).choice == "false"
    lm = PromptAwareScorer({})
    item = _answer(create_method("no-retrieval", closed_set="calibrated"), CLAIM, lm)
    assert item.choice == "true"
    prompts = {r.prompt for r in lm.scored}
    assert prompts == {build_prompt(CLAIM), build_prompt({**CLAIM, "question": "N/A"})}
    # both casings of both labels for each prompt; the scores recorded are the calibrated ones
    assert len(lm.scored) == 8
    assert f"true {math.log(2 * 0.40) - math.log(2 * 0.30):.3f}" in item.raw_output
    options = build_prompt({**ARC, "question": "N/A", "choices": ["N/A"] * 4})
    assert "A. N/A" in options and "oxygen" not in options


def test_generate_mode_parses_free_text_and_open_tasks_are_never_scored():
    lm = FakeScorer({})
    item = _answer(create_method("no-retrieval", closed_set="generate"), ARC, lm)
    assert item.choice is None and len(lm.generated) == 1 and not lm.scored
    short = {"id": "s", "question": "Capital of France?", "task_type": "short_form", "answers": ["Paris"]}
    lm = FakeScorer({})
    _answer(create_method("no-retrieval"), short, lm)
    assert not lm.scored and len(lm.generated) == 1


def test_closed_set_setting_is_validated():
    with pytest.raises(ValueError, match="closed_set must be one of"):
        create_method("standard", closed_set="parse")
    assert create_method("standard").config.closed_set == "score"


class FakeRetriever(Retriever):
    def search(self, queries, k):
        return [[Hit(f"d{i}", 1.0 - i / 10, f"Doc {i}", f"Passage {i} about gases.") for i in range(k)]
                for _ in queries]


class FakeEmbedder(ModelBackend):
    name, capabilities = "fake-embed", frozenset({"embed"})

    def embed(self, texts):
        rng = {t: np.random.default_rng(sum(map(ord, t))).normal(size=8) for t in set(texts)}
        return np.stack([rng[t] for t in texts]).astype(np.float32)


class SubsetScorer(FakeScorer):
    """Option log-probabilities that depend on the documents in the prompt: a subset holding
    document 0 or 1 prefers B, any other prefers C; the rationale is generated text."""

    capabilities = frozenset({"generate", "score", "tokenize"})

    def score(self, requests):
        with self._lock:
            self.scored += requests
        out = []
        for r in requests:
            if r.continuation in "ABCD" and len(r.continuation) == 1:
                likes = "B" if ("Passage 0" in r.prompt or "Passage 1" in r.prompt) else "C"
                out.append(Scored([-0.1 if r.continuation == likes else -3.0], 100))
            else:  # the verifier's pass: three segments
                out.append(Scored([-1.0] * 3, 100, segment_lengths=[1, 1, 1]))
        return out

    def tokenize(self, texts):
        return [[ord(ch) for ch in t] for t in texts]

    def detokenize(self, ids):
        return ["".join(map(chr, i)) for i in ids]


def _run_with_retrieval(method, query, lm):
    services = Services(models={"generator": lm, "drafter": lm, "verifier": lm, "embedder": FakeEmbedder()},
                        retriever=FakeRetriever())
    engine = Engine(services, EngineConfig(max_batch=8))
    try:
        [state], failures = run_method(engine, method, [dict(query)])
    finally:
        engine.close()
    assert not failures
    return state


def test_speculative_rag_drafts_carry_a_scored_choice():
    lm = SubsetScorer({})
    item = _run_with_retrieval(create_method("speculative-rag", top_k=4, drafts=3, docs_per_draft=2), ARC, lm)
    drafts = item.trace.method.drafts
    assert len(drafts) == 3 and item.choice in ("B", "C")
    for d in drafts:
        best = "ABCD"[int(np.argmax(d.option_logprobs))]
        assert d.answer == best and len(d.option_logprobs) == 4
        assert d.answer == ("B" if {"d0", "d1"} & set(d.doc_ids) else "C")
    assert item.choice == drafts[item.trace.method.chosen_draft].answer
    assert all(g.continuation_ids for g in lm.generated)  # only rationales are generated, after the label


def test_sps_candidates_are_scored_options_and_the_majority_wins():
    lm = SubsetScorer({})
    item = _run_with_retrieval(create_method("sps", top_k=4, groups=2, candidates=5), ARC, lm)
    [stage] = item.trace.method.stages
    assert not lm.generated and len(stage.candidates) == 5 and len(stage.option_logprobs) == 5
    for sub, cand in zip(stage.subsets, stage.candidates):
        assert cand == ("B" if {"d0", "d1"} & set(sub) else "C")
    votes = {lab: stage.candidates.count(lab) for lab in set(stage.candidates)}
    top = max(votes.values())
    assert votes[item.choice] == top
    assert item.raw_output.startswith(f"{item.choice} (candidates: ")


@pytest.mark.slow
def test_real_generator_choice_is_the_argmax_of_its_own_scores(generator):
    """Through the engine's batching the recorded log-probabilities are the model's own."""
    from specrag.inference.types import ScoreRequest
    item = _answer(create_method("no-retrieval"), ARC, generator)
    direct = {lab: generator.score([ScoreRequest(build_prompt(ARC), lab, chat=True)])[0].total for lab in "ABCD"}
    assert item.choice == max(direct, key=direct.get)
    for lab, lp in direct.items():
        assert f"{lab} {lp:.3f}" in item.raw_output

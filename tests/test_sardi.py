"""SARDI: Algorithm 1's rules on hand-built denoiser outputs (fast), and the real denoiser
trained, served and run through the Beam pipeline (slow)."""
from __future__ import annotations

import asyncio
import logging
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
    with caplog.at_level(logging.WARNING, logger="specrag.methods.sardi"):
        m = create_method("sardi", max_new_tokens=64, passage_words=40)
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

    WORDS = {1: "lynch", 2: "born", 3: "missoula", 4: "###", 5: "montana", 9: ""}

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[DenoiseRequest] = []
        self.queries: list[str] = []
        self.trace = None

    def mask_id(self, model="denoiser"):
        return MASK

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
    assert item.raw_output == "lynch born missoula ### montana" and item.answer == "montana"
    # the proxy after step 1: "lynch" committed, every other position's argmax exposed (tau_q = 0)
    assert trace.steps[0].query == "Where was the director born? lynch born missoula ### montana"
    # each step's context holds the evidence the previous step retrieved
    assert "Where was the director born? lynch" in ctx.requests[1].context
    assert ctx.requests[0].response_ids == (MASK,) * 6
    assert ctx.requests[3].response_ids == (1, 2, 3, MASK, MASK, 9)
    # no retrieval after the last step: the initial one, then one per step but the last, unchanged ones reused
    assert trace.retrievals == len(set(ctx.queries)) == len(ctx.queries)
    assert trace.initial_query == "Where was the director born?" and len(trace.initial_doc_ids) == 2


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

"""SARDI (Self-Augmenting Retrieval for DIffusion LMs): retrieval driven by the tentative
tokens of a masked-diffusion LM (Algorithm 1).

One stage, ``Denoise``, loops over denoising steps. Per step: the denoiser predicts every
response position given the current evidence (``denoise``: per-position argmax and
confidence c_i = max_v p_i(v), batched across all queries in flight); masked positions with
c_i >= tau_c commit to their argmax (at least the single most confident one: progress); the
proxy response (committed tokens, plus still-masked positions whose c_i >= tau_q filled with
their argmax) is detokenised, the question prepended, and K passages retrieved for it
*replace* the context of the next step. An unchanged query reuses the last result.

Settings follow the paper and the authors' code (``PAPER_SETTINGS``); a run that departs
from them logs a warning and records the departures in its manifest, as the authors' code
warns. ``query="question"`` is the DLM static-retrieval baseline (one retrieval, the same
evidence every step).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Sequence

from specrag.inference.capabilities import DENOISE
from specrag.inference.types import DenoiseRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.prompts import sardi_prompt

log = logging.getLogger(__name__)

QUERY_KINDS = ("question_reasoning", "question", "reasoning")  # SARDI, DLM static, proxy only

# every setting with a published value (the paper; the authors' sardi/config.py), and those values
PAPER_SETTINGS: dict[str, tuple] = {
    "tau_c": (0.9, 0.95),
    "tau_q": (0.0,),
    "top_k": (7,),
    "steps": (100,),
    "max_new_tokens": (100,),
    "refresh_every": (1,),
    "query": ("question_reasoning", "question"),
    "deduplicate_query": (True,),
    "passage_words": (0,),
    "end_after_text": (False,),
}


@dataclass(frozen=True)
class SARDIConfig(MethodConfig):
    tau_c: float = 0.9  # commit threshold (paper: 0.9 and 0.95)
    tau_q: float = 0.0  # query threshold: 0 exposes every tentative token to the retriever
    top_k: int = 7  # K passages per retrieval; they replace the context
    steps: int = 100  # denoising steps at most (the last commits whatever is still masked)
    max_new_tokens: int = 100  # the response window L (all masked at the start)
    refresh_every: int = 1  # retrieve every r steps (paper: 1; 2 costs 1-2 EM, 4 up to 6)
    query: str = "question_reasoning"  # question + proxy (SARDI) | question (DLM static) | reasoning
    deduplicate_query: bool = True  # drop repeated words from the proxy (the authors' code)
    passage_words: int = 0  # > 0: cut each passage to this many words (a denoiser with a short window)
    # an end token commits only right after a committed position, so the end fill grows from the
    # text's end instead of running in from the window's end (a small denoiser's confident end
    # fill otherwise commits first everywhere and cuts the text after a few words; LLaDA meets the
    # same excess of end tokens with block-wise commitment). A departure: the paper has no such rule.
    end_after_text: bool = False

    def validate(self) -> None:
        if not 0.0 < self.tau_c <= 1.0:
            raise ValueError(f"tau_c (commit threshold) must be in (0, 1], got {self.tau_c}")
        if not 0.0 <= self.tau_q <= 1.0:
            raise ValueError(f"tau_q (query threshold) must be in [0, 1], got {self.tau_q}")
        if self.top_k < 1 or self.steps < 1 or self.max_new_tokens < 1 or self.refresh_every < 1:
            raise ValueError("top_k, steps, max_new_tokens and refresh_every must be >= 1")
        if self.query not in QUERY_KINDS:
            raise ValueError(f"query must be one of {QUERY_KINDS}, got {self.query!r}")
        if self.passage_words < 0:
            raise ValueError(f"passage_words must be >= 0, got {self.passage_words}")

    def departures(self) -> list[dict]:
        """Settings outside the published ones: [{setting, value, paper}]."""
        out = []
        for name, allowed in PAPER_SETTINGS.items():
            value = getattr(self, name)
            if not any(value is a or value == a for a in allowed):
                out.append({"setting": name, "value": value, "paper": list(allowed)})
        return out


@dataclass
class SardiStep:
    """One denoising step: the evidence it denoised with, what it committed, and the query
    formed after it (the evidence of the next step)."""

    doc_ids: list[str] = field(default_factory=list)  # the evidence in this step's context
    committed: int = 0  # positions committed this step
    masked_left: int = 0  # masked positions after it
    query: str = ""  # the retrieval query formed after it ("" when it did not retrieve)
    reused: bool = False  # that query was unchanged: the last result served again


@dataclass
class SARDITrace:
    initial_query: str = ""  # step 0: the question
    steps: list[SardiStep] = field(default_factory=list)  # its evidence trajectory: steps[i].doc_ids
    retrievals: int = 0  # index searches run (reused queries excluded)
    response: str = ""  # the whole denoised response (the answer is extracted from it)
    truncated_context_tokens: int = 0  # evidence tokens cut to fit the denoiser's window, summed over steps
    departures: list[str] = field(default_factory=list)  # settings off the paper's


def commit_positions(masked: Sequence[int], confidence: Sequence[float], tau_c: float) -> list[int]:
    """Masked positions with c_i >= tau_c; when none is, the single most confident (the
    first on ties): every step makes progress. Committed positions are never re-masked, so
    only ``masked`` positions are candidates."""
    if not masked:
        return []
    chosen = [i for i in masked if confidence[i] >= tau_c]
    return chosen or [max(masked, key=lambda i: (confidence[i], -i))]


def commit_candidates(masked: Sequence[int], argmax: Sequence[int], confidence: Sequence[float],
                      response: Sequence[int], mask_id: int, end_ids: set[int], tau_c: float) -> list[int]:
    """``end_after_text``: the masked positions that may commit — not one predicting an end token
    unless the position before it is committed, or is an end token committing in this step (a
    run of end tokens after the text commits at once); all of them when none is left."""
    allowed: list[int] = []
    ends_here: set[int] = set()  # end tokens that commit in this step
    for i in masked:
        if argmax[i] not in end_ids:
            allowed.append(i)
        elif i == 0 or response[i - 1] != mask_id or (i - 1) in ends_here:
            allowed.append(i)
            if confidence[i] >= tau_c:
                ends_here.add(i)
    return allowed or list(masked)


def proxy_ids(response: Sequence[int], argmax: Sequence[int], confidence: Sequence[float], mask_id: int,
              tau_q: float) -> list[int]:
    """Eq. 3: committed tokens as they are; a masked position shows its argmax when c_i >=
    tau_q, else stays masked (dropped when detokenised)."""
    return [t if t != mask_id else (a if c >= tau_q else mask_id)
            for t, a, c in zip(response, argmax, confidence)]


def normalise_proxy(text: str, deduplicate: bool = True) -> str:
    """Whitespace collapsed; repeated words dropped (first occurrence kept), as the authors' code."""
    text = re.sub(r"\s+", " ", text.strip())
    if deduplicate:
        text = " ".join(dict.fromkeys(text.split(" ")))
    return text


def retrieval_query(question: str, proxy: str, kind: str) -> str:
    """s = q || r (SARDI), the proxy alone, or the question alone (static; and every kind's
    step 0, when there is no response yet)."""
    question = re.sub(r"\s+", " ", question)
    if kind == "question" or not proxy:
        return question
    return proxy if kind == "reasoning" else f"{question} {proxy}"


_BOXED = re.compile(r"\\boxed\{(.+?)\}")
_ANSWER_IS = re.compile(r"(?:[Tt]he\s+)?(?:[Ff]inal\s+)?[Aa]nswer\s+is[:\s]+(.+)")


def extract_answer(response: str) -> str:
    """``\\boxed{}``; else the last "answer is ..."; else the text after the last ``###``
    (its first line, no final full stop); else ""."""
    text = re.sub(r"<\|[^|]+\|>", "", response).strip()
    m = _BOXED.search(text)
    if m:
        return m.group(1).strip()
    found = list(_ANSWER_IS.finditer(text))
    if found:
        return re.sub(r"\.\s*$", "", found[-1].group(1).strip().split("\n")[0].strip())
    if "###" in text:
        return re.sub(r"\.\s*$", "", text.split("###")[-1].strip().split("\n")[0].strip())
    return ""


def prompt_question(query: dict) -> str:
    """The question as SARDI's prompt shows it: a closed-set task's instruction and options go with
    it (the facts-and-``###`` frame has no place for them), or no answer could name an option.
    Options are listed as ``prompts.task_input`` lists them; that module is not edited for this
    because its source is part of every run's identity (every committed run would change)."""
    from specrag.methods.prompts import INSTRUCTIONS
    if query["task_type"] == "multiple_choice":
        options = "\n".join(f"{lab}. {txt}" for lab, txt in zip(query["choice_labels"], query["choices"]))
        return f"{INSTRUCTIONS['multiple_choice']}\n{query['question']}\n{options}"
    if query["task_type"] == "claim_verification":
        return f"{INSTRUCTIONS['claim_verification']}\n{query['question']}"
    return query["question"]


def finalise_response(item: QueryState, response: str) -> QueryState:
    """Raw output, the answer after ``###`` and, for closed-set tasks, the option or label that
    answer names (from the answer only, as ``contains`` is scored: the steps quote passages)."""
    from specrag.methods.prompts import extract_choice, extract_label
    q = item.query
    item.raw_output, item.answer = response, extract_answer(response)
    if q["task_type"] == "multiple_choice":
        item.choice = extract_choice(item.answer, q["choice_labels"], q["choices"])  # "" names none
    elif q["task_type"] == "claim_verification":
        item.choice = extract_label(item.answer)
    return item


def evidence(docs: Sequence, passage_words: int) -> list[str]:
    """The passages as the prompt shows them (cut to ``passage_words`` when set)."""
    from specrag.retrieval.base import passage_text
    texts = [passage_text(d.title, d.text) for d in docs]
    if passage_words:
        texts = [" ".join(t.split()[:passage_words]) for t in texts]
    return texts


@dataclass
class Denoise(Stage):
    """Algorithm 1 for one query; its denoise calls batch with every other query in flight."""

    config: SARDIConfig
    denoiser: str = "denoiser"
    name: str = "Denoise"

    async def run(self, item: QueryState, ctx) -> QueryState:
        c = self.config
        trace = item.trace.of(SARDITrace)
        trace.departures = [f"{d['setting']}={d['value']}" for d in c.departures()]
        question, shown = item.query["question"], prompt_question(item.query)  # retrieval: the question alone
        mask_id = int(ctx.model(self.denoiser).mask_id)
        response = [mask_id] * c.max_new_tokens
        end = set(ctx.eos_ids(self.denoiser))
        last_query = retrieval_query(question, "", c.query)
        docs = await ctx.retrieve(last_query, c.top_k, stage="step-0")
        trace.initial_query, trace.retrievals = last_query, 1
        for step in range(1, c.steps + 1):
            ctx.next_step()
            out = await ctx.denoise(DenoiseRequest(sardi_prompt(shown, evidence(docs, c.passage_words)),
                                                   tuple(response)), model=self.denoiser)
            trace.truncated_context_tokens += out.truncated_tokens
            masked = [i for i, t in enumerate(response) if t == mask_id]
            candidates = (commit_candidates(masked, out.argmax, out.confidence, response, mask_id, end, c.tau_c)
                          if c.end_after_text else masked)
            chosen = masked if step == c.steps else commit_positions(candidates, out.confidence, c.tau_c)
            for i in chosen:
                response[i] = out.argmax[i]
            item.trace.count("generated_tokens", len(chosen))  # the window's positions, as they are committed
            record = SardiStep([d.doc_id for d in docs], committed=len(chosen), masked_left=len(masked) - len(chosen))
            trace.steps.append(record)
            if record.masked_left == 0:
                break  # the last step: no evidence needed after it
            if step % c.refresh_every:
                continue
            proxy = proxy_ids(response, out.argmax, out.confidence, mask_id, c.tau_q)
            query = retrieval_query(question, normalise_proxy(ctx.detokenize(proxy, model=self.denoiser),
                                                              c.deduplicate_query), c.query)
            record.query, record.reused = query, query == last_query
            if not record.reused:
                docs = await ctx.retrieve(query, c.top_k, stage=f"step-{step}")
                trace.retrievals += 1
                last_query = query
        cut = next((i for i, t in enumerate(response) if t in end), len(response))
        trace.response = ctx.detokenize(response[:cut], model=self.denoiser).strip()
        item.docs = list(docs)
        return finalise_response(item, trace.response)


class SARDI(Method):
    name = "sardi"
    config_class = SARDIConfig
    needs = {"denoiser": (DENOISE,)}
    trace_class = SARDITrace
    needs_retriever = True

    def departures(self) -> list[dict]:
        return self.config.departures()

    def stages(self):
        return [Denoise(self.config)]

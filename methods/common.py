"""Stages shared by several methods: retrieve for the question, generate the final answer."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Sequence

from specrag.inference.types import GenerateRequest, ScoreRequest
from specrag.methods.base import QueryState, Stage
from specrag.methods.prompts import (MAX_NEW_TOKENS, STOP, aed_context, aed_prompt, build_prompt, extract_choice,
                                     extract_label, extract_short_answer)
from specrag.retrieval.base import passage_text


@dataclass
class Retrieve(Stage):
    """Top-k documents for the question, replacing the state's documents."""

    k: int
    name: str = "Retrieve"

    async def run(self, item: QueryState, ctx) -> QueryState:
        item.docs = await ctx.retrieve(item.query["question"], self.k, stage=self.name)
        return item


def finalise_answer(item: QueryState, output: str) -> QueryState:
    """Set raw output, answer and (closed-set tasks) the extracted choice or label."""
    q = item.query
    item.raw_output = output
    if q["task_type"] == "multiple_choice":
        item.choice = extract_choice(output, q["choice_labels"], q["choices"])
        item.answer = item.choice or extract_short_answer(output)
    elif q["task_type"] == "claim_verification":
        item.choice = extract_label(output)
        item.answer = item.choice or extract_short_answer(output)
    elif q["task_type"] == "long_form":
        item.answer = output.strip()
    else:
        item.answer = extract_short_answer(output)
    return item


# Closed-set tasks (multiple choice, claim verification): "score" ranks the options by the
# log-probability of each label as the model's reply to the prompt (the convention of evaluation
# harnesses); "calibrated" divides each label's probability by its probability for a content-free
# input (the same prompt and documents, the question and option texts "N/A": contextual
# calibration, Zhao et al., 2021), which removes a small model's preference for one label;
# "generate" parses the label from free text (small models often never say it).
SCORING_MODES = ("score", "calibrated")
CLOSED_SET_MODES = (*SCORING_MODES, "generate")
CLAIM_LABELS = ("true", "false")
CONTENT_FREE = "N/A"


def check_closed_set(mode: str) -> None:
    if mode not in CLOSED_SET_MODES:
        raise ValueError(f"closed_set must be one of {CLOSED_SET_MODES}, got {mode!r}")


def option_labels(query: dict, mode: str = "score") -> list[str] | None:
    """The labels a closed-set query chooses among (None for open tasks, or when ``mode``
    parses free text)."""
    if mode not in SCORING_MODES:
        return None
    if query["task_type"] == "multiple_choice":
        return list(query.get("choice_labels") or []) or None
    if query["task_type"] == "claim_verification":
        return list(query.get("choice_labels") or CLAIM_LABELS)
    return None


def content_free(query: dict) -> dict:
    """The query with its content replaced by "N/A" (options keep their labels)."""
    return {**query, "question": CONTENT_FREE, "choices": [CONTENT_FREE] * len(query.get("choices") or [])}


def _surface_forms(label: str) -> list[str]:
    """A word label in both casings ("true", "True"): the casing the model prefers must not decide."""
    return sorted({label, label[:1].upper() + label[1:]}) if len(label) > 1 else [label]


async def score_options(ctx, query: dict, docs: Sequence, labels: Sequence[str], mode: str = "score",
                        model: str = "generator") -> list[float]:
    """log P(label | prompt) per option, as the first words of the model's reply (the chat
    template applied, as for generation), summed over the label's surface forms; calibrated:
    minus log P(label | content-free prompt)."""
    prompts = [build_prompt(query, docs)] + ([build_prompt(content_free(query), docs)] if mode == "calibrated" else [])
    forms = [_surface_forms(lab) for lab in labels]
    flat = [(p, f) for p in prompts for fs in forms for f in fs]
    scored = await asyncio.gather(*(ctx.score(ScoreRequest(p, f, chat=True), model=model) for p, f in flat))
    totals = iter(s.total for s in scored)
    per_prompt = []
    for _ in prompts:
        out = []
        for fs in forms:
            lps = [next(totals) for _ in fs]
            top = max(lps)
            out.append(top + math.log(sum(math.exp(lp - top) for lp in lps)))
        per_prompt.append(out)
    if len(per_prompt) == 1:
        return per_prompt[0]
    return [a - b for a, b in zip(*per_prompt)]


def choose_option(item: QueryState, labels: Sequence[str], logprobs: Sequence[float]) -> QueryState:
    """The most probable option is the choice (ties: the first); the output records every score."""
    best = max(range(len(labels)), key=lambda i: (logprobs[i], -i))
    item.choice = item.answer = labels[best]
    item.raw_output = f"{labels[best]} (log-probabilities: " + ", ".join(
        f"{lab} {lp:.3f}" for lab, lp in zip(labels, logprobs)) + ")"
    return item


@dataclass
class Generate(Stage):
    """One generation with the state's documents (none for no-retrieval) in the prompt."""

    max_new_tokens: int | None = None  # None: the task type's default
    batch_invariant: bool = False
    prompt: str = "default"  # or "aed": AED-RAG's template (short-form questions)
    closed_set: str = "generate"  # or "score" / "calibrated": see CLOSED_SET_MODES
    name: str = "Generate"

    async def run(self, item: QueryState, ctx) -> QueryState:
        q = item.query
        if self.prompt == "aed":
            text = aed_prompt(aed_context([passage_text(d.title, d.text) for d in item.docs]), q["question"])
        else:
            text = build_prompt(q, item.docs)
        labels = option_labels(q, self.closed_set)
        if labels:
            return choose_option(item, labels, await score_options(ctx, q, item.docs, labels, self.closed_set))
        # the AED template makes small models open with a "### Output:" line: no stop at a newline
        request = GenerateRequest(text, stop=() if self.prompt == "aed" else STOP[q["task_type"]],
                                  max_new_tokens=self.max_new_tokens or MAX_NEW_TOKENS[q["task_type"]],
                                  batch_invariant=self.batch_invariant)
        out = await ctx.generate(request)
        return finalise_answer(item, out.text)


@dataclass
class TokenTrace:
    """Methods that build their answer token by token: the answer's token ids."""

    output_ids: list[int] = field(default_factory=list)


@dataclass
class StepReuse:
    """One generation step of a RaLM request, as the engine's prefix cache saw it: a step whose
    document is the step before's extends that step's prompt, so only its new tokens need a
    forward; a new document changes the prompt from the document on."""

    prompt_tokens: int  # document, question and the answer so far
    cached_tokens: int | None  # of those, the ones the engine's prefix cache supplied (None: it does not say)
    new_document: bool  # another document than the request's step before (the first step's is new)


@dataclass
class SpeculationTrace:
    """Speculative retrieval (RaLMSpec, KNN-LM with speculation): what the speculation did."""

    output_ids: list[int] = field(default_factory=list)
    step_docs: list[str] = field(default_factory=list)  # the document each accepted step used
    speculation_steps: int = 0
    verifications: int = 0
    stride_history: list[int] = field(default_factory=list)
    cache_size: int = 0
    step_reuse: list[StepReuse] = field(default_factory=list)  # every generation step, in order (RaLMSpec)


def finalise_tokens(item: QueryState, ctx, out: list[int], record=None) -> QueryState:
    """Iterative methods that build their answer as token ids: record them (into the method's
    typed trace ``record``, a TokenTrace by default), decode, finalise."""
    record = record if record is not None else TokenTrace()
    record.output_ids = list(out)
    item.trace.method = record
    return finalise_answer(item, ctx.detokenize(out))

"""Rationale synthesis for Speculative RAG's drafter (Wang et al., 2024, §3.1 and Appendix A/G).

The paper instruction-tunes its drafter on (question, retrieved documents) → (answer,
rationale), the rationale written by a strong LM (Gemini-Ultra) that is given the question,
the gold response and the documents, and asked for the short rationale that links them.
``rationale-synthesis`` is that data step as a method of the answer job (run by `specrag
synthesize-rationales`): per training question the teacher (any causal LM spec; the 1.5B
verifier-sized model by default) writes a rationale for the gold answer from the document
subset the drafter will see at run time, and the rationale is judged before it may teach:

- the question must not be an evaluation split's (its id is refused: a dead letter);
- open tasks: the subset is the first multi-perspective subset (the method's own sampler)
  that holds a gold answer; none holding one → ``answer_not_in_documents`` (no teacher call);
- open tasks: the rationale must name a gold answer → else ``answer_not_in_rationale``;
- the teacher must judge that the rationale supports the answer (log P(Yes) > log P(No),
  the verifier's own reflection) → else ``not_entailed``: the only test for closed-set tasks,
  whose label ("true", "C") a rationale need not repeat and whose option is often a sentence
  the rationale explains rather than quotes.

Every question is a result row with its verdict in the trace (``kept``, ``reason``), so
kept and filtered counts come from the rows themselves (`pipelines/drafter.py`). The trace
holds ids and generated text only, no copy of the questions or passages: a synthesis run can
be kept and resumed anywhere, and its rows are joined with the queries and the index's
passages when the training table is written.
The paper's prompt (Appendix G) is a figure; ``TEACHER_PROMPT`` follows its description.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import numpy as np

from specrag.evaluation.metrics import contains, normalize
from specrag.inference.capabilities import EMBED, GENERATE, SCORE
from specrag.inference.types import GenerateRequest, ScoreRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import Retrieve
from specrag.methods.prompts import format_documents, task_input
from specrag.methods.subsets import SUBSET_MODES, query_seed, sample_subsets

TEACHER_PROMPT = ("Memorize the documents below and use them as if you already knew them.\n\n"
                  "Documents:\n{documents}\n\n{task}\nAnswer: {answer}\n\n"
                  "Write the rationale for this answer: in one or two short sentences, state the facts from the "
                  "documents that show why the answer is right. Use only information from the documents.")
SUPPORT_PROMPT = "{task}\nAnswer: {answer}\nRationale: {rationale}\n\nDoes the rationale support the answer? Reply yes or no."
REASONS = ("kept", "answer_not_in_documents", "answer_not_in_rationale", "not_entailed", "empty")
# how a rationale must name an open answer before the judge reads it: "words", at least half the words
# of some gold answer, each up to its inflection ("off-road vehicle" names "off-road vehicles"); "exact",
# the normalised answer as a substring (a teacher's paraphrase then fails: 7 of the 1.5B teacher's first 7)
ANSWER_MATCHES = ("words", "exact")


@dataclass(frozen=True)
class RationaleSynthesisConfig(MethodConfig):
    top_k: int = 10  # retrieved documents (the paper: up to 10, Contriever-MS MARCO)
    docs_per_draft: int = 2  # the subset the drafter sees at run time (speculative-rag's k)
    drafts: int = 5  # subsets sampled (speculative-rag's m): the first holding an answer is used
    subset_mode: str = "multi_perspective"
    max_new_tokens: int = 64  # the rationale's budget (the drafter writes at most 48 tokens of it)
    entailment: bool = True  # the teacher's yes/no judgement of support
    answer_match: str = "words"  # one of ANSWER_MATCHES
    seed: int = 0

    def validate(self) -> None:
        if self.top_k < 1 or self.docs_per_draft < 1 or self.drafts < 1 or self.max_new_tokens < 1:
            raise ValueError("top_k, docs_per_draft, drafts and max_new_tokens must be >= 1")
        if self.docs_per_draft > self.top_k:
            raise ValueError(f"docs_per_draft={self.docs_per_draft} exceeds top_k={self.top_k}")
        if self.subset_mode not in SUBSET_MODES:
            raise ValueError(f"subset_mode must be one of {SUBSET_MODES}, got {self.subset_mode!r}")
        if self.answer_match not in ANSWER_MATCHES:
            raise ValueError(f"answer_match must be one of {ANSWER_MATCHES}, got {self.answer_match!r}")


@dataclass
class RationaleTrace:
    """The verdict on one training question: the drafter's subset and target (answer, rationale)."""

    task_type: str = ""
    answer: str = ""  # what the drafter is taught to answer: the gold answer, or the option's label
    doc_ids: list[str] = field(default_factory=list)  # the subset, in the order the prompt lists it
    subset_index: int = -1  # which sampled subset (-1: none held an answer)
    rationale: str = ""
    answer_in_rationale: bool = False
    support_yes: float | None = None  # log P("Yes" | task, answer, rationale, question) under the teacher
    support_no: float | None = None
    kept: bool = False
    reason: str = ""  # one of REASONS


def gold_answer(query: dict) -> tuple[str, str, list[str]]:
    """(the drafter's answer, the answer as the teacher reads it, strings a rationale must name)."""
    answers = [a.strip() for a in query.get("answers") or [] if a and a.strip()]
    if not answers:
        raise ValueError(f"query {query['id']} has no gold answer to write a rationale for")
    if query["task_type"] == "multiple_choice":
        labels, choices = list(query.get("choice_labels") or []), list(query.get("choices") or [])
        if answers[0] not in labels:
            raise ValueError(f"query {query['id']}: gold label {answers[0]!r} is not one of {labels}")
        # an option is often a sentence the rationale explains rather than repeats: judged by entailment
        return answers[0], f"{answers[0]}. {choices[labels.index(answers[0])]}", []
    if query["task_type"] == "claim_verification":
        return answers[0].lower(), answers[0].lower(), []
    return answers[0], answers[0], answers


def same_word(a: str, b: str) -> bool:
    """Equal up to an inflection: a plural "s", or a shared stem of all but the last three letters
    of the shorter word when that stem is five letters or more ("evangelize" / "evangelizing")."""
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    if long_ == short + "s" or long_ == short + "es":
        return True
    return len(os.path.commonprefix((short, long_))) >= max(5, len(short) - 3)


def names_answer(rationale: str, must_name: list[str], match: str = "words") -> bool:
    """Whether the rationale names one of the answers; a closed-set answer needs no name: the
    entailment judgement decides. The words rule lets a teacher's paraphrase through to the judge
    ("efferent" for "efferent nerves"), which is the paper's filter; a rationale that names none
    ("Peter Finch" for "Rocky") never reaches it."""
    if not must_name:
        return True
    if match == "exact":
        return bool(contains(rationale, must_name))
    words = set(normalize(rationale).split())
    for answer in must_name:
        wanted = normalize(answer).split()
        found = sum(any(same_word(w, r) for r in words) for w in wanted)
        if wanted and 2 * found >= len(wanted):
            return True
    return False


def clean_rationale(text: str) -> str:
    """The teacher's first paragraph, one line, without a leading "Rationale:"."""
    first = text.strip().split("\n\n")[0]
    first = " ".join(first.split())
    return first[len("rationale:"):].strip() if first.lower().startswith("rationale:") else first


@dataclass
class SubsetState:
    docs: list = field(default_factory=list)  # the chosen subset's documents (Hits)


@dataclass
class CheckTrainingId(Stage):
    """A question of an evaluation split never becomes training data (a dead letter says so)."""

    name: str = "CheckTrainingId"

    async def run(self, item: QueryState, ctx) -> QueryState:
        from specrag.evaluation.splits import EVALUATION_SPLITS, evaluation_ids
        if item.id in evaluation_ids():
            raise ValueError(f"query {item.id} belongs to an evaluation split ({', '.join(EVALUATION_SPLITS)}): "
                             "it is never used for training")
        gold_answer(item.query)  # no gold answer: a dead letter before any model call
        return item


@dataclass
class ChooseSubset(Stage):
    """The drafter's document subset: the multi-perspective sampler's subsets in order, the first
    one holding a gold answer (open tasks) or the first (closed-set tasks)."""

    config: RationaleSynthesisConfig
    name: str = "ChooseSubset"

    async def run(self, item: QueryState, ctx) -> QueryState:
        c, docs = self.config, item.docs
        trace = item.trace.of(RationaleTrace)
        trace.task_type = item.query["task_type"]
        trace.answer, _, must_name = gold_answer(item.query)
        if len(docs) < c.docs_per_draft:
            trace.reason = "answer_not_in_documents"
            return item
        vectors = await ctx.embed([f"{d.title}: {d.text}" if d.title else d.text for d in docs])
        subsets = sample_subsets(np.asarray(vectors), c.docs_per_draft, c.drafts, query_seed(c.seed, item.id),
                                 c.subset_mode).subsets
        open_task = item.query["task_type"] in ("short_form", "long_form")
        for j, subset in enumerate(subsets):
            chosen = [docs[int(i)] for i in subset]
            if not open_task or contains(" ".join(f"{d.title} {d.text}" for d in chosen), must_name):
                trace.subset_index = j
                trace.doc_ids = [d.doc_id for d in chosen]
                item.state_of(SubsetState).docs = chosen
                return item
        trace.reason = "answer_not_in_documents"
        return item


@dataclass
class Rationalize(Stage):
    """The teacher's rationale for the gold answer from the subset, then its judgement."""

    config: RationaleSynthesisConfig
    name: str = "Rationalize"

    async def run(self, item: QueryState, ctx) -> QueryState:
        trace = item.trace.of(RationaleTrace)
        item.answer = trace.answer
        if trace.reason:  # no subset holds an answer
            return item
        q = item.query
        _, answer_text, must_name = gold_answer(q)
        docs = item.state_of(SubsetState).docs
        prompt = TEACHER_PROMPT.format(documents=format_documents(docs), task=task_input(q), answer=answer_text)
        out = await ctx.generate(GenerateRequest(prompt, max_new_tokens=self.config.max_new_tokens, stop=("\n\n",)),
                                 model="teacher")
        item.raw_output = out.text
        trace.rationale = clean_rationale(out.text)
        if not trace.rationale:
            trace.reason = "empty"
            return item
        trace.answer_in_rationale = names_answer(trace.rationale, must_name, self.config.answer_match)
        if not trace.answer_in_rationale:
            trace.reason = "answer_not_in_rationale"
            return item
        if self.config.entailment:
            judge = SUPPORT_PROMPT.format(task=task_input(q), answer=answer_text, rationale=trace.rationale)
            yes, no = await asyncio.gather(*(ctx.score(ScoreRequest(judge, word, chat=True), model="teacher")
                                             for word in ("Yes", "No")))
            trace.support_yes, trace.support_no = yes.total, no.total
            if not yes.total > no.total:
                trace.reason = "not_entailed"
                return item
        trace.kept, trace.reason = True, "kept"
        return item


class RationaleSynthesis(Method):
    """Training data for the drafter (run by `specrag synthesize-rationales`)."""

    name = "rationale-synthesis"
    config_class = RationaleSynthesisConfig
    needs = {"teacher": (GENERATE, SCORE), "embedder": (EMBED,)}
    state_class = SubsetState
    trace_class = RationaleTrace
    needs_retriever = True

    def stages(self):
        c = self.config
        return [CheckTrainingId(), Retrieve(c.top_k), ChooseSubset(c), Rationalize(c)]

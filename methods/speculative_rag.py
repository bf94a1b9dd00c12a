"""Speculative RAG (Wang et al., 2024): parallel drafts from diverse subsets, one-pass verification.

Stages, which the Beam graph shows one by one:
  Retrieve → SampleSubsets (fan-out: one element per subset) → Draft → Verify → Select (join).
The drafter writes an answer and a rationale from each subset of documents; the verifier
scores each draft in one teacher-forced pass over [question, draft, reflection, "Yes"]:
ρ_SC = log P(answer, rationale | Q), ρ_SR = log P("Yes" | Q, answer, rationale, R); with the
drafter's own ρ_draft = log P(answer, rationale | Q, subset) the score is their sum (the
paper's product, in log space). We run the paper's training-free form: the drafter is not
instruction-tuned for RAG, so the answer and the rationale are generated as two parts (Draft).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import numpy as np

from specrag.inference.capabilities import EMBED, GENERATE, SCORE
from specrag.inference.types import GenerateRequest, Generation, ScoreRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import Retrieve, check_closed_set, finalise_answer, option_labels, score_options
from specrag.methods.prompts import MAX_NEW_TOKENS, STOP, build_prompt, task_input
from specrag.methods.subsets import SUBSET_MODES, query_seed, sample_subsets

SCORES = ("draft", "sc", "sr")
SELECTIONS = ("score", "random")
REFLECTION = "Do you think the rationale supports the answer, yes or no?"
RATIONALE_PREFIX = "\nRationale:"


@dataclass(frozen=True)
class SpeculativeRAGConfig(MethodConfig):
    top_k: int = 10  # retrieved documents (MuSiQue: 15)
    drafts: int = 5  # m (MuSiQue: 10)
    docs_per_draft: int = 2  # k: k-means clusters, one document from each per subset
    subset_mode: str = "multi_perspective"  # ablations: random | same_cluster
    scores: tuple[str, ...] = SCORES  # ablations: drop any of draft / sc / sr
    selection: str = "score"  # ablation: random (no verification)
    answer_max_new_tokens: int | None = None  # None: the task type's default (standard RAG's)
    rationale_max_new_tokens: int = 48
    reflection: str = REFLECTION
    seed: int = 0
    # per-token means for rho_draft and rho_SC instead of the paper's sums: with small models the
    # sums mostly measure length (a long rationale costs ~100 nats), not consistency
    length_normalize: bool = False
    # decode each draft alone: drafts then do not depend on what shares their batch (slower)
    batch_invariant: bool = False
    # closed-set tasks: each draft's answer is the option the drafter scores highest on its
    # subset (log P(label) is that part of rho_draft), or "generate": parsed from free text
    closed_set: str = "score"

    def __post_init__(self):  # --set scores=draft,sc or a JSON list: stored as a tuple
        scores = self.scores.split(",") if isinstance(self.scores, str) else self.scores
        object.__setattr__(self, "scores", tuple(s.strip() for s in scores if s.strip()))

    def validate(self) -> None:
        check_closed_set(self.closed_set)
        if self.top_k < 1 or self.drafts < 1 or self.docs_per_draft < 1:
            raise ValueError("top_k, drafts and docs_per_draft must be >= 1")
        if self.docs_per_draft > self.top_k:
            raise ValueError(f"docs_per_draft={self.docs_per_draft} exceeds top_k={self.top_k}")
        if self.subset_mode not in SUBSET_MODES:
            raise ValueError(f"subset_mode must be one of {SUBSET_MODES}, got {self.subset_mode!r}")
        bad = set(self.scores) - set(SCORES)
        if bad or not self.scores and self.selection == "score":
            raise ValueError(f"scores must be a non-empty subset of {SCORES} (got {self.scores!r}); "
                             "for no verification use selection='random'")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.answer_max_new_tokens is not None and self.answer_max_new_tokens < 1:
            raise ValueError("answer_max_new_tokens must be >= 1")
        if self.rationale_max_new_tokens < 0:
            raise ValueError("rationale_max_new_tokens must be >= 0 (0: drafts without rationale)")


@dataclass
class DraftRecord:
    """One draft: the drafter's answer and rationale from one subset, and its scores."""

    index: int = 0
    doc_ids: list[str] = field(default_factory=list)
    answer: str = ""
    rationale: str = ""
    parsed: str = "empty"  # ok | no_rationale | empty
    raw: str = ""  # the drafter's own output, both parts
    rho_draft: float = 0.0  # log P(answer, rationale | Q, subset) under the drafter
    rho_sc: float | None = None  # log P(answer, rationale | Q) under the verifier
    rho_sr: float | None = None  # log P("Yes" | Q, answer, rationale, R) under the verifier
    draft_tokens: int = 0
    sc_tokens: int = 0
    option_logprobs: list[float] = field(default_factory=list)  # closed-set: log P(label | Q, subset) per option
    score: float | None = None  # the combined score the selection used (None: random selection)

    @property
    def text(self) -> str:
        return draft_text(self.answer, self.rationale).strip()


@dataclass
class SpeculativeRAGState:
    """Carried from SampleSubsets to Select: a part's subset (indexes into the documents) and draft."""

    subset: list[int] = field(default_factory=list)
    draft: DraftRecord | None = None


@dataclass
class SpeculativeRAGTrace:
    """The results' ``trace`` column: clusters, every draft with its scores, the chosen one."""

    clusters: list[list[str]] = field(default_factory=list)
    drafts: list[DraftRecord] = field(default_factory=list)
    chosen_draft: int | None = None


def parse_draft(answer_output: str, rationale_output: str) -> tuple[str, str, str]:
    """(answer, rationale, status): status "ok", "no_rationale" (an answer only) or "empty"."""
    answer = answer_output.strip().splitlines()[0].strip() if answer_output.strip() else ""
    rationale = " ".join(rationale_output.strip().split("\n\n")[0].split())
    if not answer:
        return "", rationale, "empty"
    return answer, rationale, "ok" if rationale else "no_rationale"


def draft_text(answer: str, rationale: str) -> str:
    """How a draft reads to the verifier (and in the trace)."""
    return f" {answer}\nRationale: {rationale}" if rationale else f" {answer}"


def draft_target_ids(tokenize, answer: str, rationale: str, end_ids: Sequence[int]) -> list[int]:
    """What a tuned drafter learns to write after the Draft prompt (train-drafter): the answer's
    tokens and the marker's, as Draft feeds them back before the rationale, then the rationale
    and the end of the turn, so training and drafting see the same tokens."""
    return [*tokenize(answer), *tokenize(RATIONALE_PREFIX), *tokenize(" " + rationale), *end_ids]


def combined_score(draft: DraftRecord, used: tuple[str, ...], length_normalize: bool = False) -> float:
    """Sum of the used log-scores; an unparsable draft is -inf (never chosen over a real one)."""
    if draft.parsed == "empty":
        return -math.inf
    rho = {"draft": draft.rho_draft, "sc": draft.rho_sc, "sr": draft.rho_sr}
    if length_normalize:
        rho["draft"] = draft.rho_draft / max(draft.draft_tokens, 1)
        rho["sc"] = draft.rho_sc / max(draft.sc_tokens, 1) if draft.rho_sc is not None else None
    return float(sum(rho[name] for name in used))


def choose_draft(drafts: list[DraftRecord], config: SpeculativeRAGConfig, query_id: str) -> DraftRecord:
    """Set each draft's combined score and return the selected draft: the argmax (ties to
    the lowest index) or, for the random-selection ablation, a seeded pick among parsable ones."""
    for d in drafts:
        d.score = combined_score(d, config.scores, config.length_normalize) if config.selection == "score" else None
    if config.selection == "random":
        pool = [d for d in drafts if d.parsed != "empty"] or drafts
        return pool[int(np.random.default_rng(query_seed(config.seed + 1, query_id)).integers(len(pool)))]
    return max(drafts, key=lambda d: (d.score, -d.index))


@dataclass
class SampleSubsets(Stage):
    """Embed the retrieved documents, cluster them, fan out one element per subset."""

    config: SpeculativeRAGConfig
    name: str = "SampleSubsets"

    async def run(self, item: QueryState, ctx) -> list[QueryState]:
        c = self.config
        docs = item.docs
        vectors = await ctx.embed([f"{d.title}: {d.text}" if d.title else d.text for d in docs]) if docs else []
        sampled = sample_subsets(np.asarray(vectors), c.docs_per_draft, c.drafts, query_seed(c.seed, item.id),
                                 c.subset_mode)
        item.trace.of(SpeculativeRAGTrace).clusters = [[docs[i].doc_id for i in cl] for cl in sampled.clusters]
        parts = []
        for j, subset in enumerate(sampled.subsets):
            part = item.fork(j, len(sampled.subsets))
            part.state_of(SpeculativeRAGState).subset = [int(i) for i in subset]
            parts.append(part)
        return parts


@dataclass
class Draft(Stage):
    """The drafter's answer and rationale from one subset; ρ_draft from its own logprobs.

    Two batched calls: the answer (the standard RAG prompt on the subset, so a draft is as
    good as the drafter's plain answer), then the rationale, continuing after the answer's own
    tokens and a forced "Rationale:". An untuned 135M drafter does not keep a two-part format
    when asked (it stops after one sentence, often with no answer at all); forcing the marker
    gives every draft both parts. ρ_draft sums the drafter's logprobs of both generated parts.
    """

    config: SpeculativeRAGConfig
    name: str = "Draft"

    async def run(self, item: QueryState, ctx) -> QueryState:
        c, q = self.config, item.query
        state = item.state_of(SpeculativeRAGState)
        docs = [item.docs[i] for i in state.subset]
        prompt = build_prompt(q, docs)
        labels = option_labels(q, c.closed_set)
        option_lps: list[float] = []
        if labels:  # the answer part is the drafter's most probable option
            option_lps = await score_options(ctx, q, docs, labels, c.closed_set, model="drafter")
            best = max(range(len(labels)), key=lambda i: (option_lps[i], -i))
            ids = ctx.tokenize(labels[best], model="drafter")
            first = Generation(labels[best], list(ids), [option_lps[best]] + [0.0] * (len(ids) - 1), 0, "stop")
        else:
            first = await ctx.generate(GenerateRequest(
                prompt, stop=STOP[q["task_type"]],
                max_new_tokens=c.answer_max_new_tokens or MAX_NEW_TOKENS[q["task_type"]],
                batch_invariant=c.batch_invariant), model="drafter")
        answer_ids = list(first.token_ids)
        rationale_text, rationale_lp, second = "", [], None
        if first.text.strip() and c.rationale_max_new_tokens:
            # the answer's own tokens up to its line break, then the marker
            keep = tuple(ctx.tokenize(first.text.strip().splitlines()[0], model="drafter"))
            marker = tuple(ctx.tokenize(RATIONALE_PREFIX, model="drafter"))
            second = await ctx.generate(GenerateRequest(prompt, stop=("\n\n",), continuation_ids=keep + marker,
                                                        max_new_tokens=c.rationale_max_new_tokens,
                                                        batch_invariant=c.batch_invariant), model="drafter")
            rationale_text, rationale_lp = second.text, second.token_logprobs
        answer, rationale, status = parse_draft(first.text, rationale_text)
        state.draft = DraftRecord(
            index=item.part, doc_ids=[d.doc_id for d in docs], raw=first.text + RATIONALE_PREFIX + rationale_text,
            answer=answer, rationale=rationale, parsed=status,
            rho_draft=float(sum(first.token_logprobs) + sum(rationale_lp)),
            draft_tokens=len(answer_ids) + (len(second.token_ids) if second else 0), option_logprobs=option_lps)
        return item


@dataclass
class Verify(Stage):
    """ρ_SC and ρ_SR from one forward pass of the verifier over [Q, draft, R, "Yes"]."""

    config: SpeculativeRAGConfig
    name: str = "Verify"

    async def run(self, item: QueryState, ctx) -> QueryState:
        d = item.state_of(SpeculativeRAGState).draft
        d.rho_sc = d.rho_sr = None
        d.sc_tokens = 0
        if {"sc", "sr"} & set(self.config.scores) and self.config.selection == "score" and d.parsed != "empty":
            segments = (f"Answer:{draft_text(d.answer, d.rationale)}",
                        f"\n{self.config.reflection}\nAnswer:", " Yes")
            scored = await ctx.score(ScoreRequest.of_segments(task_input(item.query) + "\n", segments),
                                     model="verifier")
            d.rho_sc, _, d.rho_sr = scored.segment_totals()
            d.sc_tokens = scored.segment_lengths[0]
        return item


@dataclass
class Select(Stage):
    """Join a query's drafts (all m, by query id) and keep the best-scored one."""

    config: SpeculativeRAGConfig
    name: str = "Select"
    gather: ClassVar[bool] = True

    async def run(self, item: QueryState, ctx) -> QueryState:
        c = self.config
        drafts = [p.state_of(SpeculativeRAGState).draft for p in item.gathered]
        chosen = choose_draft(drafts, c, item.id)
        trace = item.trace.of(SpeculativeRAGTrace)
        trace.drafts, trace.chosen_draft = drafts, chosen.index
        item.gathered, item.method_state = None, None  # the parts are in the trace now
        return finalise_answer(item, chosen.answer)


class SpeculativeRAG(Method):
    name = "speculative-rag"
    config_class = SpeculativeRAGConfig
    needs = {"drafter": (GENERATE, SCORE), "verifier": (SCORE,), "embedder": (EMBED,)}
    needs_retriever = True
    state_class = SpeculativeRAGState
    trace_class = SpeculativeRAGTrace

    def stages(self):
        c = self.config
        return [Retrieve(c.top_k), SampleSubsets(c), Draft(c), Verify(c), Select(c)]

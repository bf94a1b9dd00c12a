"""AED-RAG (Zhou et al.): utility-weighted ensemble decoding over passages, triplets and the
model's own background passage.

Stages, which the Beam graph shows one by one (fused into one ParDo: no keyed join):
  Retrieve (top-k) → ScoreUnits (the utility predictor S_phi over each passage and each
  passage's triplet set) → SelfSufficiency (the reader writes a background passage d_ss,
  S_phi scores it) → FusedDecode (w = softmax(U_D, U_T, U_ss); y_t = argmax_v
  sum_z w_z log P(v | q, z, y_<t), the three streams decoded together by the backend).
U_z = sum_j beta^(j-1) s_(j) over the top-m scores of a granularity (eq. 11). Ablations are
settings: no triplets, no d_ss, no fusion (rerank only: the top-m passages in one prompt),
the untrained predictor (cosine similarity of MiniLM embeddings), any m.

``aed-label`` is the training side (Algorithm 1): for a training question with its gold
answer, the contrastive perplexity CPPL(u, a | q) of every unit u of U_mix (retrieved
passages, their triplet sets, a self-generated passage), by the reader's ``score``
operation with the no-context prompt as contrast; ``specrag label-utility`` runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from specrag.inference.capabilities import EMBED, FUSED_DECODE, GENERATE, RERANK, SCORE
from specrag.inference.types import FusedDecodeRequest, GenerateRequest, ScoreRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import Retrieve, finalise_answer
from specrag.methods.prompts import AED_SELF_SUFFICIENCY, aed_context, aed_prompt
from specrag.retrieval.base import passage_text
from specrag.retrieval.triplets import format_triplet_set

PREDICTORS = ("trained", "similarity")
STREAMS = ("passages", "triplets", "self")


@dataclass(frozen=True)
class AEDRAGConfig(MethodConfig):
    top_k: int = 10  # retrieved passages (paper: 10)
    m: int = 2  # top-m passages and top-m triplet sets per stream (paper: 2; m=1 also reported)
    beta: float = 0.5  # visibility of lower-ranked units in U_z (eq. 11)
    predictor: str = "trained"  # S_phi: the trained utility model (role `utility`), or `similarity`
    # (cosine of MiniLM embeddings: the untrained-predictor ablation)
    triplets: bool = True  # ablation "w/o AED (triplets)": streams D and d_ss only
    self_sufficiency: bool = True  # ablation "w/o AED (ssp)": streams D and T only
    fusion: bool = True  # ablation "w/o AED (full)": rerank only, the top-m passages in one prompt
    ss_max_new_tokens: int = 128  # d_ss: "background ... in 100 words"
    max_new_tokens: int = 32

    def validate(self) -> None:
        if self.top_k < 1 or self.m < 1:
            raise ValueError("top_k and m must be >= 1")
        if self.m > self.top_k:
            raise ValueError(f"m={self.m} exceeds top_k={self.top_k}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.predictor not in PREDICTORS:
            raise ValueError(f"predictor must be one of {PREDICTORS}, got {self.predictor!r}")
        if self.ss_max_new_tokens < 1 or self.max_new_tokens < 1:
            raise ValueError("ss_max_new_tokens and max_new_tokens must be >= 1")


@dataclass
class AEDRAGTrace:
    """Every unit's score, the chosen units, the utilities, the weights and the streams."""

    passage_ids: list[str] = field(default_factory=list)
    passage_scores: list[float] = field(default_factory=list)  # S_phi(q, d) per retrieved passage
    triplet_counts: list[int] = field(default_factory=list)  # triplets in each passage's set
    triplet_scores: list[float] = field(default_factory=list)  # S_phi(q, T_i) (NaN: empty set)
    chosen_passages: list[str] = field(default_factory=list)  # top-m passages, best first
    chosen_triplet_sets: list[str] = field(default_factory=list)  # passage ids of the top-m sets
    self_passage: str = ""  # d_ss
    utility_passages: float = 0.0  # U_D
    utility_triplets: float = 0.0  # U_T
    utility_self: float = 0.0  # U_ss
    weights: list[float] = field(default_factory=list)  # w for (passages, triplets, self); 0: not used
    streams: list[str] = field(default_factory=list)  # the streams decoded


@dataclass
class AEDState:
    passage_scores: list[float] = field(default_factory=list)
    triplet_sets: list[tuple] = field(default_factory=list)
    triplet_scores: list[float] = field(default_factory=list)
    self_passage: str = ""
    self_score: float = 0.0


def sequential_utility(scores: list[float], m: int, beta: float) -> tuple[float, list[int]]:
    """U = sum_j beta^(j-1) s_(j) over the m best scores (eq. 11), and their indices (stable)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:m]
    return float(sum(beta ** j * scores[i] for j, i in enumerate(order))), order


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def triplet_set(ctx, passage_id: str) -> tuple:
    """A passage's triplets (``extract-triplets`` output, the ``triplets`` resource); KeyError
    for a passage the extraction never saw."""
    return ctx.resource("triplets")[passage_id]


async def unit_scores(ctx, question: str, texts: list[str], predictor: str) -> list[float]:
    """S_phi(q, u) per unit: the utility model's logits, or cosine similarity of embeddings."""
    if not texts:
        return []
    if predictor == "trained":
        return await ctx.rerank(question, texts)
    vectors = await ctx.embed([question, *texts])
    return [float(x) for x in vectors[1:] @ vectors[0]]


def self_sufficiency_request(question: str, max_new_tokens: int) -> GenerateRequest:
    return GenerateRequest(AED_SELF_SUFFICIENCY.format(query=question), max_new_tokens=max_new_tokens)


@dataclass
class ScoreUnits(Stage):
    """S_phi over each retrieved passage and each passage's triplet set (empty sets: none)."""

    config: AEDRAGConfig
    name: str = "ScoreUnits"

    async def run(self, item: QueryState, ctx) -> QueryState:
        if item.query.get("task_type", "short_form") not in AEDRAG.task_types:  # in-memory runs skip validation
            raise ValueError(f"aed-rag answers short-form questions (its prompt asks for a few words); query "
                             f"{item.id} is {item.query['task_type']}")
        state = item.state_of(AEDState)
        question = item.query["question"]
        texts = [passage_text(d.title, d.text) for d in item.docs]
        state.triplet_sets = [triplet_set(ctx, d.doc_id) for d in item.docs] if self.config.triplets else []
        filled = [i for i, ts in enumerate(state.triplet_sets) if ts]
        scores = await unit_scores(ctx, question, texts + [format_triplet_set(state.triplet_sets[i]) for i in filled],
                                   self.config.predictor)
        state.passage_scores = scores[:len(texts)]
        state.triplet_scores = [math.nan] * len(state.triplet_sets)
        for i, s in zip(filled, scores[len(texts):]):
            state.triplet_scores[i] = s
        return item


@dataclass
class SelfSufficiency(Stage):
    """The reader's own background passage d_ss (the model's parametric memory), scored."""

    config: AEDRAGConfig
    name: str = "SelfSufficiency"

    async def run(self, item: QueryState, ctx) -> QueryState:
        if not self.config.self_sufficiency or not self.config.fusion:
            return item
        state = item.state_of(AEDState)
        question = item.query["question"]
        out = await ctx.generate(self_sufficiency_request(question, self.config.ss_max_new_tokens))
        state.self_passage = out.text.strip()
        [state.self_score] = await unit_scores(ctx, question, [state.self_passage or "N/A"], self.config.predictor)
        return item


@dataclass
class FusedDecode(Stage):
    """w = softmax over the enabled streams' utilities; one fused greedy decode (eq. 13-14)."""

    config: AEDRAGConfig
    name: str = "FusedDecode"

    async def run(self, item: QueryState, ctx) -> QueryState:
        c = self.config
        state = item.state_of(AEDState)
        trace = item.trace.of(AEDRAGTrace)
        question = item.query["question"]
        u_d, top_d = sequential_utility(state.passage_scores, c.m, c.beta)
        filled = [i for i, s in enumerate(state.triplet_scores) if not math.isnan(s)]
        u_t, top_t = sequential_utility([state.triplet_scores[i] for i in filled], c.m, c.beta)
        top_t = [filled[j] for j in top_t]
        passages = [passage_text(item.docs[i].title, item.docs[i].text) for i in top_d]
        streams: dict[str, tuple[str, float]] = {"passages": (aed_prompt(aed_context(passages), question), u_d)}
        if c.fusion and top_t:
            triplets = aed_context([format_triplet_set(state.triplet_sets[i]) for i in top_t])
            streams["triplets"] = (aed_prompt(triplets, question), u_t)
        if c.fusion and c.self_sufficiency:
            streams["self"] = (aed_prompt(state.self_passage, question), state.self_score)
        weights = softmax([u for _, u in streams.values()])
        if len(streams) == 1:
            out = await ctx.generate(GenerateRequest(streams["passages"][0], max_new_tokens=c.max_new_tokens))
        else:
            out = await ctx.fused_decode(FusedDecodeRequest(tuple(p for p, _ in streams.values()), tuple(weights),
                                                            max_new_tokens=c.max_new_tokens))
        by_stream = dict(zip(streams, weights))
        trace.passage_ids = [d.doc_id for d in item.docs]
        trace.passage_scores = list(state.passage_scores)
        trace.triplet_counts = [len(ts) for ts in state.triplet_sets]
        trace.triplet_scores = list(state.triplet_scores)
        trace.chosen_passages = [item.docs[i].doc_id for i in top_d]
        trace.chosen_triplet_sets = [item.docs[i].doc_id for i in top_t] if "triplets" in streams else []
        trace.self_passage = state.self_passage
        trace.utility_passages, trace.utility_triplets, trace.utility_self = u_d, u_t, state.self_score
        trace.weights = [by_stream.get(s, 0.0) for s in STREAMS]
        trace.streams = list(streams)
        return finalise_answer(item, out.text)


class AEDRAG(Method):
    name = "aed-rag"
    config_class = AEDRAGConfig
    needs = {"generator": (GENERATE, FUSED_DECODE), "utility": (RERANK,)}
    trace_class = AEDRAGTrace
    state_class = AEDState
    needs_retriever = True
    resources = ("triplets",)
    task_types = ("short_form",)  # the paper's prompt asks for an answer in a few words

    def __init__(self, config: MethodConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        # what this configuration calls: the untrained ablation embeds instead of reranking,
        # rerank-only decodes one stream, no triplets reads no triplet folder
        needs = {"generator": (GENERATE, FUSED_DECODE) if self.config.fusion else (GENERATE,)}
        needs["utility" if self.config.predictor == "trained" else "embedder"] = \
            (RERANK,) if self.config.predictor == "trained" else (EMBED,)
        self.needs = needs
        self.model_roles = tuple(needs)
        self.resources = ("triplets",) if self.config.triplets and self.config.fusion else ()

    def stages(self):
        c = self.config
        return [Retrieve(c.top_k), ScoreUnits(c), SelfSufficiency(c), FusedDecode(c)]


# --- training labels (Algorithm 1) ---------------------------------------------------------

UNIT_KINDS = ("passage", "triplets", "self")


@dataclass(frozen=True)
class AEDLabelConfig(MethodConfig):
    top_k: int = 10  # retrieved passages per training question (paper: 20 with Contriever)
    alpha: float = 0.5  # CPPL contrast (CAD's alpha)
    gen_max_new_tokens: int = 128  # d_gen, the self-generated passage
    triplets: bool = True

    def validate(self) -> None:
        if self.top_k < 1 or self.gen_max_new_tokens < 1:
            raise ValueError("top_k and gen_max_new_tokens must be >= 1")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")


@dataclass
class UnitLabel:
    kind: str = ""  # passage | triplets | self
    unit_id: str = ""  # the passage id (its triplet set's too); "" for the self-generated passage
    text: str = ""  # what the predictor reads
    cppl: float = 0.0  # contrastive perplexity of the gold answer given this unit (>= 1)


@dataclass
class AEDLabelTrace:
    question: str = ""
    answer: str = ""  # the gold answer scored (the first alias)
    answer_tokens: int = 0
    units: list[UnitLabel] = field(default_factory=list)


def contrastive_perplexity(token_logprobs: list[float]) -> float:
    """CPPL = exp(-mean_j log p~(a_j)) (eq. 3)."""
    return float(math.exp(-float(np.mean(token_logprobs))))


@dataclass
class LabelUnits(Stage):
    """d_gen, then CPPL of every unit of U_mix given the gold answer (one score batch)."""

    config: AEDLabelConfig
    name: str = "LabelUnits"

    async def run(self, item: QueryState, ctx) -> QueryState:
        import asyncio
        q = item.query
        answers = [a for a in q.get("answers") or [] if a and a.strip()]
        if not answers:
            raise ValueError(f"query {q['id']} has no gold answer to label units with")
        answer, question = answers[0].strip(), q["question"]
        gen = await ctx.generate(self_sufficiency_request(question, self.config.gen_max_new_tokens))
        units = [UnitLabel("passage", d.doc_id, passage_text(d.title, d.text)) for d in item.docs]
        if self.config.triplets:
            units += [UnitLabel("triplets", d.doc_id, format_triplet_set(ts)) for d in item.docs
                      if (ts := triplet_set(ctx, d.doc_id))]
        units.append(UnitLabel("self", "", gen.text.strip() or "N/A"))
        base = aed_prompt("", question)
        scored = await asyncio.gather(*(ctx.score(ScoreRequest(aed_prompt(u.text, question), answer, chat=True,
                                                               contrast_prompt=base, alpha=self.config.alpha),
                                                  model="generator") for u in units))
        for u, s in zip(units, scored):
            u.cppl = contrastive_perplexity(s.token_logprobs)
        trace = item.trace.of(AEDLabelTrace)
        trace.question, trace.answer, trace.units = question, answer, units
        trace.answer_tokens = len(scored[0].token_logprobs)
        item.answer = answer
        return item


class AEDLabel(Method):
    """Training labels for AED-RAG's utility predictor (run by `specrag label-utility`)."""

    name = "aed-label"
    config_class = AEDLabelConfig
    needs = {"generator": (GENERATE, SCORE)}
    trace_class = AEDLabelTrace
    needs_retriever = True
    resources = ("triplets",)

    def __init__(self, config: MethodConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.resources = ("triplets",) if self.config.triplets else ()

    def stages(self):
        return [Retrieve(self.config.top_k), LabelUnits(self.config)]

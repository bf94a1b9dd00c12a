"""SPS, Staged Parallel Speculation (Algorithm 1): staged retrieval overlapped with chunked generation.

The answer grows in chunks (50 tokens). Per stage: cluster the current documents into k
groups, draw m subsets (one document per group; Speculative RAG's sampler), generate m
candidate chunks in one batched call, embed the m candidate answers [C; c_j] and keep the one
most similar to the others (argmax_j Σ_i cos U_ij). Retrieval for the next documents uses the
question plus the whole answer so far and runs *while* the chunk is generated, so a chunk is
written with documents one chunk stale (paper Fig. 1): chunks 1 and 2 use the question's
documents, chunk i ≥ 3 those retrieved for [Q; C_1..C_{i-2}]. The loop is one stage (a loop is
no Beam graph): each query is one keyed element, its stages a coroutine on the engine.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from specrag.inference.capabilities import EMBED, GENERATE, SCORE
from specrag.inference.types import GenerateRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import Retrieve, check_closed_set, finalise_tokens, option_labels, score_options
from specrag.methods.prompts import MAX_NEW_TOKENS, STOP, build_prompt
from specrag.methods.subsets import SUBSET_MODES, query_seed, sample_subsets

SELECTIONS = ("self_consistency", "random")


@dataclass(frozen=True)
class SPSConfig(MethodConfig):
    top_k: int = 10  # documents per retrieval (ASQA: 5)
    groups: int = 5  # k-means groups = documents per subset (ASQA: 3)
    candidates: int = 5  # m candidate chunks per stage
    chunk_tokens: int = 50
    max_new_tokens: int | None = None  # None: the task type's default
    staged_retrieval: bool = True  # ablation: False = static retrieval (question only)
    selection: str = "self_consistency"  # ablation: random
    subset_mode: str = "multi_perspective"  # ablation: random
    # the paper's prompt (Appendix A): instruction, question, then the subset's documents, so a stage's
    # m candidates share a prefix (vLLM caches it once); False: the other methods' order, documents first
    question_first: bool = True
    seed: int = 0
    # closed-set tasks: one stage whose candidates are the options each subset scores highest,
    # kept by the same self-consistency (a majority vote), or "generate": parsed from free text
    closed_set: str = "score"

    def validate(self) -> None:
        check_closed_set(self.closed_set)
        for name in ("top_k", "groups", "candidates", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.groups > self.top_k:
            raise ValueError(f"groups={self.groups} exceeds top_k={self.top_k}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.subset_mode not in ("multi_perspective", "random"):
            raise ValueError(f"subset_mode must be multi_perspective or random (of {SUBSET_MODES}), "
                             f"got {self.subset_mode!r}")


def most_consistent(embeddings: np.ndarray) -> tuple[int, list[float]]:
    """argmax_i Σ_j cos(e_i, e_j) (ties to the lowest index) and the row sums."""
    e = np.asarray(embeddings, dtype=np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    sums = (e @ e.T).sum(axis=1)
    return int(np.argmax(sums)), [float(x) for x in sums]


def shared_first(subsets: list[list[int]]) -> list[list[int]]:
    """Each subset's documents, those in more of the subsets first (ties: retrieval rank). With the
    question before the documents, the m prompts of a stage then share the longest prefix their
    documents allow: k-means singletons, in every subset of one document per group, lead them all.
    The subsets are the same sets; only the order the prompt lists them in changes."""
    count = Counter(d for subset in subsets for d in subset)
    return [sorted(subset, key=lambda d: (-count[d], d)) for subset in subsets]


@dataclass
class NextRetrieval:
    """The retrieval started during a stage, for the stage after it (times from the query's start)."""

    query: str = ""
    for_stage: int = 0
    start: float = 0.0
    end: float | None = None  # None: cancelled before it answered
    doc_ids: list[str] = field(default_factory=list)
    used: bool | None = None  # False: the answer ended first, the documents were not needed
    cancelled: bool | None = None


@dataclass
class SPSStage:
    """One stage of Algorithm 1: its documents, the m candidate chunks, the one kept."""

    stage: int = 0
    doc_ids: list[str] = field(default_factory=list)
    docs_query: str = ""  # the query the documents were retrieved for
    gen_start: float = 0.0
    gen_end: float = 0.0
    subsets: list[list[str]] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    similarity: list[float] = field(default_factory=list)  # Σ_i cos U_ij per candidate ([] for random)
    option_logprobs: list[list[float]] = field(default_factory=list)  # closed-set: per candidate, per option
    # per candidate: its prompt's tokens and those the engine's prefix cache supplied (None: not said)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int | None] = field(default_factory=list)
    chosen: int = 0
    next_retrieval: NextRetrieval | None = None


@dataclass
class SPSTrace:
    output_ids: list[int] = field(default_factory=list)
    stages: list[SPSStage] = field(default_factory=list)


class StagedLoop(Stage):
    """Algorithm 1 for one query: the retrieval for the next stage overlaps this stage's chunks."""

    name = "StagedGenerate"

    def __init__(self, config: SPSConfig):
        self.config = config

    async def run(self, item: QueryState, ctx) -> QueryState:
        c, q = self.config, item.query
        limit = c.max_new_tokens or MAX_NEW_TOKENS[q["task_type"]]
        rng = np.random.default_rng(query_seed(c.seed, item.id))
        clock = time.perf_counter
        t0 = clock()
        docs = item.docs  # RET_0: the question's documents (Retrieve stage), for chunks 1 and 2
        labels = option_labels(q, c.closed_set)
        if labels:
            return await self._choose_option(item, ctx, docs, labels, rng)
        docs_query = q["question"]
        answer: list[int] = []
        stages: list[SPSStage] = []
        while True:
            ctx.next_step()
            n = len(stages) + 1
            record = SPSStage(stage=n, doc_ids=[d.doc_id for d in docs], docs_query=docs_query)
            task, info = None, None
            if c.staged_retrieval and answer:
                # documents for stage n+1, from the whole answer so far, fetched while chunk n is written
                info = NextRetrieval(query=f"{q['question']} {ctx.detokenize(answer)}", for_stage=n + 1,
                                     start=clock() - t0)
                task = ctx.spawn(self._retrieve(ctx, info, t0))
            record.gen_start = clock() - t0
            subsets, candidates = await self._candidates(item, ctx, docs, answer, min(c.chunk_tokens, limit - len(answer)),
                                                         rng)
            texts = [ctx.detokenize(answer + list(g.token_ids)) for g in candidates]
            if c.selection == "random":
                chosen, sims = int(rng.integers(len(candidates))), []
            else:
                chosen, sims = most_consistent(await ctx.embed(texts))
            record.gen_end = clock() - t0
            pick = candidates[chosen]
            answer += list(pick.token_ids)
            record.subsets = [[docs[i].doc_id for i in sub] for sub in subsets]
            record.candidates = [ctx.detokenize(g.token_ids) for g in candidates]
            record.similarity, record.chosen, record.next_retrieval = sims, chosen, info
            record.prompt_tokens = [g.prompt_tokens for g in candidates]
            record.cached_tokens = [g.cached_tokens for g in candidates]
            stages.append(record)
            finished = pick.finish_reason == "stop" or len(answer) >= limit
            if task is not None and finished:  # the answer is complete: that retrieval is not needed
                info.used, info.cancelled = False, not task.done()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if finished:
                break
            if task is not None:
                docs, docs_query = await task, info.query
                info.used = True
        return finalise_tokens(item, ctx, answer, SPSTrace(stages=stages))

    async def _choose_option(self, item, ctx, docs, labels, rng) -> QueryState:
        """A closed-set answer is one stage: each subset's candidate is the option it scores
        highest; the most consistent candidate (embedding similarity: the majority) is the choice."""
        c, q = self.config, item.query
        sampled = sample_subsets(await self._doc_vectors(ctx, docs), c.groups, c.candidates,
                                 int(rng.integers(2 ** 63)), c.subset_mode)
        t0 = time.perf_counter()
        scores = await asyncio.gather(*(score_options(ctx, q, [docs[i] for i in sub], labels, c.closed_set)
                                        for sub in sampled.subsets))
        candidates = [labels[max(range(len(labels)), key=lambda i: (lps[i], -i))] for lps in scores]
        if c.selection == "random":
            chosen, sims = int(rng.integers(len(candidates))), []
        else:
            chosen, sims = most_consistent(await ctx.embed(candidates))
        record = SPSStage(stage=1, doc_ids=[d.doc_id for d in docs], docs_query=q["question"], gen_end=time.perf_counter() - t0,
                          subsets=[[docs[i].doc_id for i in sub] for sub in sampled.subsets], candidates=candidates,
                          similarity=sims, chosen=chosen, option_logprobs=[list(lps) for lps in scores])
        item.trace.method = SPSTrace(stages=[record])
        item.choice = item.answer = candidates[chosen]
        item.raw_output = f"{candidates[chosen]} (candidates: {', '.join(candidates)})"
        return item

    @staticmethod
    async def _doc_vectors(ctx, docs) -> np.ndarray:
        if not docs:
            return np.zeros((0, 1), dtype=np.float32)
        return np.asarray(await ctx.embed([f"{d.title}: {d.text}" if d.title else d.text for d in docs]))

    async def _retrieve(self, ctx, info: NextRetrieval, t0: float):
        hits = await ctx.retrieve(info.query, self.config.top_k, stage=self.name)
        info.end = time.perf_counter() - t0
        info.doc_ids = [h.doc_id for h in hits]
        return hits

    async def _candidates(self, item, ctx, docs, answer, budget, rng):
        c, q = self.config, item.query
        sampled = sample_subsets(await self._doc_vectors(ctx, docs), c.groups, c.candidates, int(rng.integers(2 ** 63)),
                                 c.subset_mode)
        subsets = shared_first(sampled.subsets) if c.question_first else sampled.subsets
        requests = [GenerateRequest(build_prompt(q, [docs[i] for i in s], c.question_first), max_new_tokens=budget,
                                    stop=STOP[q["task_type"]], continuation_ids=tuple(answer)) for s in subsets]
        return subsets, list(await asyncio.gather(*(ctx.generate(r) for r in requests)))


class SPS(Method):
    name = "sps"
    config_class = SPSConfig
    needs = {"generator": (GENERATE, SCORE), "embedder": (EMBED,)}
    needs_retriever = True
    trace_class = SPSTrace

    def stages(self):
        return [Retrieve(self.config.top_k), StagedLoop(self.config)]

"""RaLMSpec: speculative retrieval from a local cache, batched verification, exact outputs.

Algorithm 1 of the paper: the first document comes from the index (the cache is filled
with it — with its top-k under prefetching); then rounds of ``s`` speculation steps, each
taking its document from the request's cache (ranked by the index's own score) and
generating ``stride`` tokens; then one batched index retrieval for the round's ``s``
queries. The first mismatch rolls the output back to that step, which is regenerated with
the true document (exactly RaLMSeq's step). Verified results go into the cache.

Extras, each switchable: ``prefetch`` (top-``search_k`` of every index retrieval into the
cache, paper 20), ``os3`` (stride from methods/os3.py, starting at 1),
``sequential_fallback`` (not in the paper, on by default: before each round the measured
costs decide whether speculation can pay; where it cannot — cheap retrieval — the loop takes
RaLMSeq's own sequential step, with no cache look-up and nothing to roll back), and
``async_verification`` (one more speculation step runs while the round is verified —
concurrent tasks on the engine: the index search in the retriever's thread, the cache
lookup and generation in theirs; kept if the round verifies, dropped otherwise).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Sequence

from specrag.methods.base import Method, QueryState, Stage
from specrag.methods.common import SpeculationTrace
from specrag.methods.os3 import StrideScheduler
from specrag.methods.ralm import RaLMConfig, RaLMSteps
from specrag.retrieval.base import Hit
from specrag.retrieval.speculation import SpeculationCache



async def score_docs(ctx, query: str, doc_ids: Sequence[str]) -> list[float]:
    """The retriever's own scores of the cached documents (the speculation cache ranks with the
    index's metric), batched across queries in a lane of its own: a cache lookup never queues
    behind a slow index search running at the same time (asynchronous verification)."""
    [scores] = await ctx.call("score_many", "retriever", [(query, tuple(doc_ids))], "retrieval_s",
                              lane="retriever-cache")
    ctx.trace.count("cache_hits")
    return scores

@dataclass(frozen=True)
class RaLMSpecConfig(RaLMConfig):
    speculation_stride: int = 3  # s without OS³ (paper)
    prefetch: bool = False  # P: cache the top-search_k of every index retrieval, not just the top-1
    os3: bool = False  # S: adaptive stride
    async_verification: bool = False  # A: one speculation step overlapped with verification
    sequential_fallback: bool = True  # a sequential step where speculation cannot pay (methods/os3.py)
    os3_window: int = 5
    os3_gamma_max: float = 0.6
    os3_max_stride: int = 16

    def validate(self) -> None:
        super().validate()
        if self.speculation_stride < 1:
            raise ValueError(f"speculation_stride must be >= 1, got {self.speculation_stride}")
        StrideScheduler(self.os3_window, self.os3_gamma_max, self.os3_max_stride)  # validates


@dataclass
class _Speculated:
    """One speculation step: its query, guessed document, where it started, what it generated."""

    query: str
    doc: Hit
    start: int
    tokens: list[int]
    finished: bool


class RaLMSpecLoop(Stage):
    def __init__(self, config: RaLMSpecConfig, name: str = "RaLMSpec"):
        self.config = config
        self.name = name

    async def run(self, item: QueryState, ctx) -> QueryState:
        cfg = self.config
        steps = RaLMSteps(item, ctx, cfg, self.name)
        cache, known = SpeculationCache(), {}
        scheduler = StrideScheduler(cfg.os3_window, cfg.os3_gamma_max, cfg.os3_max_stride, cfg.async_verification)
        fixed = None if cfg.os3 else cfg.speculation_stride
        stats = SpeculationTrace()
        out: list[int] = []
        docs: list[str] = []

        def remember(hits: list[Hit]) -> None:
            keep = hits if cfg.prefetch else hits[:1]
            cache.add(h.doc_id for h in keep)
            known.update((h.doc_id, h) for h in keep)

        async def speculate() -> _Speculated:
            start_t = time.perf_counter()
            query = steps.query_text(out)
            ids = cache.ids  # a snapshot: a verification may add documents while we wait
            doc = known[cache.best(await score_docs(ctx, query, ids), ids)]
            start = len(out)
            gen = await generate(doc)
            out.extend(gen.token_ids)
            stats.speculation_steps += 1
            scheduler.record_step(time.perf_counter() - start_t)
            return _Speculated(query, doc, start, list(gen.token_ids), steps.finished(gen, out))

        async def generate(doc: Hit):
            start_t = time.perf_counter()
            gen = await steps.step(doc, out)
            scheduler.record_generation(time.perf_counter() - start_t)
            return gen

        async def search(first: bool = False) -> list[Hit]:
            start_t = time.perf_counter()
            hits = await steps.search(steps.query_text(out), first=first)
            scheduler.record_search(time.perf_counter() - start_t)
            remember(hits)
            return hits

        # step 1 with the index's document (Algorithm 1, line 4)
        last_doc = (await search(first=True))[0]  # the document of the last step kept: an empty search keeps it
        gen = await generate(last_doc)
        out += gen.token_ids
        docs.append(last_doc.doc_id)
        done = steps.finished(gen, out)
        carried: list[_Speculated] = []  # a step speculated during the last verification
        while not done:
            ctx.next_step()
            stride = scheduler.next_round(fixed, cfg.sequential_fallback)
            if stride == 0 and not carried:  # RaLMSeq's step: speculation cannot pay here
                stats.stride_history.append(0)
                last_doc = steps.document_after(last_doc, await search())
                gen = await generate(last_doc)
                out += gen.token_ids
                docs.append(last_doc.doc_id)
                done = steps.finished(gen, out)
                continue
            stride = max(stride, 1)
            stats.stride_history.append(stride)
            round_: list[_Speculated] = list(carried)
            carried = []
            while len(round_) < stride and not (round_ and round_[-1].finished):
                round_.append(await speculate())
            verify_start = time.perf_counter()
            verification = ctx.spawn(steps.search_many([s.query for s in round_]))
            extra = None
            if cfg.async_verification and not round_[-1].finished:
                extra = ctx.spawn(speculate())
            try:
                truths = await verification
            except BaseException:
                if extra is not None:
                    extra.cancel()
                raise
            truth_docs = _truth_docs(last_doc, truths)
            matched = _matched(round_, truth_docs)
            scheduler.record_verification(time.perf_counter() - verify_start, len(round_), matched)
            stats.verifications += 1
            for hits in truths:
                remember(hits)
            item.trace.count("speculation_accepted", matched)
            docs.extend(s.doc.doc_id for s in round_[:matched])
            if matched:
                last_doc = round_[matched - 1].doc
            if matched == len(round_):
                if extra is not None:
                    carried = [await extra]
                done = round_[-1].finished
                continue
            # mismatch at step `matched`: drop it and everything after, regenerate with the truth
            if extra is not None:  # it continues a rejected step: stop it and drop its tokens
                extra.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await extra
            bad = round_[matched]
            rejected = len(round_) - matched + (1 if extra is not None else 0)
            item.trace.count("speculation_rejected", rejected)
            item.trace.count("rollbacks")
            del out[bad.start:]
            true_doc = last_doc = truth_docs[matched]
            gen = await generate(true_doc)
            out += gen.token_ids
            docs.append(true_doc.doc_id)
            done = steps.finished(gen, out)
        stats.cache_size, stats.step_docs = len(cache), docs
        return steps.finalise(out, stats)


def _truth_docs(before: Hit, truths: list[list[Hit]]) -> list[Hit]:
    """Each verified step's true document, as RaLMSeq picks it: the top-1, or the one before."""
    out = []
    for hits in truths:
        before = RaLMSteps.document_after(before, hits)
        out.append(before)
    return out


def _matched(round_: list[_Speculated], truth_docs: list[Hit]) -> int:
    """How many leading speculation steps guessed the true document."""
    for i, (s, truth) in enumerate(zip(round_, truth_docs)):
        if s.doc.doc_id != truth.doc_id:
            return i
    return len(round_)


class RaLMSpec(Method):
    name = "ralmspec"
    config_class = RaLMSpecConfig
    needs_retriever = True
    trace_class = SpeculationTrace

    def stages(self):
        return [RaLMSpecLoop(self.config)]

"""Token-level iterative RaLM: KNN-LM (Khandelwal et al., 2019) and RaLMSpec for it (paper §5.3).

KNN-LM: at every token, the generator's final hidden state queries the datastore for its k
nearest corpus contexts; their next tokens, weighted by softmax(-distance / T), form p_kNN,
interpolated with the model: p = λ·p_kNN + (1-λ)·p_LM; greedy decoding (Khandelwal et al.:
λ=0.25, T=1).

RaLMSpec for KNN-LM, with the paper's two changes: the cache holds the ``follow`` (n=10)
entries that follow each retrieved entry (the next contexts of the same text), not the
retrieved entries; and a speculation step is correct when it yields the same next token as
the true neighbours would — then it needs no regeneration: the verification's own
distribution gives the true token at the first mismatch. Asynchronous verification is not
used for KNN-LM (as in the paper). ``sequential_fallback`` (not in the paper, on by default):
where the measured costs say speculation cannot pay, the loop takes KNN-LM's own step
(methods/os3.py; a mismatch here costs no regeneration, only the lost steps).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specrag.inference.capabilities import NEXT_TOKEN
from specrag.inference.types import NextToken, NextTokenRequest
from specrag.methods.base import Method, MethodConfig, QueryState, Stage
from specrag.methods.common import SpeculationTrace, TokenTrace, finalise_tokens
from specrag.methods.os3 import StrideScheduler
from specrag.methods.prompts import build_prompt
from specrag.retrieval.speculation import SpeculationCache


@dataclass(frozen=True)
class KNNLMConfig(MethodConfig):
    k: int = 16  # neighbours per token (the paper sweeps 1..1024)
    lam: float = 0.25  # weight of p_kNN
    temperature: float = 1.0
    max_new_tokens: int = 32

    def validate(self) -> None:
        if self.k < 1 or self.max_new_tokens < 1:
            raise ValueError("k and max_new_tokens must be >= 1")
        if not 0.0 <= self.lam <= 1.0 or self.temperature <= 0:
            raise ValueError("lam must be in [0, 1] and temperature > 0")


@dataclass(frozen=True)
class KNNLMSpecConfig(KNNLMConfig):
    speculation_stride: int = 3
    follow: int = 10  # entries after each retrieved one that go into the cache (paper n=10)
    os3: bool = False
    os3_window: int = 5
    os3_gamma_max: float = 0.6
    os3_max_stride: int = 16
    sequential_fallback: bool = True  # a plain KNN-LM step where speculation cannot pay

    def validate(self) -> None:
        super().validate()
        if self.speculation_stride < 1 or self.follow < 1:
            raise ValueError("speculation_stride and follow must be >= 1")
        StrideScheduler(self.os3_window, self.os3_gamma_max, self.os3_max_stride)


def mix_next_token(state: NextToken, ids: np.ndarray, dists: np.ndarray, values: np.ndarray,
                   lam: float, temperature: float) -> int:
    """argmax_v λ·p_kNN(v) + (1-λ)·p_LM(v), in float64; the lowest token id wins a tie."""
    if not len(ids):  # nothing retrieved: the model alone
        return int(np.argmax(state.logprobs))
    p = np.exp(state.logprobs.astype(np.float64)) * (1.0 - lam)
    logits = -np.asarray(dists, dtype=np.float64) / temperature
    w = np.exp(logits - logits.max())
    w /= w.sum()
    np.add.at(p, values[np.asarray(ids, dtype=np.int64)], lam * w)
    return int(np.argmax(p))


class DatastoreSearch:
    """KNN-LM's token-level retrieval over the ``datastore`` resource, through one query's
    context: searches batched across queries, and a speculation cache's search among given
    entries (small, so computed in place)."""

    def __init__(self, ctx):
        self.ctx, self.store = ctx, ctx.resource("datastore")
        self.values: np.ndarray = self.store.values

    async def knn(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest entries (ids, squared distances)."""
        [out] = await self.knn_many([vector], k)
        return out

    async def knn_many(self, vectors: Sequence[np.ndarray], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Several searches as one batch (a KNN-LM verification)."""
        out = await self.ctx.call("search", "datastore", list(vectors), "retrieval_s", k=k)
        self.ctx.trace.count("retrieval_calls", len(vectors))
        return out

    def knn_among(self, vector: np.ndarray, ids: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        with self.ctx.timed("retrieval_s"):
            out = self.store.nearest_among(vector, ids, k)
        self.ctx.trace.count("cache_hits")
        return out


class _TokenSteps:
    """One request's KNN-LM loop state: prompt, tokens so far, end conditions."""

    def __init__(self, item: QueryState, ctx, config: KNNLMConfig):
        self.item, self.ctx, self.config = item, ctx, config
        self.prompt = build_prompt(item.query)
        self.eos = set(ctx.eos_ids())
        self.search = DatastoreSearch(ctx)
        self.values = self.search.values

    async def state(self, out: list[int]) -> NextToken:
        return await self.ctx.next_token(NextTokenRequest(self.prompt, tuple(out)))

    def token(self, state: NextToken, ids, dists) -> int:
        return mix_next_token(state, ids, dists, self.values, self.config.lam, self.config.temperature)

    def append(self, out: list[int], token: int) -> bool:
        """Add a token (EOS is not added); True when generation is over."""
        if token in self.eos:
            return True
        out.append(token)
        return len(out) >= self.config.max_new_tokens

    def finalise(self, out: list[int], record=None) -> QueryState:
        return finalise_tokens(self.item, self.ctx, out, record)


@dataclass
class KNNLMLoop(Stage):
    config: KNNLMConfig
    name: str = "KNNLM"

    async def run(self, item: QueryState, ctx) -> QueryState:
        steps = _TokenSteps(item, ctx, self.config)
        out: list[int] = []
        while True:
            ctx.next_step()
            state = await steps.state(out)
            ids, dists = await steps.search.knn(state.hidden, self.config.k)
            if steps.append(out, steps.token(state, ids, dists)):
                return steps.finalise(out)


@dataclass
class _Guess:
    start: int
    state: NextToken
    token: int


class KNNLMSpecLoop(Stage):
    def __init__(self, config: KNNLMSpecConfig, name: str = "KNNLMSpec"):
        self.config, self.name = config, name

    async def run(self, item: QueryState, ctx) -> QueryState:
        cfg = self.config
        steps = _TokenSteps(item, ctx, cfg)
        store = steps.search.store
        cache = SpeculationCache()
        scheduler = StrideScheduler(cfg.os3_window, cfg.os3_gamma_max, cfg.os3_max_stride, regenerates=False)
        fixed = None if cfg.os3 else cfg.speculation_stride
        stats = SpeculationTrace()
        out: list[int] = []

        async def true_step() -> bool:
            """KNN-LM's own step: the state, its true neighbours, the token."""
            t0 = time.perf_counter()
            state = await steps.state(out)
            t1 = time.perf_counter()
            ids, dists = await steps.search.knn(state.hidden, cfg.k)
            scheduler.record_generation(t1 - t0)
            scheduler.record_search(time.perf_counter() - t1)
            cache.add(store.following(ids, cfg.follow))
            return steps.append(out, steps.token(state, ids, dists))

        done = await true_step()  # the first token with the true neighbours
        while not done:
            ctx.next_step()
            stride = scheduler.next_round(fixed, cfg.sequential_fallback)
            stats.stride_history.append(stride)
            if stride == 0:  # speculation cannot pay here
                done = await true_step()
                continue
            guesses: list[_Guess] = []
            finished = False
            while len(guesses) < stride and not finished:
                t0 = time.perf_counter()
                state = await steps.state(out)
                scheduler.record_generation(time.perf_counter() - t0)
                c_ids, c_dists = steps.search.knn_among(state.hidden, cache.ids, cfg.k) if len(cache) else ([], [])
                guess = _Guess(len(out), state, steps.token(state, c_ids, c_dists))
                guesses.append(guess)
                finished = steps.append(out, guess.token)
                stats.speculation_steps += 1
                scheduler.record_step(time.perf_counter() - t0)
            t0 = time.perf_counter()
            truths = await steps.search.knn_many([g.state.hidden for g in guesses], cfg.k)
            true_tokens = [steps.token(g.state, i, d) for g, (i, d) in zip(guesses, truths)]
            matched = next((j for j, (g, t) in enumerate(zip(guesses, true_tokens)) if g.token != t), len(guesses))
            scheduler.record_verification(time.perf_counter() - t0, len(guesses), matched)
            stats.verifications += 1
            for i, _ in truths:
                cache.add(store.following(i, cfg.follow))
            item.trace.count("speculation_accepted", matched)
            if matched == len(guesses):
                done = finished
                continue
            item.trace.count("speculation_rejected", len(guesses) - matched)
            item.trace.count("rollbacks")
            del out[guesses[matched].start:]
            done = steps.append(out, true_tokens[matched])  # the verification already knows it
        stats.cache_size = len(cache)
        return steps.finalise(out, stats)


class KNNLM(Method):
    name = "knnlm"
    config_class = KNNLMConfig
    needs = {"generator": (NEXT_TOKEN,)}
    resources = ("datastore",)
    trace_class = TokenTrace

    def stages(self):
        return [KNNLMLoop(self.config)]


class KNNLMSpec(Method):
    name = "knnlm-spec"
    config_class = KNNLMSpecConfig
    needs = {"generator": (NEXT_TOKEN,)}
    resources = ("datastore",)
    trace_class = SpeculationTrace

    def stages(self):
        return [KNNLMSpecLoop(self.config)]

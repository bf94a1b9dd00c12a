"""The engine: runs one stage over many queries on one event loop, batching their calls.

A stage is an async function over one query's state. The engine starts one task per
query; the tasks await services of a per-query ``Context`` (retrieve, generate, score,
embed), whose requests meet in per-operation MicroBatchers and go to the backends as
batched calls. Timings and counts land in each query's trace. The same code runs inside a
Beam DoFn, in tests and in benchmarks.

Example usage::

    services = Services(backends={"generator": backend}, retriever=retriever)
    engine = Engine(services, EngineConfig(max_batch=16))
    outputs = engine.run_stage(stage, states)      # list of StageOutcome, input order
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from specrag.inference.batcher import MicroBatcher
from specrag.inference.trace import Trace
from specrag.inference.types import (GenerateRequest, Generation, NextToken, NextTokenRequest, ScoreRequest,
                                     Scored)


@dataclass(frozen=True)
class EngineConfig:
    """Micro-batching limits (per operation) and the per-query stage timeout."""

    max_batch: int = 16
    max_wait_s: float = 0.005
    retrieval_max_batch: int = 64
    stage_timeout_s: float = 600.0

    def __post_init__(self):
        if self.max_batch < 1 or self.retrieval_max_batch < 1:
            raise ValueError("max_batch and retrieval_max_batch must be >= 1")
        if self.max_wait_s < 0 or self.stage_timeout_s <= 0:
            raise ValueError("max_wait_s must be >= 0 and stage_timeout_s > 0")


class ModelBackend(Protocol):
    """What a model backend offers; a backend may implement a subset of the operations."""

    name: str

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]: ...
    def score(self, requests: list[ScoreRequest]) -> list[Scored]: ...
    def embed(self, texts: list[str]) -> np.ndarray: ...


class SearchBackend(Protocol):
    def search(self, queries: list[str], k: int) -> list[list["Any"]]: ...


@dataclass
class Services:
    """The backends one engine talks to: models by role, and one retriever."""

    models: dict[str, ModelBackend] = field(default_factory=dict)
    retriever: SearchBackend | None = None
    datastore: Any = None  # a KNN-LM Datastore (token-level retrieval)


class Context:
    """A query's view of the services: awaitable operations that also keep its trace."""

    def __init__(self, engine: "Engine", trace: Trace):
        self._engine = engine
        self.trace = trace

    async def generate(self, request: GenerateRequest, model: str = "generator") -> Generation:
        start = time.perf_counter()
        out, waited, _ = await self._engine.batcher("generate", model).submit_timed(request)
        self.trace.count("model_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens)
        self.trace.count("generated_tokens", len(out.token_ids))
        self._account("generation_s", start, waited)
        return out

    async def generate_n(self, request: GenerateRequest, n: int, model: str = "generator") -> list[Generation]:
        """n samples of one prompt (seeds seed, seed+1, ...), batched together with other calls."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if n > 1 and request.temperature <= 0:
            raise ValueError("n > 1 needs temperature > 0 (greedy samples would be identical)")
        return list(await asyncio.gather(*(self.generate(dataclasses.replace(request, seed=request.seed + i), model)
                                           for i in range(n))))

    async def score(self, request: ScoreRequest, model: str = "scorer") -> Scored:
        start = time.perf_counter()
        out, waited, _ = await self._engine.batcher("score", model).submit_timed(request)
        self.trace.count("model_calls")
        self.trace.count("score_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens + len(out.token_logprobs))
        self._account("verification_s", start, waited)
        return out

    async def embed(self, texts: Sequence[str], model: str = "embedder") -> np.ndarray:
        start = time.perf_counter()
        batcher = self._engine.batcher("embed", model)
        results = await asyncio.gather(*(batcher.submit_timed(t) for t in texts))
        self.trace.count("embed_calls")
        self._account("embedding_s", start, max((w for _, w, _ in results), default=0.0))
        if not results:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([r for r, _, _ in results])

    async def retrieve(self, query: str, k: int, stage: str = "retrieve") -> list[Any]:
        start = time.perf_counter()
        hits, waited, _ = await self._engine.batcher("search", "retriever", k).submit_timed(query)
        self.trace.count("retrieval_calls")
        self._account("retrieval_s", start, waited)
        self.trace.retrieved.append({"stage": stage, "query": query,
                                     "doc_ids": [h.doc_id for h in hits],
                                     "scores": [float(h.score) for h in hits]})
        return hits

    async def score_docs(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        """The retriever's own scores of given documents (a speculation cache ranks with them).

        Batched across queries in a thread of its own, so a cache lookup never queues behind
        a slow index search running at the same time (asynchronous verification).
        """
        start = time.perf_counter()
        scores, waited, _ = await self._engine.batcher("score_docs", "retriever-cache").submit_timed(
            (query, tuple(doc_ids)))
        self.trace.count("cache_hits")
        self._account("retrieval_s", start, waited)
        return scores

    async def next_token(self, request: NextTokenRequest, model: str = "generator") -> NextToken:
        """Hidden state and next-token log-probabilities after a prefix (one LM step, no sampling)."""
        start = time.perf_counter()
        out, waited, _ = await self._engine.batcher("next_token", model).submit_timed(request)
        self.trace.count("model_calls")
        self.trace.count("generated_tokens")
        self._account("generation_s", start, waited)
        return out

    async def knn(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest datastore entries (ids, squared distances), batched across queries."""
        start = time.perf_counter()
        out, waited, _ = await self._engine.batcher("knn", "datastore", k).submit_timed(vector)
        self.trace.count("retrieval_calls")
        self._account("retrieval_s", start, waited)
        return out

    def knn_among(self, vector: np.ndarray, ids: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest of given entries (a speculation cache): small, so computed in place."""
        start = time.perf_counter()
        out = self._engine.datastore().nearest_among(vector, ids, k)
        self.trace.count("cache_hits")
        self._account("retrieval_s", start, 0.0)
        return out

    def eos_ids(self, model: str = "generator") -> list[int]:
        return list(self._engine.model(model).eos_ids)

    def datastore(self):
        return self._engine.datastore()

    def datastore_values(self) -> np.ndarray:
        return self._engine.datastore().values

    def tokenize(self, text: str, model: str = "generator") -> list[int]:
        return self._engine.model(model).tokenize([text])[0]

    def detokenize(self, ids: Sequence[int], model: str = "generator") -> str:
        return self._engine.model(model).detokenize([list(ids)])[0]

    async def retrieve_many(self, queries: Sequence[str], k: int, stage: str = "retrieve") -> list[list[Any]]:
        """Several queries as one batched retrieval (a verification): its wall time counts once."""
        start = time.perf_counter()
        batcher = self._engine.batcher("search", "retriever", k)
        results = await asyncio.gather(*(batcher.submit_timed(q) for q in queries))
        self.trace.count("retrieval_calls", len(queries))
        self._account("retrieval_s", start, min((w for _, w, _ in results), default=0.0))
        for q, (hits, _, _) in zip(queries, results):
            self.trace.retrieved.append({"stage": stage, "query": q, "doc_ids": [h.doc_id for h in hits],
                                         "scores": [float(h.score) for h in hits]})
        return [hits for hits, _, _ in results]

    async def knn_many(self, vectors: Sequence[np.ndarray], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Several token-level searches as one batch (a KNN-LM verification), timed once."""
        start = time.perf_counter()
        batcher = self._engine.batcher("knn", "datastore", k)
        results = await asyncio.gather(*(batcher.submit_timed(v) for v in vectors))
        self.trace.count("retrieval_calls", len(vectors))
        self._account("retrieval_s", start, min((w for _, w, _ in results), default=0.0))
        return [r for r, _, _ in results]

    def _account(self, bucket: str, start: float, waited: float) -> None:
        elapsed = time.perf_counter() - start
        self.trace.add_time(bucket, elapsed - waited)
        self.trace.add_time("waiting_s", waited)


@dataclass
class StageOutcome:
    """What one query's stage produced: states (fan-out gives several) or an error."""

    outputs: list[Any]
    error: BaseException | None = None
    error_traceback: str = ""


class Engine:
    """Runs stages over batches of query states with cross-query micro-batching."""

    def __init__(self, services: Services, config: EngineConfig = EngineConfig()):
        self.services = services
        self.config = config
        self._batchers: dict[tuple, MicroBatcher] = {}
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self._loop = asyncio.new_event_loop()

    def batcher(self, op: str, target: str, k: int | None = None) -> MicroBatcher:
        key = (op, target, k)
        batcher = self._batchers.get(key)
        if batcher is not None:
            return batcher
        if op == "knn":
            datastore = self.datastore()
            max_batch, inflight = self.config.retrieval_max_batch, 1
            call = lambda vs: datastore.search(vs, k)  # noqa: E731
        elif op in ("search", "score_docs"):
            if self.services.retriever is None:
                raise RuntimeError("this method retrieves, but no retriever (index) was configured")
            retriever = self.services.retriever
            max_batch, inflight = self.config.retrieval_max_batch, 1
            call = ((lambda qs: retriever.search(qs, k)) if op == "search"
                    else (lambda pairs: [retriever.score(q, ids) for q, ids in pairs]))
        else:
            backend = self.model(target)
            call = getattr(backend, op, None)
            if call is None:
                raise RuntimeError(f"the {target} backend ({backend.name}) does not offer {op}()")
            if getattr(backend, "supports_row_errors", False):  # one bad row fails alone
                call = functools.partial(call, return_exceptions=True)
            max_batch = self.config.max_batch
            if op == "embed":  # cheap per item: batch wider
                max_batch = max(max_batch, 64)
                call = _embed_rows(call)
            # a local model runs one batch at a time (torch threads do the parallel work);
            # a remote server can take several batches in flight
            inflight = getattr(backend, "max_inflight_batches", 1)
        # one worker pool per target; retrieval has its own so it overlaps generation
        executor = self._executors.setdefault(
            target, ThreadPoolExecutor(max_workers=inflight, thread_name_prefix=f"specrag-{target}"))
        batcher = MicroBatcher(f"{target}.{op}", call, max_batch=max_batch,
                               max_wait_s=self.config.max_wait_s, executor=executor)
        self._batchers[key] = batcher
        return batcher

    def datastore(self):
        if self.services.datastore is None:
            raise RuntimeError("this method retrieves per token, but no KNN-LM datastore was configured")
        return self.services.datastore

    def model(self, role: str) -> ModelBackend:
        backend = self.services.models.get(role)
        if backend is None:
            raise RuntimeError(f"no model backend configured for role {role!r} "
                               f"(have: {sorted(self.services.models)})")
        return backend

    def run_stage(self, stage: Any, states: Sequence[Any]) -> list[StageOutcome]:
        """Run ``stage.run`` for every state concurrently; one outcome per input, in order."""
        return self._loop.run_until_complete(self._run_all(stage, states))

    async def _run_all(self, stage: Any, states: Sequence[Any]) -> list[StageOutcome]:
        return list(await asyncio.gather(*(self._run_one(stage, s) for s in states)))

    async def _run_one(self, stage: Any, state: Any) -> StageOutcome:
        ctx = Context(self, state.trace)
        start = time.perf_counter()
        try:
            out = await asyncio.wait_for(stage.run(state, ctx), self.config.stage_timeout_s)
        except asyncio.TimeoutError as e:
            err = TimeoutError(f"stage {stage.name!r} exceeded {self.config.stage_timeout_s}s")
            return StageOutcome([], err, "".join(traceback.format_exception(e)))
        except Exception as e:  # a query's failure is data, not a crash of the batch
            return StageOutcome([], e, "".join(traceback.format_exception(e)))
        outputs = out if isinstance(out, list) else [out]
        elapsed = time.perf_counter() - start
        for o in outputs:
            o.trace.add_time("total_s", elapsed)
        return StageOutcome(outputs)

    def close(self) -> None:
        for ex in self._executors.values():
            ex.shutdown(wait=True)
        self._loop.close()


def _embed_rows(embed):
    def call(texts: list[str]) -> list:
        return list(embed(texts))
    return call

"""The engine: one per worker process, running queries' stages on its own event-loop thread.

A stage is an async function over one query's state. Callers (Beam DoFn instances on any
thread, tests, benchmarks) ``submit`` a query with its chain of stages as it arrives; the
engine runs it as one task on its loop, at most ``max_in_flight`` at a time (``submit``
blocks beyond that: backpressure), and resolves the returned future when the query is done.
The tasks await services of a per-query ``Context`` (retrieve, generate, score, embed,
...), whose requests meet in per-operation MicroBatchers and go to the backends as batched
calls: micro-batches form across every query in flight, whichever bundle or thread sent it.

Structured concurrency: a task a query starts with ``ctx.spawn`` (SPS's overlapped
retrieval, RaLMSpec's asynchronous verification) is cancelled and awaited when the query
ends; a cancelled query's requests still waiting for a batch are withdrawn, and those already
sent are handed to the backend's ``cancel`` (a server backend closes them); a stage that
runs past ``stage_timeout_s`` fails with ``StageTimeout`` (a backend's own timeout keeps its
own type and message); a loop stage marks each step's start with ``ctx.next_step()``, and the
limit then bounds one step, not the loop. ``close`` cancels whatever is left and stops the loop thread.

Example usage::

    engine = Engine(Services(models={"generator": backend}, retriever=retriever))
    future = engine.submit([Retrieve(10), Generate()], QueryState(query))  # from any thread
    outcome = future.result()                      # QueryOutcome: outputs or error + stage
    outcomes = engine.run_stages(stages, states)   # many at once, input order
    engine.close()
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import threading
import time
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from specrag import registry
from specrag.inference.batcher import WAIT_CLOCK, WAITING, MicroBatcher
from specrag.inference.capabilities import MissingCapability
from specrag.inference.trace import Trace
from specrag.inference.types import (Denoised, DenoiseRequest, FusedDecodeRequest, GenerateRequest, Generation,
                                     NextToken, NextTokenRequest, RerankRequest, ScoreRequest, Scored)


@dataclass(frozen=True)
class EngineConfig:
    """Micro-batching limits (per operation), queries in flight, and the per-stage timeout."""

    max_batch: int = 16
    max_wait_s: float = 0.005
    retrieval_max_batch: int = 64
    stage_timeout_s: float = 600.0  # a stage's own time and its calls' service
    queue_timeout_s: float = 3600.0  # the most queue waiting a stage's timeout leaves out
    # queries running at once in one engine (one per worker process); submit blocks beyond it.
    # Enough to fill several micro-batches, few enough that documents and KV caches stay bounded.
    max_in_flight: int = 64

    def __post_init__(self):
        if self.max_batch < 1 or self.retrieval_max_batch < 1 or self.max_in_flight < 1:
            raise ValueError("max_batch, retrieval_max_batch and max_in_flight must be >= 1")
        if self.max_wait_s < 0 or self.stage_timeout_s <= 0 or self.queue_timeout_s < 0:
            raise ValueError("max_wait_s and queue_timeout_s must be >= 0, stage_timeout_s > 0")


C = TypeVar("C")


@dataclass(frozen=True)
class BackendSettings:
    """What a backend is opened with (``ModelBackend.open``); each backend takes the parts it uses.

    ``configs``: the backends' own configurations, each a frozen dataclass of its backend's module
    (``TritonConfig``, ``VllmConfig``, ...) that ``ModelBackend.config_from_options`` made from
    the backend's flags; a backend finds its own by type (``config_of``), so a new backend adds
    its settings without a field here."""

    num_threads: int = 1
    dtype: str = "float32"
    prefix_cache_mb: int = 0  # prefix KV reuse of a local causal LM, MiB per model and process
    configs: tuple[Any, ...] = ()

    def config_of(self, kind: type[C]) -> C | None:
        """The configuration of type ``kind`` among ``configs`` (None: the run gave none)."""
        return config_of(self.configs, kind)


def config_of(configs: tuple[Any, ...], kind: type[C]) -> C | None:
    """The configuration of type ``kind`` in a tuple of backends' configurations, or None."""
    return next((c for c in configs if isinstance(c, kind)), None)


class ModelBackend(Protocol):
    """What a model backend offers: the operations in ``capabilities`` (a subset of
    ``capabilities.OPERATIONS``), each a batched call. Backends subclass it for its defaults.

    ``supports_row_errors``: the backend's calls take ``return_exceptions=True`` and then put a
    failed row's exception in its place of the result list (one bad row fails alone).
    ``max_inflight_batches``: batches the engine may send at once (a local model runs one at a
    time, its torch threads do the parallel work; a server takes several)."""

    name: str
    capabilities: frozenset[str]
    supports_row_errors: bool = False
    max_inflight_batches: int = 1

    # A backend's traits: a run is checked and identified by asking its backend's class
    # (transforms/runtime.py), never by testing the backend's name, so a new backend is a module
    # and a registry line. ``fallback``: the backend that runs the models this one serves nothing
    # for (vLLM serves causal LMs; a vllm run's encoders run locally). ``in_process``: its models
    # run in the worker process, whose torch threads are set for them. ``takes_dtype``: the run's
    # --dtype reaches the model (Triton's models set theirs in config.pbtxt). ``phase_dtypes``:
    # it runs the dtypes that are forwards of its own (int8, bfloat16-prefill). ``worker_prefix_cache``:
    # specrag's prefix KV reuse (--prefix-cache-mb) applies, on by default at
    # ``default_prefix_cache_mb`` (a server caches prefixes itself).
    fallback: str | None = None
    in_process: bool = False
    takes_dtype: bool = True
    phase_dtypes: bool = False
    worker_prefix_cache: bool = False
    default_prefix_cache_mb: int = 0

    @classmethod
    def add_options(cls, flag: Callable[..., None]) -> None:
        """Declares this backend's own flags: ``flag(option, **argparse_kwargs)`` adds
        ``--BACKEND-OPTION`` (``--vllm-url``) to every job with models, in the models group."""

    @classmethod
    def config_from_options(cls, value: Callable[[str], Any], chosen: bool) -> Any | None:
        """This backend's configuration (a frozen dataclass; None: it needs none) from the
        values of its flags (``value(option)``); ``chosen``: the run's --backend names it. A
        flag that has no effect unless the backend is chosen is refused when it is not."""
        return None

    @classmethod
    def open(cls, model: str, settings: BackendSettings) -> "ModelBackend":
        """The backend of a registered name (``registry.BACKENDS``) for one model."""
        raise NotImplementedError(f"{cls.__name__} cannot be opened by name")

    @classmethod
    def check_run(cls, settings: BackendSettings, needs: dict[str, tuple[str, tuple[str, ...]]]) -> None:
        """Checks of a run on this backend before any work (a server reachable, its models
        there); ``needs``: role -> (model, operations)."""

    @classmethod
    def model_identity(cls, model: str) -> str:
        """How a run's identity names a model of this backend: its weights' hash by default."""
        from specrag.inference.models import model_identity
        return model_identity(model)

    @classmethod
    def identity_extras(cls, settings: BackendSettings) -> dict[str, Any]:
        """What else of this backend's settings decides a run's results."""
        return {}

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]: ...
    def score(self, requests: list[ScoreRequest]) -> list[Scored]: ...
    def embed(self, texts: list[str]) -> np.ndarray: ...

    def cancel(self, requests: list) -> None:
        """Rows of a call under way whose queries no longer wait (cancelled, past their stage
        timeout): a server backend abandons their requests; a local batch runs to its end."""


class SearchBackend(Protocol):
    """A retriever as the engine calls it. ``embeds_queries``: each search embeds its queries
    (a dense index), counted as embed calls in the trace."""

    embeds_queries: bool = False

    def search(self, queries: list[str], k: int) -> list[list["Any"]]: ...
    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]: ...


@dataclass
class Services:
    """The backends one engine talks to: models by role, one retriever, and the resources a
    method reads through its own services (e.g. ``"datastore"``: KNN-LM's token-level index,
    ``"triplets"``: AED-RAG's triplet sets), by name."""

    models: dict[str, ModelBackend] = field(default_factory=dict)
    retriever: SearchBackend | None = None
    resources: dict[str, Any] = field(default_factory=dict)


class MethodResource(Protocol):
    """What a method reads beside its models and its retriever (KNN-LM's datastore, AED-RAG's
    triplet sets): named in ``registry.RESOURCES``, declared by the methods that read it
    (``Method.resources``), asked for by name in a stage (``ctx.resource(name)``). Its folder is
    the run's ``RuntimeConfig`` field ``folder_field`` (set by its flag); the class checks the
    folder at start, opens it once per worker process and says what of it decides results."""

    folder_field: str  # the RuntimeConfig field that holds its folder, e.g. "datastore_dir"
    missing: str  # what the user passes to provide it: "... reads triplet sets: pass --triplets ..."

    @classmethod
    def check(cls, folder: str, runtime: Any) -> None:
        """Refuse, before any work, a folder that is not one (the run's RuntimeConfig ``runtime``)."""

    @classmethod
    def open(cls, folder: str, runtime: Any) -> Any:
        """The resource a stage reads, opened once per worker process."""

    @classmethod
    def identity_extras(cls, folder: str | None, runtime: Any) -> dict[str, Any]:
        """What else of it decides a run's results, beside its folder's fingerprint."""
        return {}


class StageTimeout(TimeoutError):
    """A stage of one query ran past the engine's ``stage_timeout_s``."""


class _Clock:
    """Wall time during which a query had at least one call of a kind outstanding (the union
    of intervals, over all its parts): concurrent calls and parallel parts count once."""

    def __init__(self):
        self._active: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def start(self, kind: str) -> None:
        if not self._active.get(kind):
            self._since[kind] = time.perf_counter()
        self._active[kind] = self._active.get(kind, 0) + 1

    def stop(self, kind: str) -> None:
        self._active[kind] -= 1
        if not self._active[kind]:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - self._since[kind]

    def total(self, kind: str) -> float:
        """Seconds so far, the interval under way included."""
        ongoing = time.perf_counter() - self._since[kind] if self._active.get(kind) else 0.0
        return self.seconds.get(kind, 0.0) + ongoing

    @contextlib.contextmanager
    def busy(self, *kinds: str):
        for k in kinds:
            self.start(k)
        try:
            yield
        finally:
            for k in kinds:
                self.stop(k)


CALLS = "calls"  # the clock's kind for "any service call outstanding"


class _QueryScope:
    """The tasks one query started: they end when the query ends, whichever way it ends.
    Also the query's clock (shared by its parts)."""

    def __init__(self):
        self.tasks: set[asyncio.Task] = set()
        self.clock = _Clock()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def close(self) -> None:
        tasks = [t for t in self.tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class _StepMark:
    """Where a stage's current step began: its loop time and the query's queue waiting then."""

    started: float
    waited: float
    steps: int = 0


class Context:
    """A query's view of the services: awaitable operations that also keep its trace."""

    def __init__(self, engine: "Engine", trace: Trace, scope: _QueryScope | None = None,
                 step: _StepMark | None = None):
        self._engine = engine
        self.trace = trace
        self._scope = scope or _QueryScope()
        self._step = step

    def next_step(self) -> None:
        """A loop stage begins a step (a denoising step, a token, a speculation round): the stage
        timeout starts again. A loop may be long with many queries in flight (a batched call's
        service counts for each of its queries); one step that hangs still fails."""
        if self._step is not None:
            self._step.started = asyncio.get_running_loop().time()
            self._step.waited = self._scope.clock.total(WAITING)
            self._step.steps += 1

    def spawn(self, coro) -> asyncio.Task:
        """Start a task that belongs to this query: cancelled and awaited when the query ends."""
        return self._scope.spawn(coro)

    def _busy(self, kind: str):
        return self._scope.clock.busy(kind, CALLS)

    # -- the primitives a method's own services build on -----------------------------------
    async def call(self, op: str, target: str, items: Sequence[Any], timing: str, k: int | None = None,
                   lane: str | None = None) -> list[Any]:
        """``target.op`` over ``items`` (a model role or a resource name), each item one row of a
        micro-batch shared with other queries; the wait counts as ``timing`` in the trace.
        ``k`` is passed to the call (a search's depth); ``lane``: a thread of its own, so a
        cheap call never queues behind a slow one on the same target."""
        batcher = self._engine.batcher(op, target, k, lane)
        with self._busy(timing):
            return list(await asyncio.gather(*(batcher.submit(item) for item in items)))

    def timed(self, timing: str):
        """Count a block computed in place (no batch) as ``timing``: ``with ctx.timed("retrieval_s"):``."""
        return self._busy(timing)

    def resource(self, name: str) -> Any:
        """A resource of the services (``Services.resources``), or one line naming what provides it."""
        return self._engine.resource(name)

    def model(self, role: str) -> ModelBackend:
        """The backend of a model role, for what is not a batched call (vocabulary, special ids)."""
        return self._engine.model(role)

    async def generate(self, request: GenerateRequest, model: str = "generator") -> Generation:
        with self._busy("generation_s"):
            out = await self._engine.batcher("generate", model).submit(request)
        self.trace.count("model_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens)
        self.trace.count("generated_tokens", len(out.token_ids))
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
        with self._busy("verification_s"):
            out = await self._engine.batcher("score", model).submit(request)
        self.trace.count("model_calls")
        self.trace.count("score_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens + len(out.token_logprobs))
        return out

    async def fused_decode(self, request: FusedDecodeRequest, model: str = "generator") -> Generation:
        """One greedy answer from weighted context streams (batched with other queries' streams)."""
        with self._busy("generation_s"):
            out = await self._engine.batcher("fused_decode", model).submit(request)
        self.trace.count("model_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens)
        self.trace.count("generated_tokens", len(out.token_ids))
        return out

    async def rerank(self, query: str, texts: Sequence[str], model: str = "utility") -> list[float]:
        """A cross-encoder's score per (query, text): every pair one row of a micro-batch."""
        batcher = self._engine.batcher("rerank", model)
        with self._busy("verification_s"):
            scores = await asyncio.gather(*(batcher.submit(RerankRequest(query, t)) for t in texts))
        self.trace.count("model_calls")
        return [float(s) for s in scores]

    async def denoise(self, request: DenoiseRequest, model: str = "denoiser") -> Denoised:
        """One denoising step of a masked-diffusion LM, batched with other queries' steps."""
        with self._busy("generation_s"):
            out = await self._engine.batcher("denoise", model).submit(request)
        self.trace.count("model_calls")
        self.trace.count("prompt_tokens", out.context_tokens + len(out.argmax))
        return out

    async def embed(self, texts: Sequence[str], model: str = "embedder") -> np.ndarray:
        """Embeddings of texts (one row each); every text is one row of a micro-batch."""
        batcher = self._engine.batcher("embed", model)
        with self._busy("embedding_s"):
            results = await asyncio.gather(*(batcher.submit(t) for t in texts))
        self.trace.count("embed_calls")
        if not results:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack(results)

    async def retrieve(self, query: str, k: int, stage: str = "retrieve") -> list[Any]:
        with self._busy("retrieval_s"):
            hits = await self._engine.batcher("search", "retriever", k).submit(query)
        self.trace.count("retrieval_calls")
        self._count_query_embeddings(1)
        self._record_hits(stage, query, hits)
        return hits

    async def next_token(self, request: NextTokenRequest, model: str = "generator") -> NextToken:
        """Hidden state and next-token log-probabilities after a prefix (one LM step, no sampling)."""
        with self._busy("generation_s"):
            out = await self._engine.batcher("next_token", model).submit(request)
        self.trace.count("model_calls")
        self.trace.count("prompt_tokens", out.prompt_tokens)  # prompt + continuation: each step reads them all
        self.trace.count("generated_tokens")
        return out

    def eos_ids(self, model: str = "generator") -> list[int]:
        return list(self._engine.model(model).eos_ids)

    def tokenize(self, text: str, model: str = "generator") -> list[int]:
        return self._engine.model(model).tokenize([text])[0]

    def detokenize(self, ids: Sequence[int], model: str = "generator") -> str:
        return self._engine.model(model).detokenize([list(ids)])[0]

    async def retrieve_many(self, queries: Sequence[str], k: int, stage: str = "retrieve") -> list[list[Any]]:
        """Several queries as one batched retrieval (a verification)."""
        batcher = self._engine.batcher("search", "retriever", k)
        with self._busy("retrieval_s"):
            results = await asyncio.gather(*(batcher.submit(q) for q in queries))
        self.trace.count("retrieval_calls", len(queries))
        self._count_query_embeddings(len(queries))
        for q, hits in zip(queries, results):
            self._record_hits(stage, q, hits)
        return list(results)

    def _count_query_embeddings(self, n: int) -> None:
        """A dense retriever embeds each query inside its search: those are embed calls too."""
        if self._engine.services.retriever.embeds_queries:
            self.trace.count("embed_calls", n)

    def _record_hits(self, stage: str, query: str, hits: Sequence[Any]) -> None:
        self.trace.retrieved.append({"stage": stage, "query": query, "doc_ids": [h.doc_id for h in hits],
                                     "scores": [float(h.score) for h in hits]})


@dataclass
class QueryOutcome:
    """What a query's chain of stages produced: states (a fan-out gives several) or an error
    with the name of the stage it happened in."""

    outputs: list[Any]
    error: BaseException | None = None
    error_traceback: str = ""
    stage: str = ""
    stages: tuple[str, ...] = ()  # the stages it ran, in order


StageOutcome = QueryOutcome  # the name of the one-stage API


def close_engines() -> int:
    """Close every engine of this process: what an interrupted job calls, because its DoFns are
    never torn down and the interpreter's exit would otherwise wait for the pools to run every
    model call still queued (minutes), work nobody keeps. Returns how many were open."""
    live = [e for e in list(_LIVE) if not e.closed]
    for engine in live:
        engine.close()
    return len(live)


class Engine:
    """Runs queries' stage chains on one event-loop thread, micro-batching their calls."""

    def __init__(self, services: Services, config: EngineConfig = EngineConfig()):
        self.services = services
        self.config = config
        self._batchers: dict[tuple, MicroBatcher] = {}
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(config.max_in_flight)
        self._queries: set[asyncio.Task] = set()
        self._closed = False
        self.in_flight = 0
        self.peak_in_flight = 0
        self.admitted = 0
        self.cancelled_at_close = 0
        # an engine dropped without close() (a Shared handle released) still stops its thread
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, None, self._executors)
        _LIVE.add(self)

    # -- services -------------------------------------------------------------------------
    def batcher(self, op: str, target: str, k: int | None = None, lane: str | None = None) -> MicroBatcher:
        """The micro-batcher of ``target.op`` (``target``: a model role, ``"retriever"`` or a
        resource name). Models batch ``max_batch`` rows (embed and rerank wider) in as many batches
        at once as the backend takes; a retriever or resource ``retrieval_max_batch``, one at a time."""
        key = (op, target, k, lane)
        batcher = self._batchers.get(key)
        if batcher is not None:
            return batcher
        if target == "retriever" or target in self.services.resources or target in registry.RESOURCES:
            holder = self.retriever() if target == "retriever" else self.resource(target)
            call = getattr(holder, op)
            max_batch, inflight, cancel = self.config.retrieval_max_batch, 1, None
        else:
            backend = self.model(target)
            if op not in backend.capabilities:
                raise MissingCapability(f"the {target} backend ({backend.name}) does not serve {op} "
                                        f"(it serves {', '.join(sorted(backend.capabilities))})")
            call = getattr(backend, op)
            if backend.supports_row_errors:  # one bad row fails alone
                call = functools.partial(call, return_exceptions=True)
            max_batch = self.config.max_batch
            if op in ("embed", "rerank"):  # cheap per item: batch wider
                max_batch = max(max_batch, 64)
                if op == "embed":
                    call = _embed_rows(call)
            inflight = backend.max_inflight_batches
            cancel = backend.cancel
        if k is not None:
            call = functools.partial(call, k=k)
        # one worker pool per target (or lane); retrieval has its own so it overlaps generation
        pool = lane or target
        executor = self._executors.setdefault(
            pool, ThreadPoolExecutor(max_workers=inflight, thread_name_prefix=f"specrag-{pool}"))
        batcher = MicroBatcher(f"{pool}.{op}", call, max_batch=max_batch,
                               max_wait_s=self.config.max_wait_s, executor=executor, cancel=cancel)
        self._batchers[key] = batcher
        return batcher

    def retriever(self) -> SearchBackend:
        if self.services.retriever is None:
            raise RuntimeError("this method retrieves, but no retriever (index) was configured")
        return self.services.retriever

    def resource(self, name: str) -> Any:
        found = self.services.resources.get(name)
        if found is None:
            if name in registry.RESOURCES:
                raise RuntimeError(f"this method {registry.RESOURCES[name].missing}")
            raise RuntimeError(f"this method reads the resource {name!r}, which no option configured "
                               f"(have: {sorted(self.services.resources)})")
        return found

    def model(self, role: str) -> ModelBackend:
        backend = self.services.models.get(role)
        if backend is None:
            raise RuntimeError(f"no model backend configured for role {role!r} "
                               f"(have: {sorted(self.services.models)})")
        return backend

    def batch_stats(self) -> dict[str, dict[str, float]]:
        """Per batcher: backend calls, items, mean batch size, requests withdrawn unsent, requests
        abandoned while their call ran."""
        return {b.name: {"calls": b.calls, "items": b.items, "mean_batch": b.items / max(b.calls, 1),
                         "withdrawn": b.withdrawn, "abandoned": b.abandoned} for b in self._batchers.values()}

    # -- admission ------------------------------------------------------------------------
    def submit(self, stages: Sequence[Any], state: Any) -> concurrent.futures.Future:
        """Admit one query (blocks while ``max_in_flight`` queries run); the future's result
        is its QueryOutcome. Thread-safe; never call it from a stage (the loop's own thread)."""
        self._start()
        if threading.current_thread() is self._thread:
            raise RuntimeError("Engine.submit called from the engine's own loop (inside a stage)")
        queued = time.perf_counter()
        self._slots.acquire()
        try:
            future = asyncio.run_coroutine_threadsafe(self._run_query(tuple(stages), state, queued), self._loop)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def run_stages(self, stages: Sequence[Any], states: Sequence[Any]) -> list[QueryOutcome]:
        """Run a chain of stages for every state, concurrently; one outcome per input, in order."""
        futures = [self.submit(stages, s) for s in states]
        return [_outcome(f, stages) for f in futures]

    def run_stage(self, stage: Any, states: Sequence[Any]) -> list[QueryOutcome]:
        return self.run_stages([stage], states)

    def _start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop.run_forever, name="specrag-engine", daemon=True)
                self._thread.start()
                self._finalizer.detach()
                self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread, self._executors)

    # -- one query ------------------------------------------------------------------------
    async def _run_query(self, stages: tuple, state: Any, queued: float) -> QueryOutcome:
        task = asyncio.current_task()
        self._queries.add(task)
        self.admitted += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        start = time.perf_counter()
        scope = _QueryScope()
        items, done, current = [state], [], ""
        try:
            for stage in stages:
                current = stage.name
                items = await self._stage_over_parts(stage, items, scope)
                done.append(stage.name)
            _account(items[0].trace, scope.clock, start - queued, time.perf_counter() - start, done)
            return QueryOutcome(items, stages=tuple(done))
        except Exception as e:  # a query's failure is data, not a crash of the others
            return QueryOutcome([], e, "".join(traceback.format_exception(e)), current, tuple(done))
        finally:
            await scope.close()
            self.in_flight -= 1
            self._queries.discard(task)

    async def _stage_over_parts(self, stage: Any, items: list, scope: _QueryScope) -> list:
        """One stage over every part of a query (parts concurrently); flattens fan-outs."""
        if len(items) == 1:
            results = [await self._run_one(stage, items[0], scope)]
        else:
            loop = asyncio.get_running_loop()
            tasks = [loop.create_task(self._run_one(stage, item, scope)) for item in items]
            try:
                results = await asyncio.gather(*tasks)
            except BaseException:  # one part failed: the query fails, its other parts stop
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        out: list = []
        for r in results:
            out.extend(r if isinstance(r, list) else [r])
        return out

    async def _run_one(self, stage: Any, item: Any, scope: _QueryScope) -> Any:
        """One stage of one part, under the stage timeout. The timeout measures the stage's own
        time and its calls' service, not the time its requests queue behind other queries'
        (up to ``queue_timeout_s``): under load a query waits its turn instead of failing."""
        loop = asyncio.get_running_loop()
        limit, queue_limit = self.config.stage_timeout_s, self.config.queue_timeout_s
        with scope.clock.busy(_STAGE + stage.name):
            step = _StepMark(loop.time(), scope.clock.total(WAITING))
            ctx = Context(self, item.trace, scope, step)
            token = WAIT_CLOCK.set(scope.clock)
            try:  # the task copies the context: its calls mark their queue waits on this clock
                task = loop.create_task(stage.run(item, ctx))
            finally:
                WAIT_CLOCK.reset(token)
            try:
                while True:  # the limit runs from the stage's start or its last next_step()
                    waited = min(scope.clock.total(WAITING) - step.waited, queue_limit)
                    remaining = step.started + limit + waited - loop.time()
                    if remaining <= 0:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                        detail = (f" (after {waited:.0f}s waiting for batched calls, the most --queue-timeout "
                                  "allows)" if 0 < queue_limit <= waited else "")
                        where = f" in step {step.steps}" if step.steps else ""
                        raise StageTimeout(f"stage {stage.name!r} exceeded {limit}s{where}{detail}")
                    done, _ = await asyncio.wait({task}, timeout=remaining)
                    if done:
                        return task.result()  # a backend's own timeout (e.g. TritonTimeout) keeps its type
            except asyncio.CancelledError:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise

    # -- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel what is still running (and count it), stop the loop thread, free the pools."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self.cancelled_at_close = asyncio.run_coroutine_threadsafe(_cancel_all(self._queries), self._loop).result()
        self._finalizer.detach()
        _stop_loop(self._loop, thread, self._executors)

    @property
    def closed(self) -> bool:
        return self._closed


_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_STAGE = "stage:"
SERVICE_TIMINGS = ("retrieval_s", "generation_s", "verification_s", "embedding_s")


def _account(trace: Trace, clock: _Clock, queued_s: float, served_s: float, stages: Sequence[str]) -> None:
    """A finished query's (or segment's) wall times, into its first output's trace only: a
    fan-out's parts are re-joined by summing traces, and their time was spent together."""
    trace.add_time("queue_s", queued_s)
    trace.add_time("served_s", served_s)
    trace.add_time("total_s", queued_s + served_s)
    for kind in SERVICE_TIMINGS:
        trace.add_time(kind, clock.seconds.get(kind, 0.0))
    trace.add_time("other_s", max(served_s - clock.seconds.get(CALLS, 0.0), 0.0))
    for name in dict.fromkeys(stages):
        trace.add_stage_time(name, clock.seconds.get(_STAGE + name, 0.0))


async def _cancel_all(queries: set) -> int:
    """Cancel every task on the loop; returns how many of them were queries."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    running = sum(1 for t in tasks if t in queries)
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return running


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread | None,
               executors: dict[str, ThreadPoolExecutor]) -> None:
    if thread is not None and thread.is_alive():
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join()
    for ex in executors.values():
        ex.shutdown(wait=True, cancel_futures=True)
    if not loop.is_running() and not loop.is_closed():
        loop.close()


def _outcome(future: concurrent.futures.Future, stages: Sequence[Any]) -> QueryOutcome:
    try:
        return future.result()
    except concurrent.futures.CancelledError as e:  # the engine was closed under it
        return QueryOutcome([], e, "", getattr(stages[0], "name", "") if stages else "")


def _embed_rows(embed):
    def call(texts: list[str]) -> list:
        return list(embed(texts))
    return call

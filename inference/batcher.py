"""Micro-batching of concurrent awaitable requests into batched backend calls.

Stages are written one query at a time; throughput on a model comes from batching. A
MicroBatcher sits between the two: every ``submit`` parks its request, and a flusher sends
up to ``max_batch`` parked requests to the backend in one call as soon as the batch is full
or the oldest request has waited ``max_wait_s``. The backend call runs in a worker thread
(torch releases the GIL), so the event loop keeps scheduling other queries meanwhile.

A batch sent while the backend's worker is busy waits for it *open*: requests that arrive
meanwhile join it (up to ``max_batch``) until the worker starts it. Without that, requests
that trickle in (a streaming job's queries reaching a stage one by one) each left as a batch
of one behind a long call, and a 1.5B model decoded one row at a time.
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

# The waiting clock of the query whose code is running (the engine sets it per stage): a
# request's time in the queue — parked here, or its batch waiting for the backend's worker —
# is marked on it as WAITING, so a stage's timeout measures service, not the queue it is in.
WAIT_CLOCK: contextvars.ContextVar = contextvars.ContextVar("specrag_wait_clock", default=None)
WAITING = "queue_wait"


class _Entry:
    """A parked request, its future, when it was parked, and the clock its wait is marked on."""

    __slots__ = ("request", "future", "queued", "clock")

    def __init__(self, request: Any, future: asyncio.Future, clock: Any):
        self.request, self.future, self.queued, self.clock = request, future, time.perf_counter(), clock
        if clock is not None:
            clock.start(WAITING)

    def served(self) -> None:
        """The wait is over (its batch runs, or it left the queue); marks once."""
        if self.clock is not None:
            self.clock.stop(WAITING)
            self.clock = None


class _Batch:
    """Entries bound for one backend call; open (taking requests) until the worker starts it."""

    __slots__ = ("entries", "sealed")

    def __init__(self, entries: list[_Entry]):
        self.entries, self.sealed = entries, False


class MicroBatcher:
    """Coalesces concurrent requests for one operation of one backend.

    ``call`` takes a list of requests and returns a list of results in the same order; an
    exception in that list fails only its own request.
    ``group_key`` splits requests that cannot share a call (e.g. different ``k``).
    ``cancel`` is told the requests of a call under way whose waiters were cancelled.
    """

    def __init__(self, name: str, call: Callable[[list[Any]], Sequence[Any]], *,
                 max_batch: int, max_wait_s: float, executor: ThreadPoolExecutor,
                 group_key: Callable[[Any], Any] | None = None,
                 cancel: Callable[[list[Any]], None] | None = None):
        if max_batch < 1:
            raise ValueError(f"{name}: max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"{name}: max_wait_s must be >= 0, got {max_wait_s}")
        self.name = name
        self._call = call
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._executor = executor
        self._group_key = group_key or (lambda _r: None)
        self._cancel = cancel
        self._pending: dict[Any, list[_Entry]] = {}
        self._open: dict[Any, _Batch] = {}  # per group key: the batch sent but not started, still taking requests
        self._seal = threading.Lock()  # the worker thread seals a batch as it starts it
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task] = set()  # batched calls under way (kept: tasks are weakly held)
        self.calls = 0
        self.items = 0
        self.busy_s = 0.0
        self.withdrawn = 0  # requests of cancelled queries taken out of the queue unsent
        self.abandoned = 0  # requests of cancelled queries whose call was under way (told to cancel)

    async def submit(self, request: Any) -> Any:
        """Queue one request; returns its result (or raises the backend's error)."""
        return (await self.submit_timed(request))[0]

    async def submit_timed(self, request: Any) -> tuple[Any, float, float]:
        """Like submit, also returning (seconds waited in the queue, seconds of the batched call)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        key = self._group_key(request)
        entry = _Entry(request, fut, WAIT_CLOCK.get())
        if self._join_open(key, entry):
            return await self._wait(key, entry)
        queue = self._pending.setdefault(key, [])
        queue.append(entry)
        if len(queue) >= self.max_batch:
            self._flush(key)
        elif key not in self._timers:
            self._timers[key] = loop.call_later(self.max_wait_s, self._flush, key)
        return await self._wait(key, entry)

    async def _wait(self, key: Any, entry: _Entry) -> tuple[Any, float, float]:
        try:
            return await entry.future
        except asyncio.CancelledError:
            if not self._withdraw(key, entry) and self._cancel is not None:
                self.abandoned += 1  # sent: the backend may still stop computing it
                self._cancel([entry.request])
            raise
        finally:
            entry.served()

    def _join_open(self, key: Any, entry: _Entry) -> bool:
        """Add the request to the batch of its key that waits for the worker, if it has room."""
        batch = self._open.get(key)
        if batch is None:
            return False
        with self._seal:
            if batch.sealed or len(batch.entries) >= self.max_batch:
                return False
            batch.entries.append(entry)
            return True

    def _withdraw(self, key: Any, entry: _Entry) -> bool:
        """A cancelled query's request still waiting for its batch never reaches the backend;
        False when it was no longer waiting (its batch was sent)."""
        batch = self._open.get(key)
        if batch is not None:
            with self._seal:
                if not batch.sealed and entry in batch.entries:
                    batch.entries.remove(entry)
                    self.withdrawn += 1
                    return True
        queue = self._pending.get(key)
        if queue is None:
            return False
        withdrawn = False
        for i, queued in enumerate(queue):
            if queued is entry:
                del queue[i]
                self.withdrawn += 1
                withdrawn = True
                break
        if not queue:
            self._pending.pop(key, None)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        return withdrawn

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not yet sent)."""
        return sum(len(q) for q in self._pending.values())

    def _flush(self, key: Any) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        queue = [e for e in self._pending.pop(key, []) if not e.future.done()]
        loop = asyncio.get_running_loop()
        while queue:
            entries, queue = queue[: self.max_batch], queue[self.max_batch:]
            batch = _Batch(entries)
            self._open[key] = batch  # the last one sent takes what arrives while it waits
            task = loop.create_task(self._run(key, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, key: Any, batch: _Batch) -> None:
        """One backend call; ``batch`` takes requests until the worker thread starts it."""
        loop = asyncio.get_running_loop()

        def forget() -> None:  # loop thread: later requests no longer join this batch
            if self._open.get(key) is batch:
                del self._open[key]

        def call(_):  # worker thread: the batch is sealed and leaves the queue now
            with self._seal:
                batch.sealed = True
                entries = list(batch.entries)
            loop.call_soon_threadsafe(lambda: (forget(), [e.served() for e in entries]))
            if not entries:  # every request withdrawn while the batch waited: no call
                return entries, []
            try:
                results = self._call([e.request for e in entries])
                if len(results) != len(entries):
                    raise RuntimeError(f"{self.name}: backend returned {len(results)} results "
                                       f"for {len(entries)} requests")
                return entries, results
            except Exception as e:  # noqa: BLE001 - the loop thread decides (below)
                return entries, e

        start = time.perf_counter()
        try:
            entries, results = await loop.run_in_executor(self._executor, call, None)
        except BaseException as e:  # cancelled / interrupted: every waiter learns of it
            forget()
            with self._seal:
                batch.sealed = True
            for entry in batch.entries:
                if not entry.future.done():
                    entry.future.set_exception(e)
            return
        if isinstance(results, Exception):
            if len(entries) == 1:
                if not entries[0].future.done():
                    entries[0].future.set_exception(results)
                return
            # one bad request (e.g. a prompt over the model's limit) must not fail the
            # others: each is retried alone, all at once (a remote server takes them in
            # parallel; a local model's single-worker pool runs them back to back)
            await asyncio.gather(*(self._run(None, _Batch([e])) for e in entries if not e.future.done()))
            return
        if not entries:
            return
        end = time.perf_counter()
        self.calls += 1
        self.items += len(entries)
        self.busy_s += end - start
        for entry, result in zip(entries, results):
            if entry.future.done():
                continue
            if isinstance(result, BaseException):  # a backend that fails rows alone
                entry.future.set_exception(result)
            else:
                entry.future.set_result((result, start - entry.queued, end - start))

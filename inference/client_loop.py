"""A private asyncio loop on a daemon thread, for the remote backends' clients.

The engine calls a backend from worker threads, one micro-batch per call; the Triton and vLLM
clients are asyncio ones (many rows in flight over one connection). Each backend keeps one loop
thread per process for its clients and hands it coroutines from any thread with ``run``; a
row of a batched call runs as its own task (``run_rows``), so a row whose query was cancelled or
timed out can be abandoned (``abandon``): its request is closed, and the server (vLLM aborts a
request whose client went away) stops computing it for nobody.

    loop = ClientLoop("vllm-client")
    result = loop.run(fetch(...), timeout=30)
    loop.stop()
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Sequence


class RowAbandoned(RuntimeError):
    """A row's request was cancelled because nobody waits for its answer any more."""


class ClientLoop:
    """One event loop running forever on a daemon thread named ``name``."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        # id(row) -> the tasks of that row object in calls under way, on the loop thread only (one
        # object can be two queries' rows: the same text to embed)
        self._inflight: dict[int, list[asyncio.Task]] = {}

    def run(self, coro: Awaitable, timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop from another thread and wait for its result. Past ``timeout``
        (or when the waiting thread is interrupted) the coroutine is cancelled, not left running."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            if not future.done():
                future.cancel()  # cancels the task on the loop: its HTTP/gRPC requests are closed
            raise

    def run_rows(self, rows: Sequence[Any], call: Callable[[Any], Awaitable], return_exceptions: bool = True) -> list:
        """``call(row)`` for every row at once, each its own task; the results in order, a failed
        row's exception in its place (``return_exceptions``) or raised (the first, when not). A row
        passed to ``abandon`` while its task runs is cancelled (its request closed) and gets
        ``RowAbandoned``."""
        async def gather() -> list:
            tasks = [asyncio.ensure_future(call(row)) for row in rows]
            for row, task in zip(rows, tasks):
                self._inflight.setdefault(id(row), []).append(task)
            try:
                results = await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                for row, task in zip(rows, tasks):
                    held = self._inflight.get(id(row), [])
                    held.remove(task)
                    if not held:
                        self._inflight.pop(id(row), None)
            return [RowAbandoned("abandoned: its query was cancelled or timed out")
                    if isinstance(r, asyncio.CancelledError) else r for r in results]
        results = self.run(gather()) if rows else []
        if not return_exceptions:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def abandon(self, rows: Sequence[Any]) -> None:
        """Cancel the tasks of rows in a ``run_rows`` call under way (from any thread, at once).
        Best effort: a row whose call has not reached the loop yet, or has ended, is left, and so
        is a row object that more than one task holds (which of them nobody waits for is unknown)."""
        keys = [id(row) for row in rows]

        def cancel() -> None:
            for key in keys:
                held = self._inflight.get(key, [])
                if len(held) == 1:
                    held[0].cancel()
        self.loop.call_soon_threadsafe(cancel)

    def stop(self, closing: Awaitable | None = None) -> None:
        """Run ``closing`` (a client's close, best effort within 5 s), then stop the loop."""
        if closing is not None:
            try:
                self.run(closing, timeout=5)
            except Exception:  # closing at exit: nothing left to tell
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)

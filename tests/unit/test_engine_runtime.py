"""The per-process engine with a fast fake backend (no model, milliseconds): admission from
several threads into shared micro-batches, bounded in-flight, structured concurrency,
cancellation, timeout labels, failure isolation and a clean teardown."""
import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest

from specrag.inference import Engine, EngineConfig, ModelBackend, GenerateRequest, Generation, Services, StageTimeout, Trace


class FakeLM(ModelBackend):
    """Echoes the prompt; records every batch; fails on prompts it is told to fail on."""

    name = "fake"
    capabilities = frozenset({"generate"})

    def __init__(self, delay_s: float = 0.0, inflight: int = 1, raise_on: tuple[str, ...] = (),
                 timeout_on: tuple[str, ...] = ()):
        self.delay_s, self.max_inflight_batches = delay_s, inflight
        self.raise_on, self.timeout_on = raise_on, timeout_on
        self.batches: list[list[str]] = []
        self.concurrent = self.peak_concurrent = 0
        self._lock = threading.Lock()

    def generate(self, requests):
        with self._lock:
            self.batches.append([r.prompt for r in requests])
            self.concurrent += 1
            self.peak_concurrent = max(self.peak_concurrent, self.concurrent)
        try:
            time.sleep(self.delay_s)
            for r in requests:
                if r.prompt in self.timeout_on:
                    raise TimeoutError(f"server request for {r.prompt!r} timed out after 1.0s")
                if r.prompt in self.raise_on and len(requests) > 1:
                    raise ValueError("batch rejected")
                if r.prompt in self.raise_on:
                    raise ValueError(f"prompt {r.prompt!r} rejected")
            return [Generation(f"<{r.prompt}>", [1], [0.0], 1, "stop") for r in requests]
        finally:
            with self._lock:
                self.concurrent -= 1


@dataclass
class Q:
    prompt: str
    trace: Trace = field(default_factory=Trace)
    out: str = ""


@dataclass
class Ask:
    name: str = "Ask"

    async def run(self, item, ctx):
        item.out = (await ctx.generate(GenerateRequest(item.prompt))).text
        return item


@dataclass
class Hold:
    """Waits until released (a query that stays in flight)."""

    release: threading.Event
    name: str = "Hold"

    async def run(self, item, ctx):
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        return item


def _engine(backend, **config) -> Engine:
    return Engine(Services(models={"generator": backend}), EngineConfig(**config))


def test_queries_from_several_threads_share_micro_batches():
    """Two 'bundles' on two threads submit as their elements arrive; their requests meet in
    the same backend calls instead of queueing behind each other."""
    lm = FakeLM(delay_s=0.02)
    engine = _engine(lm, max_batch=16, max_wait_s=0.05)
    futures: list = []
    barrier = threading.Barrier(2)

    def bundle(tag):
        barrier.wait()
        for i in range(6):
            futures.append(engine.submit([Ask()], Q(f"{tag}{i}")))

    threads = [threading.Thread(target=bundle, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = [f.result(timeout=5) for f in futures]
    assert sorted(o.outputs[0].out for o in outcomes) == sorted(f"<{t}{i}>" for t in "ab" for i in range(6))
    mixed = [b for b in lm.batches if {p[0] for p in b} == {"a", "b"}]
    assert mixed, f"no batch mixed the two threads' queries: {lm.batches}"
    assert len(lm.batches) < 12
    engine.close()


def test_in_flight_is_bounded_and_submit_blocks_beyond_it():
    release = threading.Event()
    engine = _engine(FakeLM(), max_in_flight=3)
    submitted = []

    def producer():
        for i in range(8):
            submitted.append(engine.submit([Hold(release)], Q(str(i))))

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.2)
    assert len(submitted) == 3 and engine.in_flight == 3  # the producer waits for a free slot
    release.set()
    t.join(timeout=5)
    assert [f.result(timeout=5).error for f in submitted] == [None] * 8
    assert engine.peak_in_flight == 3 and engine.admitted == 8
    assert all(f.result().outputs[0].trace.timings["queue_s"] >= 0 for f in submitted)
    engine.close()


@dataclass
class SlowAsk:
    """Queues a request that waits 1 s for its batch: the stage times out first."""

    name: str = "SlowAsk"

    async def run(self, item, ctx):
        return (await ctx.generate(GenerateRequest(item.prompt))).text


def test_a_timed_out_query_withdraws_its_queued_request_and_is_labelled_by_stage():
    lm = FakeLM()
    # queue_timeout 0: time parked in the batcher counts against the stage (the default leaves
    # up to an hour of it out: see the next test)
    engine = _engine(lm, max_batch=8, max_wait_s=1.0, stage_timeout_s=0.1, queue_timeout_s=0.0)
    outcome = engine.run_stage(SlowAsk(), [Q("late")])[0]
    assert isinstance(outcome.error, StageTimeout) and outcome.stage == "SlowAsk"
    assert "stage 'SlowAsk' exceeded 0.1s" in str(outcome.error)
    time.sleep(1.1)  # past the batch's max wait: nothing may be sent for the withdrawn request
    assert lm.batches == []
    assert engine.batch_stats()["generator.generate"]["withdrawn"] == 1
    engine.close()


class CancellableLM(FakeLM):
    """A slow fake server backend: records the rows it is told nobody waits for."""

    def __init__(self, delay_s: float):
        super().__init__(delay_s=delay_s)
        self.cancelled: list[str] = []

    def cancel(self, requests):
        self.cancelled += [r.prompt for r in requests]


def test_a_timed_out_query_hands_its_sent_request_to_the_backends_cancel():
    """A request already in a running call when its stage times out is passed to the backend's
    ``cancel`` (a server backend closes it), once, and counted as abandoned."""
    lm = CancellableLM(delay_s=1.0)
    engine = _engine(lm, max_batch=2, max_wait_s=0.05, stage_timeout_s=0.3, queue_timeout_s=0.0)
    timed_out = engine.submit([Ask()], Q("late"))
    assert timed_out.result(5).error is not None and lm.cancelled == ["late"]
    assert engine.batch_stats()["generator.generate"]["abandoned"] == 1
    engine.close()


def test_waiting_behind_other_queries_does_not_count_against_the_stage_timeout():
    """Eight queries, one request per backend call of 0.2 s: the last waits ~1.4 s in the
    queue, longer than the 0.5 s stage timeout, and still completes (its service is 0.2 s)."""
    lm = FakeLM(delay_s=0.2)
    engine = _engine(lm, max_batch=1, max_wait_s=0.0, stage_timeout_s=0.5)
    outcomes = engine.run_stage(Ask(), [Q(f"q{i}") for i in range(8)])
    assert [o.error for o in outcomes] == [None] * 8 and len(lm.batches) == 8
    engine.close()


@dataclass
class Loop:
    """Asks ``steps`` times in turn, marking each step (``ctx.next_step``) or not."""

    steps: int
    mark: bool = True
    name: str = "Loop"

    async def run(self, item, ctx):
        for i in range(self.steps):
            if self.mark:
                ctx.next_step()
            item.out = (await ctx.generate(GenerateRequest(f"{item.prompt}{i}"))).text
        return item


def test_a_loop_stage_gets_the_stage_timeout_for_each_step():
    """Six 0.1 s calls in turn: 0.6 s of service in all, against a 0.25 s limit. Marked, each
    step is under it and the query completes; unmarked, the loop fails as one long stage; and
    a step that hangs still fails, named."""
    lm = FakeLM(delay_s=0.1)
    engine = _engine(lm, max_batch=1, max_wait_s=0.0, stage_timeout_s=0.25, queue_timeout_s=0.0)
    marked, unmarked = engine.run_stage(Loop(6), [Q("m")])[0], engine.run_stage(Loop(6, mark=False), [Q("u")])[0]
    assert marked.error is None and marked.outputs[0].out == "<m5>"
    assert isinstance(unmarked.error, StageTimeout) and "stage 'Loop' exceeded 0.25s" in str(unmarked.error)
    assert "in step" not in str(unmarked.error)
    engine.close()
    hung = _engine(FakeLM(delay_s=2.0), max_batch=1, max_wait_s=0.0, stage_timeout_s=0.25, queue_timeout_s=0.0)
    outcome = hung.run_stage(Loop(3), [Q("h")])[0]
    assert isinstance(outcome.error, StageTimeout) and "exceeded 0.25s in step 1" in str(outcome.error)
    hung.close()


def test_a_hung_backend_still_times_out_its_queries():
    """The call in progress times out on the stage limit; those queued behind it after the
    queue limit, labelled as such."""
    lm = FakeLM(delay_s=2.0)
    engine = _engine(lm, max_batch=1, max_wait_s=0.0, stage_timeout_s=0.3, queue_timeout_s=0.4)
    started = time.perf_counter()
    outcomes = engine.run_stage(Ask(), [Q("a"), Q("b"), Q("c")])
    assert all(isinstance(o.error, StageTimeout) for o in outcomes)
    assert "waiting for batched calls" not in str(outcomes[0].error)
    assert all("waiting for batched calls" in str(o.error) for o in outcomes[1:])
    assert time.perf_counter() - started < 1.5  # not after the 2 s calls
    engine.close()


def test_a_backend_timeout_keeps_its_own_label():
    engine = _engine(FakeLM(timeout_on=("t",)), max_wait_s=0.0, stage_timeout_s=30)
    outcome = engine.run_stage(Ask(), [Q("t")])[0]
    assert type(outcome.error) is TimeoutError and "server request for 't' timed out" in str(outcome.error)
    assert not isinstance(outcome.error, StageTimeout)
    engine.close()


def test_a_failed_micro_batch_is_retried_row_by_row_concurrently():
    lm = FakeLM(delay_s=0.05, inflight=4, raise_on=("bad",))
    engine = _engine(lm, max_batch=4, max_wait_s=0.05)
    outcomes = engine.run_stage(Ask(), [Q("x"), Q("bad"), Q("y"), Q("z")])
    assert "prompt 'bad' rejected" in str(outcomes[1].error) and outcomes[1].stage == "Ask"
    assert [o.outputs[0].out for i, o in enumerate(outcomes) if i != 1] == ["<x>", "<y>", "<z>"]
    assert sorted(map(len, lm.batches)) == [1, 1, 1, 1, 4]
    assert lm.peak_concurrent >= 2  # the four single-row retries ran at the same time
    engine.close()


@dataclass
class Background:
    """Starts a task that would run forever, and returns without waiting for it."""

    flags: dict
    name: str = "Background"

    async def run(self, item, ctx):
        async def forever():
            try:
                await asyncio.sleep(3600)
            finally:
                self.flags[item.prompt] = "cancelled"
        ctx.spawn(forever())
        await asyncio.sleep(0)
        if item.prompt == "fail":
            raise RuntimeError("query failed")
        return item


def test_tasks_a_query_starts_end_with_the_query():
    flags: dict = {}
    engine = _engine(FakeLM())
    outcomes = engine.run_stage(Background(flags), [Q("ok"), Q("fail")])
    assert outcomes[0].error is None and isinstance(outcomes[1].error, RuntimeError)
    assert flags == {"ok": "cancelled", "fail": "cancelled"}
    engine.close()
    assert engine.cancelled_at_close == 0  # nothing was left pending


@dataclass
class FanOut:
    name: str = "FanOut"

    async def run(self, item, ctx):
        return [Q(f"{item.prompt}.{i}") for i in range(3)]


@dataclass
class FailPart:
    name: str = "Work"

    async def run(self, item, ctx):
        if item.prompt.endswith(".1"):
            raise ValueError("part 1 failed")
        return item


def test_a_chain_runs_fanned_out_parts_and_fails_the_query_once():
    engine = _engine(FakeLM(), max_wait_s=0.01)
    ok, bad = engine.run_stages([FanOut(), Ask()], [Q("a")])[0], engine.run_stages([FanOut(), FailPart()], [Q("b")])[0]
    assert [p.out for p in ok.outputs] == ["<a.0>", "<a.1>", "<a.2>"] and ok.stages == ("FanOut", "Ask")
    assert list(ok.outputs[0].trace.stages) == ["FanOut", "Ask"]
    assert bad.outputs == [] and bad.stage == "Work" and "part 1 failed" in str(bad.error)
    engine.close()


def test_close_cancels_running_queries_and_stops_the_loop_thread():
    release = threading.Event()
    engine = _engine(FakeLM())
    futures = [engine.submit([Hold(release)], Q(str(i))) for i in range(3)]
    time.sleep(0.05)
    engine.close()
    assert engine.cancelled_at_close == 3 and all(f.cancelled() for f in futures)
    assert not any(t.name == "specrag-engine" and t.is_alive() for t in threading.enumerate()
                   if t is engine._thread)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([Ask()], Q("x"))


def test_timings_add_up_across_parallel_parts():
    """Three parts ask at once: the query's generation time is the wall time its calls were
    outstanding (once), not the sum over parts; queue + served = total; only part 0 carries it."""
    engine = _engine(FakeLM(delay_s=0.1), max_batch=1, max_wait_s=0.0)
    [outcome] = engine.run_stages([FanOut(), Ask()], [Q("a")])
    engine.close()
    first, rest = outcome.outputs[0].trace, outcome.outputs[1:]
    t = first.timings
    assert t["total_s"] == pytest.approx(t["queue_s"] + t["served_s"])
    # one model call at a time (max_batch=1, one batch in flight): ~0.3 s, never 3 x 0.3 s
    assert 0.28 <= t["generation_s"] <= t["served_s"] < 0.6
    assert t["other_s"] == pytest.approx(t["served_s"] - t["generation_s"], abs=0.02)
    assert sum(first.stages.values()) <= t["served_s"] + 1e-6
    assert all(not p.trace.timings for p in rest)
    assert sum(p.trace.counts["model_calls"] for p in outcome.outputs) == 3

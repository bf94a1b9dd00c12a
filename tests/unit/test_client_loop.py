"""The remote backends' client loop: rows of a call run as their own tasks, and a row nobody
waits for any more is cancelled alone while its batch-mates finish."""
import asyncio
import threading
import time

from specrag.inference.client_loop import ClientLoop, RowAbandoned


def test_an_abandoned_row_is_cancelled_alone_and_the_others_finish():
    loop = ClientLoop("test-client")
    finished, cancelled = [], []

    async def call(row):
        try:
            await asyncio.sleep(0.05 if row == "quick" else 5.0)
        except asyncio.CancelledError:
            cancelled.append(row)
            raise
        finished.append(row)
        return row.upper()

    rows = ["quick", "slow"]
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("results", loop.run_rows(rows, call)))
    started = time.perf_counter()
    worker.start()
    time.sleep(0.2)
    loop.abandon([rows[1]])
    worker.join(5)
    assert time.perf_counter() - started < 2  # not the slow row's 5 s
    results = out["results"]
    assert results[0] == "QUICK" and isinstance(results[1], RowAbandoned)
    assert finished == ["quick"] and cancelled == ["slow"]
    loop.abandon(rows)  # rows of a call that has ended: nothing to do
    assert loop.run(asyncio.sleep(0, result=7), timeout=1) == 7
    loop.stop()


def test_a_row_object_two_calls_hold_is_never_abandoned_and_a_failure_can_raise():
    """The same object can be two queries' rows (one text to embed): abandoning it for one query
    must not cancel the other's, so an ambiguous row runs to its end."""
    loop = ClientLoop("test-client-shared")

    async def call(row):
        await asyncio.sleep(0.3)
        return row.upper()

    shared = "the same text"
    out = []
    workers = [threading.Thread(target=lambda: out.append(loop.run_rows([shared], call))) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.1)
    loop.abandon([shared])
    for w in workers:
        w.join(5)
    assert out == [["THE SAME TEXT"], ["THE SAME TEXT"]]

    async def fails(row):
        raise ValueError(f"bad {row}")
    assert isinstance(loop.run_rows(["a"], fails)[0], ValueError)
    try:
        loop.run_rows(["a"], fails, return_exceptions=False)
        raise AssertionError("no error raised")
    except ValueError as e:
        assert str(e) == "bad a"
    assert loop.run_rows([], fails) == []
    loop.stop()

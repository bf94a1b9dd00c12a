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

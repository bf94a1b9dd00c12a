"""Progress of a long job on the launcher's console: items done, rate, ETA, dead letters.

Runners differ in whether (and how late) they report metrics to the launcher while a job
runs, so workers report through the job's own output folder instead, which every runner can
reach (FileSystems: local, GCS, HDFS): ``CountProgress`` passes elements through and, every
``interval_s`` per DoFn instance when it changed (a timer thread), writes its running count to
``<output>/.progress/<kind>-<uid>.json`` (one tiny file per instance: no shared state, no
locks, a few bytes every few seconds). ``watch_progress`` reads those files on a thread of the
launcher and prints one line every ``SPECRAG_PROGRESS_S`` seconds (10; 0: silent), then a last
line when the job ends, and removes the folder. Counts of a bundle the runner retries may be
counted twice: the console's figures are a progress report, the manifest's counters are exact.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections import deque
from typing import Iterator, TextIO

import apache_beam as beam

from specrag.jobio.files import delete, join, match_files, mkdirs, read_text, write_text
from specrag.jobio.tables import open_table
from specrag.wording import count, duration

PROGRESS_DIR = ".progress"
KINDS = ("done", "dead", "admitted", "failed")  # admitted / failed: a streaming job's queries in, failed in a stage


def progress_dir(output: str) -> str:
    return join(output, PROGRESS_DIR)


class _Count(beam.DoFn):
    """Counts elements; a timer thread publishes the count every ``interval_s`` when it changed,
    so progress moves while elements arrive in bursts (a batch of model calls) or stall, not only
    when the next one arrives."""

    def __init__(self, folder: str, kind: str, interval_s: float):
        self.folder, self.kind, self.interval_s = folder, kind, interval_s

    def setup(self):
        self._path = join(self.folder, f"{self.kind}-{uuid.uuid4().hex}.json")
        self._n, self._written = 0, 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._timer = threading.Thread(target=self._publish_on_timer, name="specrag-progress", daemon=True)
        self._timer.start()

    def process(self, element):
        self._n += 1
        yield element

    def finish_bundle(self):
        self._write()

    def teardown(self):
        self._stop.set()
        self._write()

    def _publish_on_timer(self):
        while not self._stop.wait(self.interval_s):
            self._write()

    def _write(self):
        with self._lock:
            n = self._n
            if n == self._written:
                return
            try:
                write_text(self._path, json.dumps({"n": n}))
                self._written = n
            except Exception:  # progress is best effort: never fail the job for it
                pass


class CountProgress(beam.PTransform):
    """Elements pass through unchanged; their count goes to the progress folder as ``kind``."""

    def __init__(self, folder: str, kind: str = "done", interval_s: float = 2.0):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.folder, self.kind, self.interval_s = folder, kind, interval_s

    def expand(self, pcoll):
        return pcoll | beam.ParDo(_Count(self.folder, self.kind, self.interval_s))


def read_progress(folder: str, last: dict[str, int] | None = None) -> dict[str, int]:
    """{kind: count} summed over the workers' files; a file being replaced keeps its last value."""
    last = last if last is not None else {}
    for path in match_files(join(folder, "*.json")):
        try:
            last[path] = int(json.loads(read_text(path))["n"])
        except Exception:  # half-renamed or gone: its last value stands
            pass
    totals = dict.fromkeys(KINDS, 0)
    for path, n in last.items():
        kind = path.rsplit("/", 1)[-1].split("-", 1)[0]
        if kind in totals:
            totals[kind] += n
    return totals


def count_rows(files: list[str]) -> int | None:
    """Rows in input files (a Parquet footer, no data read); None if one is unreadable."""
    try:
        return sum(open_table(f).metadata.num_rows for f in files)
    except Exception:
        return None


def count_ids(files: list[str], column: str) -> int:
    """Distinct ids in a column of earlier outputs (what a resumed run skips)."""
    from specrag.jobio.files import read_parquet
    return len({i for f in files for i in read_parquet(f, columns=[column]).column(column).to_pylist()})


def progress_line(job: str, done: int, dead: int, total: int | None, rate: float | None, unit: str,
                  in_flight: int | None = None, rate_window_s: float = 60.0) -> str:
    """`answer: 340/1000 queries (34%) · 2.10 queries/s · ETA 5m14s · 3 dead letters` (of the
    total, both answered and dead letters are done); a job without an end (streaming), the
    answered ones as its final line and manifest count them:
    `answer: 340 queries · 2.10 queries/s over 5m · 12 in flight · ...`"""
    finished = done + dead
    parts = [f"{job}: {finished}/{total} {unit} ({100 * finished / total:.0f}%)" if total
             else f"{job}: {done} {unit}"]
    if rate:
        parts.append(f"{rate:.2f} {unit}/s" + (f" over {duration(rate_window_s)}" if in_flight is not None else ""))
        if total and total > finished:
            parts.append(f"ETA {duration((total - finished) / rate)}")
    if in_flight is not None:
        parts.append(f"{in_flight} in flight")
    parts.append(count(dead, "dead letter"))
    return " · ".join(parts)



class ProgressWatcher:
    """The launcher's side: polls the progress folder, keeps a rate over the last minute."""

    def __init__(self, job: str, folder: str, total: int | None, unit: str = "queries",
                 interval_s: float | None = None, stream: TextIO | None = None, window_s: float = 60.0):
        self.job, self.folder, self.total, self.unit = job, folder, total, unit
        self.interval_s = float(os.environ.get("SPECRAG_PROGRESS_S", "10")) if interval_s is None else interval_s
        self.stream = stream or sys.stderr
        self.window_s = window_s
        self._seen: dict[str, int] = {}
        self._samples: deque[tuple[float, int]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = dict.fromkeys(KINDS, 0)
        self.started = time.monotonic()

    def poll(self) -> str:
        self.counts = read_progress(self.folder, self._seen)
        now, finished = time.monotonic(), self.counts["done"] + self.counts["dead"]
        self._samples.append((now, finished))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        (t0, n0), rate = self._samples[0], None
        if now > t0 and finished > n0:
            rate = (finished - n0) / (now - t0)
        in_flight = None
        if self.counts["admitted"]:  # a streaming job: what is admitted but not yet written
            in_flight = max(0, self.counts["admitted"] - self.counts["done"] - self.counts["failed"])
        return progress_line(self.job, self.counts["done"], self.counts["dead"], self.total, rate, self.unit,
                             in_flight, now - t0)  # the span the rate is over, not the window's length

    def _loop(self):
        last = None
        while not self._stop.wait(self.interval_s):
            line = self.poll()
            if line != last:
                print(line, file=self.stream, flush=True)
                last = line

    def start(self) -> "ProgressWatcher":
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name=f"progress-{self.job}", daemon=True)
            self._thread.start()
        return self

    def stop(self, outcome: str = "finished") -> None:
        """Stop the console lines; the final "finished" line only when the job did finish, else
        "stopped after …" with why: ``failed``, or ``interrupted`` (SIGINT: resumable, nothing lost)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        if self.interval_s <= 0:
            return
        dead = count(self.counts["dead"], "dead letter")
        if outcome != "finished":
            why = "interrupted" if outcome == "interrupted" else "the job failed"
            print(f"{self.job}: stopped after {self.counts['done']} {self.unit}, {dead} ({why})",
                  file=self.stream, flush=True)
        else:
            elapsed = time.monotonic() - self.started
            finished = self.counts["done"] + self.counts["dead"]
            print(f"{self.job}: finished {self.counts['done']} {self.unit}, {dead} in {duration(elapsed)} "
                  f"({finished / elapsed if elapsed else 0:.2f} {self.unit}/s)", file=self.stream, flush=True)


def is_interrupt(error: BaseException) -> bool:
    """Ctrl-C: a KeyboardInterrupt, or the RuntimeError naming one that Beam re-raises when the
    interrupt lands inside a DoFn (``_reraise_augmented`` cannot rebuild a KeyboardInterrupt)."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, RuntimeError) and str(error).startswith("KeyboardInterrupt"))


@contextlib.contextmanager
def watch_progress(job: str, output: str, total: int | None, unit: str = "queries",
                   interval_s: float | None = None, stream: TextIO | None = None,
                   rate_window_s: float = 60.0) -> Iterator[ProgressWatcher]:
    """Around a job's run: a fresh progress folder under ``output``, a console line every few
    seconds while the job runs, a final line, and the folder removed."""
    folder = progress_dir(output)
    delete(match_files(join(folder, "*")))
    mkdirs(folder)
    watcher = ProgressWatcher(job, folder, total, unit, interval_s, stream, rate_window_s).start()
    outcome = "failed"
    try:
        yield watcher
        outcome = "finished"
    except BaseException as error:
        outcome = "interrupted" if is_interrupt(error) else "failed"
        raise
    finally:
        watcher.stop(outcome)
        with contextlib.suppress(Exception):
            delete(match_files(join(folder, "*")))
            delete([folder])

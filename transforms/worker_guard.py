"""An SDK worker of a local runner exits with the process that launched it.

FnApiRunner's multi_processing mode starts each worker as ``python -m
apache_beam.runners.worker.sdk_worker_main``. When the launching job is killed (Ctrl-C on
``specrag answer``, a stopped benchmark), the workers are re-parented and go on: the
engine's threads keep them running model calls (an hour of a 1.5B model's prefill here)
on the cores the next job measures, and their shard writes race the resumed run that the
dead job's lease no longer holds back. A worker that finds itself re-parented has no one
to deliver to, so it exits. Stdlib only: the check runs in every worker before models load.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"
log = logging.getLogger(__name__)
_lock = threading.Lock()
_watching = False


def is_sdk_worker_process() -> bool:
    """Whether this process was started as a Beam SDK worker (``python -m sdk_worker_main``),
    not a job's own process (which a user may detach with nohup on purpose)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == SDK_WORKER_MAIN


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None: gone or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def launcher_pid() -> int:
    """The process that started this one: Beam starts its local workers through ``/bin/sh -c``,
    and a killed job leaves that shell waiting on the worker, so the shell's parent is watched."""
    pid = os.getppid()
    try:
        shell = Path(f"/proc/{pid}/comm").read_text().strip() in ("sh", "bash", "dash")
    except OSError:
        return pid
    fields = _stat(pid) if shell else None
    return int(fields[1]) if fields else pid


def _alive(pid: int, started: str | None) -> bool:
    fields = _stat(pid)
    if started is None:  # no /proc: the parent changes when it dies
        return os.getppid() == pid
    return fields is not None and fields[19] == started and fields[0] not in ("Z", "X")


def exit_when_orphaned(poll_s: float = 5.0) -> bool:
    """Start (once per process) a daemon thread that ends the process once its launcher is gone.

    Returns whether a watch was started by this call."""
    global _watching
    with _lock:
        if _watching:
            return False
        _watching = True
    launcher = launcher_pid()
    fields = _stat(launcher)
    started = fields[19] if fields else None  # the start time tells a reused pid apart

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if not _alive(launcher, started):
                log.warning("specrag worker %d: its launcher (pid %d) is gone; exiting", os.getpid(), launcher)
                logging.shutdown()
                os._exit(3)

    threading.Thread(target=watch, name="specrag-orphan-watch", daemon=True).start()
    return True

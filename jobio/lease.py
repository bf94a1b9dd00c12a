"""One writer per output folder: a run holds ``<output>/.lease`` while it writes there.

Two runs into one folder (started a second apart, two ``--resume``, an ``--overwrite`` while
another run writes) would each commit shards and leave two results for one id. A run takes a
lease before it touches the folder: a JSON file with a unique token, its host and process, and a
heartbeat the launcher refreshes every ``HEARTBEAT_S``. A second run finds a live lease and is
refused with one line. A lease is stale when its process is gone (same host: no such process, a
killed one its parent has not reaped yet, or another process with its pid) or its heartbeat is
older than ``STALE_S`` (another host), so a killed run's folder can be resumed at once on the same
machine; the run that takes a stale lease over records whose it was (``took_over``, in the manifest).
A lease that could not be removed (a folder that refuses writes) is given back all the same: this
process holds it no longer, and it is stale to the next run, in this process or another. Every shard commit checks the token first (``check``): a run whose lease was
taken over stops committing.

Guarantee: on a local or shared POSIX folder the lease is created with O_EXCL, so exactly one
of two racing runs gets it. Object stores have no create-if-absent through Beam's FileSystems:
the lease is written and read back, and two runs that start within the same moment can both
pass that step; the per-shard check then stops the one whose token was overwritten before it
commits again, so at most the shards it committed before the other run's lease appeared mix.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from specrag.jobio.files import delete, exists, is_local, join, read_text, write_text

LEASE_FILE = ".lease"
_HELD: set[str] = set()  # tokens of the leases this process holds now (one it left behind is not held)
HEARTBEAT_S = 30.0
STALE_S = 600.0


class LeaseHeld(OSError):
    """Another live run writes to the folder (the folder is busy: an OSError, as EBUSY is)."""


def _write(path: str, text: str) -> None:
    """Replace the lease in one step: a rename locally; one PUT on an object store (write_text's
    delete-then-rename there would leave a moment with no lease, which a shard check would see)."""
    if is_local(path):
        write_text(path, text)
    else:
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(text.encode("utf-8"))


def _read(path: str) -> dict | None:
    try:
        return json.loads(read_text(path))
    except Exception:  # gone, or half-written by a run that died: no live holder
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): a pid the system reused starts later."""
    stat = _proc_stat(pid)
    return int(stat[19]) if stat and len(stat) > 19 else None


def _alive(pid: int, started: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: the signal's answer is all there is
    if stat[0] in ("Z", "X"):  # killed, not yet reaped by its parent: it writes nothing any more
        return False
    return started is None or int(stat[19]) == started


def stale_reason(held: dict | None, now: float | None = None) -> str | None:
    """Why a lease no longer holds (None while its run is live)."""
    if not held:
        return "no readable lease"
    if held.get("host") == socket.gethostname():
        pid = int(held.get("pid", -1))
        if pid == os.getpid():  # a run of this process that ended without removing it (its folder refused)
            return None if held.get("token") in _HELD else "its run in this process has ended"
        return None if _alive(pid, held.get("pid_started")) else f"its process {pid} is gone"
    age = (now or time.time()) - float(held.get("heartbeat", 0))
    return f"its heartbeat is {age:.0f} s old (over {STALE_S:.0f} s)" if age > STALE_S else None


def is_stale(held: dict | None, now: float | None = None) -> bool:
    return stale_reason(held, now) is not None


def describe(held: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(held.get("started", 0))))
    return f"run {str(held.get('token'))[:8]} (pid {held.get('pid')} on {held.get('host')}, since {started})"


class Lease:
    """The lease of one run on one folder; ``release`` (or the context manager) gives it back."""

    def __init__(self, folder: str):
        self.folder, self.path = folder, join(folder, LEASE_FILE)
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: dict | None = None  # the stale lease this run replaced: whose, and why it was stale

    def _content(self, started: float) -> str:
        return json.dumps({"token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                           "pid_started": _started_ticks(os.getpid()), "started": started, "heartbeat": time.time()})

    def acquire(self) -> "Lease":
        held = _read(self.path) if exists(self.path) else None
        reason = stale_reason(held) if held else None
        if held and reason is None:
            raise LeaseHeld(f"{self.folder} is being written by another {describe(held)}: wait for it to "
                            f"finish, or remove {self.path} if that run is gone")
        if held:
            self.took_over = {**{k: held.get(k) for k in ("token", "host", "pid", "started", "heartbeat")},
                              "reason": reason}
        started = time.time()
        if is_local(self.path):
            if held is not None or os.path.exists(self.path):
                os.remove(self.path)  # stale: its run is gone
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise LeaseHeld(f"{self.folder}: another run took the lease at the same moment") from None
            with os.fdopen(fd, "w") as fh:
                fh.write(self._content(started))
        else:
            _write(self.path, self._content(started))
            time.sleep(0.5)  # a run that wrote at the same moment has overwritten it by now
            if (_read(self.path) or {}).get("token") != self.token:
                raise LeaseHeld(f"{self.folder}: another run took the lease at the same moment")
        self._started = started
        _HELD.add(self.token)
        self._thread = threading.Thread(target=self._heartbeat, name="specrag-lease", daemon=True)
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if (_read(self.path) or {}).get("token") != self.token:
                return  # taken over: the shard checks stop this run
            try:
                _write(self.path, self._content(self._started))
            except Exception:  # a missed beat is not a failure
                pass

    def release(self) -> None:
        self._stop.set()
        _HELD.discard(self.token)  # given back, even where the file cannot be removed yet
        if (_read(self.path) or {}).get("token") == self.token:
            delete([self.path])

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, kind, error, tb) -> None:
        if kind is None:
            self.release()
            return
        try:  # the run already failed: that failure is what the user must read, not this one
            self.release()
        except Exception as e:  # the store that failed the run may fail this delete too
            error.add_note(f"(the lease {self.path} could not be released either: {type(e).__name__}: {e}; "
                           "it goes stale once this process exits)")


def check(folder: str, token: str) -> None:
    """Before a shard commit: the folder's lease is still this run's (an unreadable lease is read
    again for a moment: a store may be replacing it)."""
    for wait in (0.0, 0.2, 0.5, 1.0):
        time.sleep(wait)
        held = _read(join(folder, LEASE_FILE))
        if held:
            break
    if not held or held.get("token") != token:
        raise LeaseHeld(f"{folder}: this run's lease was taken over by "
                        f"{describe(held) if held else 'nobody (the lease file is gone)'}; it stops writing")

"""One launcher for the engine servers specrag starts: vLLM's OpenAI server and tritonserver.

An engine server is a process group of its own (vLLM's front end forks an engine core and its
workers, tritonserver a stub per model instance): started in a new session on 127.0.0.1 with its
output in a log file, ready when its own health probe answers, failed with the log's tail when it
exits first or never answers, and stopped as a group — SIGTERM so it finishes what it serves,
SIGKILL for whatever of the group is left. Its children outlive a leader killed alone (four
orphaned vLLM engine cores of 2.5 GB each once made the OOM killer take a test's server), so
``stop`` and ``exited`` always end the whole group.

Standard library only: ``deploy/triton/launch.py`` drives tritonserver from any Python and loads
this file by its path.

Example usage::

    server = ServerProcess("vllm", command, env, log_path, ready=lambda: probe(url), error=VllmStartError)
    with server.start(timeout_s=900):
        ...  # requests; server.exited() says whether it died meanwhile
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A port nobody listens on now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # in the child, before exec: a server never outlives its launcher
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """A server's process group: start, readiness wait, log tail, exit code, stop.

    ``ready`` is the server's own health probe (True once it serves); ``error`` the exception type
    a failed start raises, its message naming the server, the log and the log's last lines;
    ``die_with_parent`` ends the server with the process that started it (a worker's server)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path,
                 ready: Callable[[], bool], error: type[Exception] = RuntimeError, die_with_parent: bool = False):
        self.name, self.command, self.env, self.log_path = name, list(command), dict(env), Path(log_path)
        self.ready, self.error, self.die_with_parent = ready, error, die_with_parent
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Lock()  # rows that find the server dead stop it from several threads

    def start(self, timeout_s: float) -> "ServerProcess":
        """Start the server and wait until ``ready``; a server that exits first or is not ready in
        ``timeout_s`` is stopped and raises ``error`` with its log's tail."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True,
                                            preexec_fn=_die_with_parent if self.die_with_parent else None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.stop()  # its children, if it forked any before dying
                raise self.error(f"{self.name} exited with code {code} before it was ready; log {self.log_path}:\n"
                                 f"{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise self.error(f"{self.name} not ready after {timeout_s:.0f}s; log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited(self, settle_s: float = 5.0) -> int | None:
        """The server's exit code once it has exited, else None. What is left of its group is
        killed at once (nothing there serves any more: no 20 s of grace for a dead server) and
        given ``settle_s`` to be gone."""
        code = self.process.poll() if self.process else None
        if code is not None and self._signal_group(signal.SIGKILL):
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline and self._signal_group(0):
                time.sleep(0.05)
        return code

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the server's process group (it shuts down what it serves), SIGKILL to whatever
        of the group is left after ``timeout_s``."""
        with self._stopping:
            if self.process is None or not self._signal_group(signal.SIGTERM):
                return
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self._signal_group(0):
                time.sleep(0.2)
            self._signal_group(signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL the whole group at once (what a crash looks like)."""
        if self.process is not None and self._signal_group(signal.SIGKILL):
            self.process.wait()

    def _signal_group(self, sig: int) -> bool:
        """Signal the group (its own session: the group id is the leader's pid); False when no
        process of it is left."""
        try:
            os.killpg(self.process.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""The one launcher of specrag's engine servers (inference/server_process.py), on real processes:
a server that dies at start, one that never answers, one that dies while it serves, and a
stop that ends its whole process group (children included) — the paths vLLM's and Triton's
servers take when they fail."""
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from specrag.inference.server_process import ServerProcess, free_port


class Failed(RuntimeError):
    pass


# a "server": prints, forks a child that sleeps in its group, answers on its port once ready
SERVER = r"""
import os, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
print("starting", mode, flush=True)
if mode == "crash":
    print("fatal: no model", flush=True)
    sys.exit(3)
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print("child", child, flush=True)
if mode == "silent":
    time.sleep(600)
s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen()
while True:
    conn, _ = s.accept(); conn.close()
"""


def _server(tmp_path: Path, mode: str) -> ServerProcess:
    port = free_port()

    def ready() -> bool:
        try:
            socket_ = __import__("socket").create_connection(("127.0.0.1", port), timeout=0.5)
            socket_.close()
            return True
        except OSError:
            return False
    return ServerProcess(f"test server ({mode})", [sys.executable, "-c", SERVER, mode, str(port)], dict(os.environ),
                         tmp_path / f"{mode}.log", ready, Failed)


def _child(server: ServerProcess) -> int:
    return int(next(ln.split()[1] for ln in server.log_path.read_text().splitlines() if ln.startswith("child")))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_server_that_dies_at_start_fails_with_its_code_and_log(tmp_path):
    with pytest.raises(Failed, match=r"test server \(crash\) exited with code 3 before it was ready; log .*"
                                     r"\n(.|\n)*fatal: no model"):
        _server(tmp_path, "crash").start(timeout_s=30)


def test_a_server_that_never_answers_is_stopped_whole_and_fails_with_its_log(tmp_path):
    server = _server(tmp_path, "silent")
    with pytest.raises(Failed, match=r"not ready after 2s; log (.|\n)*starting silent"):
        server.start(timeout_s=2)
    assert server.process.poll() is not None and _gone(_child(server))  # its child went with it


def test_a_server_that_dies_while_serving_says_so_and_leaves_nothing_behind(tmp_path):
    server = _server(tmp_path, "serve").start(timeout_s=30)
    child = _child(server)
    assert server.exited() is None and server.running()
    os.kill(server.process.pid, signal.SIGKILL)  # the leader alone, as a crash or the OOM killer does
    server.process.wait(10)
    started = time.monotonic()
    assert server.exited() == -signal.SIGKILL
    assert time.monotonic() - started < 6 and _gone(child)  # no 20 s of grace for a dead server's children


def test_stop_ends_the_whole_group(tmp_path):
    with _server(tmp_path, "serve").start(timeout_s=30) as server:
        child = _child(server)
    assert server.process.returncode is not None and _gone(child)
    server.stop()  # again: nothing left, nothing raised

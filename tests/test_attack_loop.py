"""The I/O loop against a server that never answers: an interrupted read stops its task.

A "black hole" (a socket that accepts connections and never answers) stands in for a hung
S3 server: obstore's own timeouts and retries keep a call to it running for minutes.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import pytest

from treadle.storage import RangeRequest, Store
from treadle.storage.loop import _Loop, in_flight


class _Interrupt(BaseException):
    """What a signal handler raises in the main thread (as Ctrl-C's KeyboardInterrupt)."""


@pytest.fixture(scope="module")
def black_hole():
    """An ``s3://`` root whose endpoint accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    conns: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    opts = {
        "aws_endpoint": f"http://127.0.0.1:{srv.getsockname()[1]}",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }
    yield "s3://hole/x", opts
    srv.close()
    for c in conns:
        c.close()


def _running() -> int:
    async def count() -> int:
        me = asyncio.current_task()
        return sum(1 for t in asyncio.all_tasks() if t is not me and not t.done())

    return asyncio.run_coroutine_threadsafe(count(), _Loop.get()).result(10)


def test_an_interrupted_read_stops_its_task(black_hole):
    """Ctrl-C (here a SIGALRM handler raising) in a read leaves no task of it running:
    before, its coroutine ran on for minutes (obstore's retries against a hung server,
    then treadle's), holding whatever it had read; its obstore calls still run to their
    end (never cancelled: see loop.request)."""
    root, opts = black_hole
    store = Store.open(root, opts)
    before = _running()

    def interrupt(signum, frame):
        raise _Interrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Interrupt):
            store.get_ranges([RangeRequest(f"o{i}", 0, 10) for i in range(8)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert in_flight() >= 8  # the calls themselves run on (to the server's end)
    deadline = time.monotonic() + 10
    while _running() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running() == before, "the interrupted read's tasks are still running"


_AFTER_EXIT_CHILD = """
import atexit, sys
from treadle.storage import RangeRequest, Store

store = Store.open(sys.argv[1])
store.put("o", b"0123456789")

def late_read():  # registered before the I/O loop's hook, so it runs after it
    try:
        store.get_ranges([RangeRequest("o", 0, 4)])
        print("RESTARTED", flush=True)
    except Exception as e:
        print("REFUSED", type(e).__name__, e, flush=True)

atexit.register(late_read)
store.get_ranges([RangeRequest("o", 0, 4)])  # the loop starts: its exit hook is registered
"""


def test_no_read_restarts_the_io_loop_after_its_exit_hook(tmp_path):
    """A reader that retries every failure (a daemon prefetch loop) used to start a new
    I/O loop once the exit hook had stopped it: requests nobody waits for, during
    interpreter finalisation, where a finishing one kills the process (3 of 24 exits of
    such a child died with SIGSEGV against a server that answers in 0.3 s). A read after
    the hook is now a named StorageError."""
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-c", _AFTER_EXIT_CHILD, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.startswith("REFUSED StorageError"), (got.stdout, got.stderr[-2000:])
    assert "exit" in got.stdout

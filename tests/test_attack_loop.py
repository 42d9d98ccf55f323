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

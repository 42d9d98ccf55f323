"""The prefetch primitive (:mod:`treadle.read.prefetch`) stops its work when its consumer
stops: nothing more is started, and the source is closed before the caller's ``close``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import treadle
from script_helpers import run_script
from treadle import reaper
from treadle.read import prefetch as prefetch_module
from treadle.read.prefetch import ordered_map, prefetch


def test_ordered_map_closed_early_starts_no_more_items():
    """Items queued but not started when the consumer closes the map are never run."""
    go = threading.Event()
    ran: list[int] = []

    def fn(i: int) -> int:
        ran.append(i)
        if i in (1, 2):  # hold both threads, so items 3.. wait in the queue
            go.wait(10)
        return i

    def items():
        try:
            yield from range(100)
        finally:  # closed by the map once it has cancelled what was not started
            go.set()

    gen = ordered_map(fn, items(), threads=2, ahead=8)
    assert next(gen) == 0
    gen.close()  # hands the stop to the reaper (a close may be a finalizer: it never waits)
    assert reaper.drain(30)
    # 1 and 2 may have started (two threads); 3.. were queued behind them: cancelled
    assert 0 in ran and set(ran) <= {0, 1, 2}


def test_prefetch_closed_early_closes_its_source_first():
    """The source generator is closed (on the producer thread) before ``close()`` runs: the
    reader's read-ahead has stopped before the reader itself is closed."""
    events: list[str] = []

    def items():
        try:
            yield from range(100)
        finally:
            events.append(f"source closed on {threading.current_thread().name}")

    gen = prefetch(items(), 2, close=lambda: events.append("close"))
    assert next(gen) == 0
    gen.close()  # hands the stop to the reaper (a close may be a finalizer: it never waits)
    assert reaper.drain(30)
    assert events == ["source closed on treadle-prefetch", "close"]


def test_a_hung_producer_of_a_closed_prefetch_does_not_hold_later_cleanups(monkeypatch, caplog):
    """A prefetch closed early (a finalizer) whose producer hangs in a read (a dead store):
    the reaper gives up on it after :data:`CLOSED_WAIT_S`, with a warning naming the thread,
    skips its ``close()`` (the producer may still use what it closes) and runs the next
    cleanups. Before, it joined the producer with no bound: every later cleanup waited."""
    monkeypatch.setattr(prefetch_module, "CLOSED_WAIT_S", 0.5)
    release, closed = threading.Event(), []

    def items():
        yield 0
        release.wait(120)  # a read hung on a dead store

    gen = prefetch(items(), 1, close=lambda: closed.append(1), name="treadle-prefetch-hung")
    assert next(gen) == 0
    hung = next(t for t in prefetch_module._LIVE if t.name == "treadle-prefetch-hung")
    try:
        with caplog.at_level("WARNING", logger="treadle"):
            gen.close()
            after = threading.Event()
            reaper.reap(after.set)
            assert after.wait(60), "a later cleanup waited for the abandoned prefetch's producer"
        assert "treadle-prefetch-hung" in caplog.text
        assert closed == [], "close() ran under a producer still running"
    finally:
        release.set()
        hung.join(30)
        prefetch_module._LIVE.pop(hung, None)


def test_ordered_map_runs_inline_items_here_in_order():
    """Items ``inline`` picks run on the calling thread; the order of results is kept, and a
    failure of an inline item is raised at its place, after the items before it."""
    here = threading.current_thread().name

    def fn(i: int) -> tuple[int, str]:
        if i == 7:
            raise ValueError("seven")
        return i, threading.current_thread().name

    got = []
    gen = ordered_map(fn, range(10), threads=2, ahead=4, inline=lambda i: i % 2 == 1)
    try:
        for r in gen:
            got.append(r)
    except ValueError as e:
        assert str(e) == "seven"
    assert [i for i, _ in got] == list(range(7))
    assert all((name == here) == (i % 2 == 1) for i, name in got)


def test_a_process_exiting_mid_prefetch_ends_cleanly(tmp_path):
    """The consumer never closes its prefetch and the process exits while the producer is
    inside torch's C++ code: before, the daemon thread was killed on its way back to the
    GIL during finalisation and the process aborted (rc 134, "terminate called without an
    active exception")."""
    text = (
        "import torch\n"
        "from treadle.read.prefetch import prefetch\n"
        "def work():\n"
        "    a = torch.randn(1200, 1200)\n"
        "    while True:\n"
        "        yield float((a @ a).sum())\n"
        "it = prefetch(work(), depth=1000)\n"
        "print(next(it) != 0.0, flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(treadle.__file__).parents[1])}
    for _ in range(2):  # it aborted in 2 of 3 runs before
        r = run_script(tmp_path, text, name="leave.py", env=env, timeout=120)
        assert r.stdout.strip() == "True", r.stderr[-2000:]
        assert "terminate called" not in r.stderr


@pytest.mark.parametrize("leave", [False, True])
def test_ordered_map_waits_for_running_items_on_a_failure_unless_told(leave):
    """A failure is raised after the items still running ended, or at once with
    ``leave_running`` (an importer's read hung on a dead server must not hold it)."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def fn(i: int) -> int:
        if i == 0:
            assert started.wait(30)
            raise ValueError("item 0")
        started.set()
        release.wait(30)
        ended.set()
        return i

    timer = threading.Timer(0.5, release.set)  # unblocks the case that waits for item 1
    if not leave:
        timer.start()
    try:
        with pytest.raises(ValueError, match="item 0"):
            next(ordered_map(fn, range(2), threads=2, leave_running=leave))
        assert ended.is_set() is not leave
    finally:
        release.set()
        timer.cancel()

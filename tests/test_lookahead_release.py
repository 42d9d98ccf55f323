"""The lookahead stage lets the chunks of the steps read go on its own thread, in step order
(treadle.read.lookahead): as the thread ends, and when a release fails there."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from treadle.storage.chunkstore import ChunkStore

CHUNK = 1024


def test_steps_read_as_the_stage_thread_ends_are_released_in_order(tmp_path, monkeypatch):
    """done(0) queues step 0 (the thread has not ended); the thread's finally sets _inline
    and is preempted before its _release_read takes _releasing; done(1) sees _inline and
    releases step 1 at once; the thread then releases step 0: 1 before 0. (A chunk both
    steps read then keeps step 1 in its _uses deque for good: its next use stays stale.)"""
    from treadle.read import lookahead as la

    queued, inline_set, go = threading.Event(), threading.Event(), threading.Event()
    order: list[int] = []
    real_release_read = la.Lookahead._release_read

    def settle(self, seen):  # the thread's last work, under way when done(0) comes
        queued.wait(10)

    def release_read(self):
        if threading.current_thread().name == "treadle-lookahead" and self._inline:
            inline_set.set()  # preempted here: between `_inline = True` and _releasing
            go.wait(10)
        real_release_read(self)

    monkeypatch.setattr(la.Lookahead, "_settle", settle)
    monkeypatch.setattr(la.Lookahead, "_release_read", release_read)
    monkeypatch.setattr(la.Lookahead, "_release", lambda self, step: order.append(step))
    chunks = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    stage = la.Lookahead(SimpleNamespace(read_ahead=0), lambda s: None, [], 2, chunks)
    stage.done(0, 1)  # queued for the thread
    queued.set()
    assert inline_set.wait(10)
    stage.done(1, 1)  # the thread has set _inline: released here, now
    go.set()
    stage._thread.join(10)
    stage.close()
    assert order == [0, 1], order


def test_a_release_that_fails_as_the_thread_ends_still_stops_the_downloads(tmp_path, monkeypatch):
    """The thread's finally releases the steps queued before _downloads.close(): a release
    that raises there (the folder lock's file gone, a disk error) skips close(): rounds not
    started keep their reserved room (FETCHING, never reclaimed while the process lives), the
    download threads never end and _finish waits 60 s for each."""
    from treadle.read import lookahead as la

    queued = threading.Event()

    def settle(self, seen):
        queued.wait(10)

    def release(self, step):
        raise OSError("the chunk folder's lock file is gone")

    monkeypatch.setattr(la.Lookahead, "_settle", settle)
    monkeypatch.setattr(la.Lookahead, "_release", release)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    chunks = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    stage = la.Lookahead(SimpleNamespace(read_ahead=0), lambda s: None, [], 2, chunks)
    stage.done(0, 1)  # queued for the thread
    queued.set()
    stage._thread.join(10)
    assert stage._downloads._stop, "Downloads.close() was skipped"

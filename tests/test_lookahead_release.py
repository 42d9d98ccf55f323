"""The lookahead stage lets the chunks of the steps read go on its own thread, in step order
(treadle.read.lookahead): as the thread ends, and when a release fails there."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

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
    monkeypatch.setattr(la.Lookahead, "_release", lambda self, steps: order.extend(steps))
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

    def release(self, steps):
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


def test_steps_read_while_the_thread_works_are_released_together(tmp_path, monkeypatch):
    """The steps read while the stage's thread was busy are let go in one call (one lock of
    the node's folder for all of them: a lock per step and object was a third of the
    thread's work in issue 48's bench), in step order."""
    from treadle.read import lookahead as la

    queued = threading.Event()
    calls: list[list[int]] = []
    monkeypatch.setattr(la.Lookahead, "_settle", lambda self, seen: queued.wait(10))
    monkeypatch.setattr(la.Lookahead, "_release", lambda self, steps: calls.append(steps))
    chunks = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    stage = la.Lookahead(SimpleNamespace(read_ahead=0), lambda s: None, [], 2, chunks)
    for step in range(3):
        stage.done(step, 1)
    queued.set()
    stage._thread.join(10)
    stage.close()
    assert calls == [[0, 1, 2]], calls


class _Counted:
    """A chunk store's folder lock that counts its acquisitions."""

    def __init__(self, real):
        self.real, self.taken = real, 0

    def __enter__(self):
        self.taken += 1
        return self.real.__enter__()

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)


def test_release_many_takes_the_folder_lock_once_and_equals_releases_one_by_one(tmp_path):
    from treadle.storage import Store

    root = tmp_path / "src"
    store = Store.open(str(root), create=True)
    store.put("a", bytes(range(256)) * 16)
    words = []
    for name, many in (("one", False), ("many", True)):
        cs = ChunkStore(tmp_path / name, 8 * CHUNK, CHUNK)
        obj = cs.object(store, "a", 4096)
        assert cs.fetch(store, obj, [0, 1, 2], [0, 0, 1], now=0) == []
        released = [(obj, [0, 1], 0, [5, 7]), (obj, [2], 1, [9])]
        counted = cs._folder_lock = _Counted(cs._folder_lock)
        if many:
            cs.release_many(released)
        else:
            for r in released:
                cs.release(*r)
        cs._folder_lock = counted.real
        assert counted.taken == (1 if many else 2)
        words.append(np.array(obj.words[:3, :2]))
    assert np.array_equal(words[0], words[1])
    assert words[1][:, 1].tolist() == [5, 7, 9]

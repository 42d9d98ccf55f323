"""Cleanups that may run as finalizers never wait for a lock another thread holds while that
thread waits on I/O (treadle.reaper's rule).

The garbage collector runs a dropped loader's ``finally`` on whichever thread allocates: the
I/O loop thread among them. A ``workers=N`` loader with ``lookahead`` stops its stage there
(:meth:`Lookahead.close` takes the stage's condition). The stage's thread, letting the
chunks of the steps read go, asked the node's next uses (``LOCAL_WORLD_SIZE`` ranks sharing a
cache: :class:`~treadle.plan.nextuse.NodeNextUse`, which reads data-file footers and stream
indexes, through the I/O loop, for steps it has not seen) under that condition: the I/O
loop thread waited for the condition, the stage's thread for the I/O loop.
"""

from __future__ import annotations

import threading
from collections import deque
from types import SimpleNamespace

import numpy as np

from treadle.storage.chunkstore import NEVER, ChunkStore

CHUNK = 1024


def test_closing_the_stage_does_not_wait_for_a_release_that_waits_on_io(tmp_path, monkeypatch):
    from treadle.read import lookahead as la

    served = threading.Event()  # the I/O loop serves reads once its finalizer has returned
    asking = threading.Event()

    class Node:  # the node's next uses: a footer read through the I/O loop
        def next_use(self, key, step):
            asking.set()
            assert served.wait(30), "the I/O loop never served the read"
            return NEVER

    released: list = []
    monkeypatch.setattr(ChunkStore, "release_many", lambda self, r: released.extend(r))
    monkeypatch.setattr(la.Lookahead, "_settle", lambda self, seen: None)
    chunks = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    stage = la.Lookahead(SimpleNamespace(read_ahead=0), lambda s: None, [], 2, chunks,
                         node=lambda keys, horizon: Node())  # fmt: skip
    stage._thread.join(10)
    obj = SimpleNamespace(name="data/a.lance")
    stage._needs[0] = [(None, obj, np.array([3]))]
    stage._uses[("data/a.lance", 3)] = deque([0])

    release = threading.Thread(target=stage._release, args=([0],), name="stage", daemon=True)
    release.start()
    assert asking.wait(10)

    def io_loop() -> None:  # the garbage collector finalizes the dropped loader here
        stage.close()
        served.set()

    io = threading.Thread(target=io_loop, name="io", daemon=True)
    io.start()
    io.join(10)
    stuck = io.is_alive()
    served.set()  # unblock whatever is stuck, so the test ends either way
    io.join(30)
    release.join(30)
    assert not stuck, "Lookahead.close() waited for a release that waited on the I/O loop"
    assert released == [(obj, [3], 0, [NEVER])]
    assert stage._stop

"""The chunk store (treadle.storage.chunkstore) after a process died mid-fetch, or was taken
for dead: its chunks are fetched again by the next process that needs them, and a fetch
taken over is never marked present by the one that lost it."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from chunk_fixtures import CHUNK, make_source
from treadle.storage import Store, chunkfiles, chunkroom
from treadle.storage.chunkstore import FETCHING, NEVER, ChunkStore


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_source(tmp_path_factory)


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The id of a process that ended."""
    p = mp.get_context("spawn").Process(target=os.getpid)
    p.start()
    p.join()
    return p.pid


def test_a_fetch_taken_over_is_not_marked_present_by_the_one_that_lost_it(
    source, tmp_path, monkeypatch
):
    """A fetch whose process is taken for dead (another pid namespace, a container beside
    this one) is evicted and its slot given to another chunk while its bytes are on the way.
    Marking present looked only for "being fetched", so the first fetch, once written, marked
    the second one's chunk present. With slots, its late bytes would also land in the slot
    another chunk now holds: they are written under the folder's lock, only while the words
    still say this fetch, so they never land."""
    root, blob = source
    store = Store.open(root)
    folder = tmp_path / "chunks"
    mine = ChunkStore(folder, CHUNK, CHUNK)
    other = ChunkStore(folder, CHUNK, CHUNK)  # stands in for a process of another namespace
    obj = mine.object(store, "data/o.lance", len(blob))
    theirs = other.object(store, "data/o.lance", len(blob))
    assert mine.reserve([(obj, [0], [5])], now=0) == ([[0]], [[]])
    slot = int(obj.words[0, 3])

    class TakenOverWhileFetching:
        url = store.url

        def get_ranges(self, reqs, copy=True):
            got = store.get_ranges(reqs, copy=copy)
            monkeypatch.setattr(chunkroom, "alive", lambda pids: np.zeros(len(pids), bool))
            assert other.fetch(store, theirs, [1], [NEVER], now=0) == []  # evicts chunk 0
            monkeypatch.undo()
            return got

    mine.download(TakenOverWhileFetching(), [(obj, [0])])
    assert int(theirs.words[1, 3]) == slot  # chunk 1 took chunk 0's slot
    assert mine.read(obj, 0, CHUNK) is None
    assert mine.read(obj, CHUNK, 2 * CHUNK) == blob[CHUNK : 2 * CHUNK]  # not chunk 0's bytes
    assert other.fetch(store, theirs, [0], [3], now=0) == []
    assert mine.read(obj, 0, CHUNK) == blob[:CHUNK]
    assert mine.used() == CHUNK


class _KilledMidFetch:
    """A store whose ranges never come: the process is killed (SIGKILL) while it waits."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get_ranges(self, reqs, copy=True):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _reserve_then_die(root: str, folder: str, size: int) -> None:
    store = Store.open(root)
    cs = ChunkStore(folder, 64 * CHUNK, CHUNK)
    cs.fetch(_KilledMidFetch(store.url), cs.object(store, "data/o.lance", size), [0, 1], [5, 5],
             now=0)  # fmt: skip


def test_a_restart_fetches_what_a_killed_process_was_fetching(source, tmp_path):
    """A process killed mid-fetch leaves its chunks "being fetched" by a dead process. The
    next process counted them as hits and never fetched them (nor read them: never present)
    until the cache ran short of room, so with room to spare every row of them was a Lance
    take for the whole run, counted as a hit. It fetches them now."""
    root, blob = source
    folder = str(tmp_path / "chunks")
    p = mp.get_context("spawn").Process(target=_reserve_then_die, args=(root, folder, len(blob)))
    p.start()
    p.join(60)
    assert p.exitcode == -9
    cs = ChunkStore(folder, 64 * CHUNK, CHUNK)
    store = Store.open(root)
    obj = cs.object(store, "data/o.lance", len(blob))
    assert [int(w) & 3 for w in obj.words[:3, 0]] == [FETCHING, FETCHING, 0]
    assert cs.fetch(store, obj, [0, 1, 2], [9, 9, 9], now=0) == []
    assert cs.read(obj, 0, 3 * CHUNK) == blob[: 3 * CHUNK]
    assert (cs.stats.hits, cs.stats.misses) == (0, 3)
    assert cs.used() == 3 * CHUNK


@pytest.mark.parametrize("recorded", ["process id", "fetcher id"])
def test_a_fetch_left_by_an_earlier_process_with_this_ones_id_is_reclaimed(
    source, tmp_path, recorded
):
    """A container restarted on the same cache folder (a new pid namespace: its processes
    get the same small ids) meets the chunks its killed predecessor was fetching under this
    process's own id. They were taken for this process's own fetches, alive: never fetched,
    never evicted, the cache short of their room for the whole run. A fetcher is its id
    and its start time: they are a dead process's, fetched again and reclaimed."""
    root, blob = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 2 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    assert cs.reserve([(obj, [0, 1], [5, 5])], now=0) == ([[0, 1]], [[]])
    earlier = os.getpid()  # as the process before this one recorded them: its id alone
    if recorded == "fetcher id":  # (a treadle before fetcher ids), or with its start time
        earlier |= (chunkfiles.fetcher_id() >> chunkfiles.PID_BITS) - 1 << chunkfiles.PID_BITS
    obj.words[0:2, 2] = earlier
    assert cs.fetch(store, obj, [2], [3], now=0) == []  # room: their fetches were dead
    assert cs.read(obj, 2 * CHUNK, 3 * CHUNK) == blob[2 * CHUNK : 3 * CHUNK]
    assert cs.fetch(store, obj, [0], [4], now=0) == []  # fetched again, not a hit
    assert cs.read(obj, 0, CHUNK) == blob[:CHUNK]
    assert cs.used() <= cs.max_bytes


def test_a_purge_marks_the_chunk_files_removed_for_processes_that_map_them(
    source, tmp_path, monkeypatch
):
    """``forget_copies`` (a purge) unlinked an object's chunk files without the folder's
    lock or the removed mark: a process that mapped them went on fetching into files no
    scan lists, bytes outside the bound for its life. It marks them removed first, as a
    scan does: the process opens them anew, and what it fetches counts."""
    from treadle.storage.filecache import forget_copies

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    root, blob = source
    store = Store.open(root)
    folder = tmp_path / "objects" / "chunk-slots"
    cs = ChunkStore(folder, 8 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    assert cs.fetch(store, obj, [0], [5], now=0) == []
    forget_copies(store, "data/o.lance", len(blob))
    assert not list(folder.glob("*.state")) and obj.removed()
    assert cs.read(obj, 0, CHUNK) is None
    assert cs.fetch(store, obj, [1], [5], now=0) == []
    other = ChunkStore(folder, 8 * CHUNK, CHUNK)  # another process counts what it holds
    assert other.used() == CHUNK
    assert cs.read(obj, CHUNK, 2 * CHUNK) == blob[CHUNK : 2 * CHUNK]

"""The chunk store's folder (treadle.storage.chunkfolder): objects that hold no chunk lose their
files, a scan visits only the objects that hold chunks, and the bound and the bytes stay right
while processes remove and make again objects that others still map."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

import numpy as np
import pytest

from treadle.storage import Store
from treadle.storage.chunkfolder import REMOVED
from treadle.storage.chunkstore import ABSENT, NEVER, ChunkStore
from treadle.storage.filecache import _locked

CHUNK = 1024
OBJECTS = 24
CHUNKS_PER_OBJECT = 2


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A local root with OBJECTS objects of two chunks of random bytes."""
    root = tmp_path_factory.mktemp("src")
    store = Store.open(str(root), create=True)
    rng = np.random.default_rng(0)
    blobs = {}
    for i in range(OBJECTS):
        blob = rng.integers(0, 256, CHUNKS_PER_OBJECT * CHUNK, dtype=np.uint8).tobytes()
        blobs[f"data/o{i:02d}.lance"] = blob
        store.put(f"data/o{i:02d}.lance", blob)
    return str(root), blobs


def _uncounted(cs: ChunkStore) -> int:
    """Chunks present or fetching in this process's mappings of files the folder no longer
    lists (bytes no other process counts: the bound would not hold)."""
    bad = 0
    with _locked(cs.directory / ".lock"):
        for obj in cs._objects.values():
            states = np.asarray(obj.words[:, 0]) & 3
            held = int(np.sum((states != ABSENT) & (states != REMOVED)))
            try:
                listed = os.stat(cs.directory / f"{obj.name}.state").st_ino
            except FileNotFoundError:
                listed = -1
            bad += held * (listed != obj.inode)
    return bad


def _state_files(cs: ChunkStore) -> int:
    return sum(n.endswith(".state") for n in os.listdir(cs.directory))


def test_emptied_objects_lose_their_files_and_scans_visit_only_live_ones(source, tmp_path):
    """Before, every object ever used kept its two files and every scan mapped them all."""
    root, blobs = source
    store = Store.open(root)
    cap = 3
    cs = ChunkStore(tmp_path / "chunks", cap * CHUNK, CHUNK)
    objs = [cs.object(store, k, len(v)) for k, v in sorted(blobs.items())]
    for step, obj in enumerate(objs * 2):  # each object in turn: the earlier ones evicted
        assert cs.fetch(store, obj, [0], [step + 1], now=step) == []
        assert cs.read(obj, 0, CHUNK) == blobs[obj.key][:CHUNK]
        assert cs.used() <= cs.max_bytes and _uncounted(cs) == 0
        assert len(os.listdir(cs.directory)) <= (cap + 1) + 4  # + lock, boot and slot files
    held = sum(any(o.present(c) for c in range(o.count)) for o in objs)
    assert cs._folder.scanned == _state_files(cs) == held <= cap
    assert cs.used() == held * CHUNK


def test_a_stale_mapping_is_reopened_before_it_holds_bytes(source, tmp_path):
    """A process that maps an object another removed makes it again before it reserves
    (before: its chunks went into unlinked files, uncounted by every other process), and a
    reader of the old mapping never takes its bytes; it reads them again once re-fetched."""
    root, blobs = source
    store = Store.open(root)
    a = ChunkStore(tmp_path / "chunks", 2 * CHUNK, CHUNK)  # two stores: two processes
    b = ChunkStore(tmp_path / "chunks", 2 * CHUNK, CHUNK)
    k0, k1 = sorted(blobs)[:2]
    mine = a.object(store, k0, len(blobs[k0]))
    a.fetch(store, mine, [0, 1], [NEVER, NEVER], now=0)
    assert a.read(mine, 0, 2 * CHUNK) == blobs[k0]
    other = b.object(store, k1, len(blobs[k1]))
    assert b.fetch(store, other, [0, 1], [1, 1], now=0) == []  # evicts a's chunks
    assert b.used() == 2 * CHUNK
    assert mine.removed() and not (a.directory / f"{mine.name}.state").exists()
    assert a.read(mine, 0, CHUNK) is None  # the removed files' holes: never read
    b.release(other, [0, 1], 1, [NEVER, NEVER])
    a.fetch(store, mine, [1], [5], now=2)  # re-opened first: counted by b
    assert not mine.removed() and b.used() == 2 * CHUNK and _uncounted(a) == 0
    assert a.read(mine, CHUNK, 2 * CHUNK) == blobs[k0][CHUNK:]
    # a reader whose mapping is stale while another process fetched the object again
    reader = ChunkStore(tmp_path / "chunks", 2 * CHUNK, CHUNK)
    seen = reader.object(store, k1, len(blobs[k1]))
    assert reader.read(seen, CHUNK, 2 * CHUNK) == blobs[k1][CHUNK:]  # b's chunk 1 (0 evicted)
    a.fetch(store, mine, [0], [3], now=3)  # evicts it (needed never)
    assert a.used() == 2 * CHUNK and reader.read(seen, CHUNK, 2 * CHUNK) is None
    assert seen.removed()
    b.fetch(store, other, [1], [4], now=4)  # made again by b
    assert reader.read(seen, CHUNK, 2 * CHUNK) == blobs[k1][CHUNK:]  # re-opened: b's files
    assert reader.read(seen, 0, CHUNK) is None and _uncounted(b) == 0


def test_a_reader_thread_takes_only_the_objects_bytes_while_it_is_removed(source, tmp_path):
    """A thread reads an object over and over while another store evicts it, removes it and
    fetches it again (room for one chunk): each read is the object's bytes or None, and reads
    through the re-opened files succeed."""
    root, blobs = source
    store = Store.open(root)
    k0, k1 = sorted(blobs)[:2]
    a = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)
    b = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)
    mine = a.object(store, k0, len(blobs[k0]))
    theirs = [b.object(store, k, len(blobs[k])) for k in (k0, k1)]
    stop, counts = threading.Event(), {"good": 0, "bad": 0}

    def reader() -> None:
        while not stop.is_set():
            got = a.read(mine, 0, CHUNK)
            if got is not None:
                counts["good" if got == blobs[k0][:CHUNK] else "bad"] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        for step in range(120):  # k0 and k1 in turn: each evicts the other, then removes it
            b.fetch(store, theirs[step % 2], [0], [step], now=step)
            assert b.used() <= b.max_bytes
    finally:
        stop.set()
        t.join()
    assert counts["bad"] == 0 and counts["good"] > 0 and _uncounted(a) == _uncounted(b) == 0


def test_a_removal_cut_short_is_finished(source, tmp_path):
    """A process that died while it removed an object leaves a state file marked removed:
    the next scan removes it (its slots freed), and an open makes the files anew."""
    root, blobs = source
    store = Store.open(root)
    k0, k1 = sorted(blobs)[:2]
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    for k in (k0, k1):
        cs.fetch(store, cs.object(store, k, len(blobs[k])), [0], [NEVER], now=0)
    for obj in cs._objects.values():
        obj.words[:, 0] = REMOVED  # marked, files not yet unlinked
    other = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    assert other.used() == 0 and _state_files(other) == 0
    obj = other.object(store, k0, len(blobs[k0]))
    assert not obj.removed() and other.fetch(store, obj, [1], [1], now=0) == []
    assert other.used() == CHUNK and other.read(obj, CHUNK, 2 * CHUNK) == blobs[k0][CHUNK:]
    # a state file marked removed, opened before any scan: made anew
    obj.words[:, 0] = REMOVED
    third = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    fresh = third.object(store, k0, len(blobs[k0]))
    assert not fresh.removed() and third.used() == 0 and obj.removed()


def _worker(root: str, folder: str, seed: int, blobs: dict[str, bytes], q) -> None:
    store = Store.open(root)
    cs = ChunkStore(folder, 5 * CHUNK, CHUNK)
    objs = [cs.object(store, k, len(v)) for k, v in sorted(blobs.items())]
    rng = np.random.default_rng(seed)
    bad = stale = 0
    for step in range(50):
        obj = objs[int(rng.integers(OBJECTS))]
        stale += obj.removed()
        want = sorted(set(rng.integers(0, obj.count, 2).tolist()))
        cs.fetch(store, obj, want, (step + rng.integers(1, 20, len(want))).tolist(), now=step)
        for c in range(obj.count):
            got = cs.read(obj, c * CHUNK, (c + 1) * CHUNK)
            bad += got is not None and got != blobs[obj.key][c * CHUNK : (c + 1) * CHUNK]
        starts = rng.integers(0, obj.size - 100, 16)  # rows, some over two chunks
        out = np.zeros((16, 100), np.uint8)
        found = obj.copy_rows(starts, out)
        for s, row in zip(starts[found].tolist(), out[found]):
            bad += row.tobytes() != blobs[obj.key][s : s + 100]
        bad += (cs.used() > cs.max_bytes) + _uncounted(cs)
    q.put((bad, stale))


def test_two_processes_remove_and_make_objects_again(source, tmp_path):
    """Two processes share a folder of 24 objects and room for 5 chunks: objects are emptied,
    removed and made again while the other maps them; the bound holds, no chunk is held in
    removed files, every byte read is the object's, and the folder keeps only live files."""
    root, blobs = source
    folder = str(tmp_path / "chunks")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(root, folder, s, blobs, q)) for s in (1, 2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert [bad for bad, _ in results] == [0, 0]
    assert sum(stale for _, stale in results) > 0  # objects were removed under the other
    cs = ChunkStore(folder, 5 * CHUNK, CHUNK)
    assert cs.used() <= cs.max_bytes
    assert _state_files(cs) == cs._folder.scanned <= 5


def _two_objects(tmp_path):
    """A local root with two objects of 4 chunks of random bytes."""
    store = Store.open(str(tmp_path / "two"), create=True)
    rng = np.random.default_rng(0)
    blobs = {}
    for i in range(2):
        blobs[f"data/o{i}.lance"] = rng.integers(0, 256, 4 * CHUNK, dtype=np.uint8).tobytes()
        store.put(f"data/o{i}.lance", blobs[f"data/o{i}.lance"])
    return store, blobs


def test_a_second_process_copies_rows_of_an_object_removed_and_fetched_again(tmp_path):
    """Two stores over one folder = two processes of a node (the loader's stage and a
    worker of workers=N, which never reserves, so never re-opens). Object X's chunk is
    evicted, a scan removes X's files, the stage fetches X again (its reserve re-opens X:
    new files). The worker's mapping of X is the removed one. Before 0b2e33f the worker's
    ChunkedColumn.read went through ChunkStore.read, which re-opens and finds the row;
    copy_rows never re-opens: every row of X is a miss (a Lance take) for the rest of the
    run, in that process (copy_rows now re-opens it, as ChunkStore.read does)."""
    store, blobs = _two_objects(tmp_path)
    folder = tmp_path / "chunks"
    stage = ChunkStore(folder, 2 * CHUNK, CHUNK)
    worker = ChunkStore(folder, 2 * CHUNK, CHUNK)
    x, y = (stage.object(store, k, len(v)) for k, v in sorted(blobs.items()))
    assert stage.fetch(store, x, [0], [100], now=0) == []
    wx = worker.object(store, x.key, x.size)
    out = np.zeros((1, 10), np.uint8)
    assert wx.copy_rows(np.array([5]), out).tolist() == [True]  # the worker reads X
    assert stage.fetch(store, y, [0, 1], [1, 1], now=0) == []  # X's chunk evicted
    stage.used()  # a scan: X holds no chunk: its files are removed
    assert wx.removed()
    assert stage.fetch(store, x, [0], [5], now=5) == []  # fetched again, new files
    found = [bool(wx.copy_rows(np.array([5]), out)[0]) for _ in range(3)]
    assert found == [True] * 3 and out[0].tobytes() == blobs[x.key][5:15]
    assert not wx.removed() and worker.read(wx, 5, 15) == blobs[x.key][5:15]

"""The chunk folder's slots (treadle.storage.slotfile): an evicted chunk's slot is written over
by the next fetch (no hole punched, no new page), the disk holds no more than the bound counts,
slots no words name are freed, and rows read across chunks in any slots are the object's."""

from __future__ import annotations

import os

import numpy as np
import pytest

from treadle.storage import Store, chunkfiles, chunkroom, slotfile
from treadle.storage.chunkstore import FETCHING, NEVER, ChunkStore
from treadle.storage.fileio import range_lock, range_unlock
from treadle.storage.folderlock import folder_lock

CHUNK = 4096  # a page: the disk's blocks count whole slots
OBJECTS = 6


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A local root with OBJECTS objects of 8 chunks of random non-zero bytes; the last one
    ends with a short chunk."""
    root = tmp_path_factory.mktemp("src")
    store = Store.open(str(root), create=True)
    rng = np.random.default_rng(0)
    blobs = {}
    for i in range(OBJECTS):
        size = 8 * CHUNK - (1000 if i == OBJECTS - 1 else 0)
        blobs[f"data/o{i}.lance"] = rng.integers(1, 256, size, dtype=np.uint8).tobytes()
        store.put(f"data/o{i}.lance", blobs[f"data/o{i}.lance"])
    return store, blobs


def _objects(cs: ChunkStore, store: Store, blobs: dict[str, bytes]):
    return [cs.object(store, k, len(v)) for k, v in sorted(blobs.items())]


def _disk(folder) -> int:
    """Bytes the folder's slot files hold on disk, but the block of each region's mark."""
    return sum(slot_bytes_on_disk(p) for p in folder.glob("slots_*.data"))


def slot_bytes_on_disk(path) -> int:
    """Bytes the slot file ``path`` holds on disk, less a block per region's mark."""
    chunk = int(path.name[6:-5])
    marks = slotfile._mark_slots(0, os.stat(path).st_size // chunk)
    return os.stat(path).st_blocks * 512 - 4096 * len(marks)


def test_an_evicted_chunk_s_slot_is_written_over_without_a_hole(source, tmp_path, monkeypatch):
    """Room made by eviction is the evicted chunk's slot: the next chunk is written into it
    (pages the page cache holds), and no hole is punched. Before, every eviction punched the
    chunk's bytes out of its object's file and the next fetch wrote into new pages, about 2.5
    times the cost of the copy (issue 48)."""
    store, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    objs = _objects(cs, store, blobs)
    assert cs.fetch(store, objs[0], [0, 1, 2, 3], [1, 2, 3, 4], now=0) == []
    slots = objs[0].words[:4, 3].tolist()
    punched = []
    monkeypatch.setattr(slotfile, "punch", lambda fd, at, n: punched.append((at, n)))
    assert cs.fetch(store, objs[1], [0, 1], [2, 2], now=1) == []  # evicts 3 and 2 (farthest)
    assert sorted(objs[1].words[:2, 3].tolist()) == sorted(slots[2:]) and punched == []
    assert cs.read(objs[1], 0, 2 * CHUNK) == blobs[objs[1].key][: 2 * CHUNK]
    assert cs.read(objs[0], 0, 2 * CHUNK) == blobs[objs[0].key][: 2 * CHUNK]
    assert _disk(cs.directory) <= cs.max_bytes


def test_the_disk_holds_no_more_than_the_bound(source, tmp_path):
    """Random fetches of six objects (one with a short last chunk) by stores of two chunk
    sizes sharing a bound: the bound holds, the slot files hold no more bytes on disk than
    it, every free slot holds none, and every chunk read is the object's."""
    store, blobs = source
    bound = 8 * CHUNK
    small = ChunkStore(tmp_path / "chunks", bound, CHUNK)
    large = ChunkStore(tmp_path / "chunks", bound, 2 * CHUNK)
    rng = np.random.default_rng(1)
    for step in range(150):
        cs = small if step % 3 else large
        obj = _objects(cs, store, blobs)[int(rng.integers(OBJECTS))]
        want = sorted(set(rng.integers(0, obj.count, 3).tolist()))
        cs.fetch(store, obj, want, (step + rng.integers(1, 30, len(want))).tolist(), now=step)
        for c in want:
            got = cs.read(obj, c * cs.chunk_bytes, min(obj.size, (c + 1) * cs.chunk_bytes))
            assert (
                got is None or got == blobs[obj.key][c * cs.chunk_bytes : (c + 1) * cs.chunk_bytes]
            )
        assert cs.used() <= bound and _disk(cs.directory) <= bound
    with folder_lock(small.directory):
        for slots in (small._slots, large._slots):
            table = slots.refresh()
            assert not np.any((table[:, 0] == 0) & (table[:, 1] != 0))  # free slots: empty


def test_slots_freed_for_another_chunk_size_are_punched(source, tmp_path):
    """A store of 2-chunk slots makes room by evicting 1-chunk ones: their slots cannot take
    its chunks, so they are punched at the end of its reservation (the disk is not left
    holding both)."""
    store, blobs = source
    small = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    large = ChunkStore(tmp_path / "chunks", 4 * CHUNK, 2 * CHUNK)
    a = _objects(small, store, blobs)[0]
    assert small.fetch(store, a, [0, 1, 2, 3], [9, 9, 9, 9], now=0) == []
    b = _objects(large, store, blobs)[1]
    assert large.fetch(store, b, [0], [1], now=0) == []  # two of a's chunks evicted
    assert large.read(b, 0, 2 * CHUNK) == blobs[b.key][: 2 * CHUNK]
    assert small.used() == 4 * CHUNK and _disk(small.directory) <= 4 * CHUNK


def test_a_slot_no_words_name_is_freed_by_the_next_scan(source, tmp_path):
    """A process killed between taking a slot and writing the chunk's words leaves the slot
    held in the table: the next scan frees it (else the slot file grows past the bound)."""
    store, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    with folder_lock(cs.directory):
        lost = cs._slots.take()
    assert cs.used() == 0  # a scan
    with folder_lock(cs.directory):
        assert cs._slots.refresh()[lost, 0] == 0
    obj = _objects(cs, store, blobs)[0]
    assert cs.fetch(store, obj, [0], [1], now=0) == [] and int(obj.words[0, 3]) == lost


def test_rows_across_chunks_in_scattered_slots(source, tmp_path):
    """Consecutive chunks fetched in reverse next-use order land in slots out of order: a row
    across their boundary is read a piece from each slot, equal to the object's bytes."""
    store, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 3 * CHUNK, CHUNK)
    objs = _objects(cs, store, blobs)
    assert cs.fetch(store, objs[0], [0, 1, 2], [NEVER, NEVER, NEVER], now=0) == []
    assert cs.fetch(store, objs[1], [2], [5], now=1) == []
    assert cs.fetch(store, objs[1], [1], [4], now=1) == []
    assert cs.fetch(store, objs[1], [0], [3], now=1) == []
    slots = objs[1].words[:3, 3].tolist()
    assert slots != sorted(slots)
    starts = np.array([CHUNK - 100, 2 * CHUNK - 1, 10, CHUNK - 50])
    out = np.zeros((4, 300), np.uint8)
    assert objs[1].copy_rows(starts, out).tolist() == [True] * 4
    blob = blobs[objs[1].key]
    assert [row.tobytes() for row in out] == [blob[s : s + 300] for s in starts.tolist()]
    assert cs.read(objs[1], 100, 3 * CHUNK - 7) == blob[100 : 3 * CHUNK - 7]


def test_the_slot_table_grows_under_another_store(source, tmp_path, monkeypatch):
    """One store fetches past the table's first slots while another store of the folder
    (another process) holds its mapping: the other maps it anew and reads every chunk."""
    monkeypatch.setattr(slotfile, "_MIN_SLOTS", 4)
    store, blobs = source
    bound = OBJECTS * 8 * CHUNK
    a = ChunkStore(tmp_path / "chunks", bound, CHUNK)
    b = ChunkStore(tmp_path / "chunks", bound, CHUNK)
    first = _objects(b, store, blobs)[0]
    assert b.fetch(store, first, [0], [NEVER], now=0) == []
    for obj in _objects(a, store, blobs):
        assert a.fetch(store, obj, list(range(obj.count)), [NEVER] * obj.count, now=0) == []
    with folder_lock(a.directory):
        assert len(b._slots.refresh()) >= OBJECTS * 8
    for obj in _objects(b, store, blobs):
        assert b.read(obj, 0, obj.size) == blobs[obj.key]
    assert b.used() == bound - 1000


def test_a_fetch_whose_writer_holds_its_slot_is_not_taken_for_dead(source, tmp_path, monkeypatch):
    """A fetcher in another pid namespace looks dead to this one. While it writes its slot
    (the slot's lock held) its chunk is neither evicted nor reclaimed, so its bytes never
    land in a slot another chunk took; once it lets go, its fetch is reclaimed."""
    store, blobs = source
    mine = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)
    other = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)  # another namespace's process
    key = sorted(blobs)[0]
    obj, theirs = (
        mine.object(store, key, len(blobs[key])),
        other.object(store, key, len(blobs[key])),
    )
    assert mine.reserve([(obj, [0], [5])], now=0) == ([[0]], [[]])
    slot = int(obj.words[0, 3])
    dead = lambda pids: np.zeros(len(pids), bool)  # noqa: E731
    monkeypatch.setattr(chunkroom, "alive", dead)
    monkeypatch.setattr(chunkfiles, "alive", dead)
    range_lock(mine._slots.fd, slot * CHUNK, CHUNK)  # its writer is writing
    try:
        assert other.fetch(store, theirs, [1], [NEVER], now=0) == [1]  # no room made
        assert other.reserve([(theirs, [0], [3])], now=0) == ([[]], [[]])  # a hit, as it is
        assert int(obj.words[0, 0]) & 3 == FETCHING and int(obj.words[0, 3]) == slot
    finally:
        range_unlock(mine._slots.fd, slot * CHUNK, CHUNK)
    assert other.fetch(store, theirs, [1], [NEVER], now=0) == []  # reclaimed now
    assert other.read(theirs, CHUNK, 2 * CHUNK) == blobs[key][CHUNK : 2 * CHUNK]

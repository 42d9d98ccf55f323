"""The chunk store (treadle.storage.chunkstore): fixed-size chunks of immutable objects, shared
by the processes of a node, bounded, evicted by next use (Belady's optimum)."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from treadle.plan.simcache import _next_uses, belady, lru
from treadle.storage import Store
from treadle.storage.chunkstore import FETCHING, NEVER, ChunkStore, chunk_store

CHUNK = 1024
OBJECTS = 4
CHUNKS_PER_OBJECT = 12


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A local root with OBJECTS objects of random bytes (the last one not a whole chunk)."""
    root = tmp_path_factory.mktemp("src")
    store = Store.open(str(root), create=True)
    rng = np.random.default_rng(0)
    blobs = {}
    for i in range(OBJECTS):
        size = CHUNKS_PER_OBJECT * CHUNK - (300 if i == OBJECTS - 1 else 0)
        blobs[f"data/o{i}.lance"] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        store.put(f"data/o{i}.lance", blobs[f"data/o{i}.lance"])
    return str(root), blobs


def _objects(cs: ChunkStore, store: Store, blobs: dict[str, bytes]):
    return [cs.object(store, k, len(v)) for k, v in sorted(blobs.items())]


def _check_bytes(cs: ChunkStore, objs, blobs) -> int:
    """Every present chunk reads back as the object's bytes; returns how many were present."""
    seen = 0
    for obj in objs:
        want = blobs[obj.key]
        for c in range(obj.count):
            a, b = c * CHUNK, min(obj.size, (c + 1) * CHUNK)
            got = cs.read(obj, a, b)
            if got is not None:
                assert got == want[a:b], (obj.key, c)
                seen += 1
    return seen


def test_bound_and_bytes(source, tmp_path):
    root, blobs = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 10 * CHUNK, CHUNK)
    objs = _objects(cs, store, blobs)
    rng = np.random.default_rng(1)
    for step in range(40):
        obj = objs[int(rng.integers(OBJECTS))]
        want = sorted(set(rng.integers(0, obj.count, 4).tolist()))
        nexts = (step + 1 + rng.integers(0, 30, len(want))).tolist()
        skipped = cs.fetch(store, obj, want, nexts, now=step, at=step)
        assert cs.used() <= cs.max_bytes
        kept = [c for c in want if c not in skipped]
        for c in kept:  # fetched now and kept: readable, the object's own bytes
            a, b = c * CHUNK, min(obj.size, (c + 1) * CHUNK)
            assert cs.read(obj, a, b) == blobs[obj.key][a:b]
    assert 0 < _check_bytes(cs, objs, blobs) <= 10
    # a range over two chunks: only when both are present
    obj = objs[0]
    cs.fetch(store, obj, [0, 1], [40, 40], now=40)  # needed now: made room for
    assert cs.read(obj, CHUNK - 10, CHUNK + 10) == blobs[obj.key][CHUNK - 10 : CHUNK + 10]
    assert cs.stats.requests <= cs.stats.misses  # consecutive chunks: one range request


def test_eviction_is_beladys_optimum(source, tmp_path):
    """Driven step by step with the plan's next uses, the store hits exactly as often as
    simcache.belady (the simulator's optimum) and more often than LRU."""
    root, blobs = source
    store = Store.open(root)
    full = [k for k, v in sorted(blobs.items()) if len(v) % CHUNK == 0]  # equal-size chunks
    cap = 9
    cs = ChunkStore(tmp_path / "chunks", cap * CHUNK, CHUNK)
    objs = [cs.object(store, k, len(blobs[k])) for k in full]
    rng = np.random.default_rng(7)
    steps = []
    for _ in range(60):  # a skewed reuse pattern: eviction choices matter
        o = rng.integers(0, len(objs), 3)
        c = np.minimum(rng.geometric(0.25, 3) - 1, CHUNKS_PER_OBJECT - 1)
        steps.append(np.unique(o.astype(np.int64) << 8 | c))
    nxt = _next_uses(steps)
    for s, ids in enumerate(steps):
        groups = []
        for o in np.unique(ids >> 8).tolist():
            sel = (ids >> 8) == o
            groups.append((objs[o], (ids[sel] & 255).tolist(), nxt[s][sel].tolist()))
        cs.fetch_many(store, groups, now=s)
        assert cs.used() <= cs.max_bytes
    best = belady(steps, cap)
    assert cs.stats.hits == best.hits
    assert cs.stats.hits + cs.stats.misses == best.accesses
    assert best.hits > lru(steps, cap).hits  # the case tells the policies apart
    _check_bytes(cs, objs, blobs)


def test_copy_rows_reads_what_read_reads_range_by_range(source, tmp_path):
    """Rows copied in one pass (a reader's rows of a chunked column) are found exactly where
    reading their range alone finds them, with the object's bytes: rows over two chunks,
    rows in absent chunks, rows ending at the object's short last chunk."""
    root, blobs = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 6 * CHUNK, CHUNK)
    objs = _objects(cs, store, blobs)
    rng = np.random.default_rng(7)
    seen = set()
    for step in range(30):
        obj = objs[int(rng.integers(OBJECTS))]
        want = sorted(set(rng.integers(0, obj.count, 3).tolist()))
        cs.fetch(store, obj, want, (step + 1 + rng.integers(0, 9, len(want))).tolist(), now=step)
        length = int(rng.choice([1, 100, CHUNK // 2, CHUNK + 7]))
        starts = rng.integers(0, obj.size - length + 1, 40)
        starts[0] = obj.size - length  # the last bytes of the object
        out = np.zeros((len(starts), length), np.uint8)
        found = obj.copy_rows(starts, out)
        for i, s in enumerate(starts.tolist()):
            got = cs.read(obj, s, s + length)
            assert found[i] == (got is not None), (step, s, length)
            if got is not None:
                assert out[i].tobytes() == got == blobs[obj.key][s : s + length]
                seen.add(length > CHUNK - s % CHUNK)
    assert seen == {False, True}  # rows within a chunk and rows over two were both found


def test_copy_rows_trusts_no_row_whose_chunk_was_evicted_while_copied(
    source, tmp_path, monkeypatch
):
    """A chunk evicted (and fetched again) between the state check and the end of the copy:
    the rows over it are not found (their bytes may be a hole's zeros); the others are."""
    from treadle.storage import chunkobject, chunkstore

    root, blobs = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    (obj, *_) = _objects(cs, store, blobs)
    assert cs.fetch(store, obj, [0, 1, 2], [5, 5, 5], now=0) == []
    real, calls = os.preadv, []

    def evict_then_read(fd, buffers, offset):
        if not calls:  # while the first row is copied
            chunkstore._evict(obj, 1)  # as another process making room would
            cs.fetch(store, obj, [1], [5], now=0)  # and fetched again: a new generation
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(chunkobject.os, "preadv", evict_then_read)
    starts = np.array([10, CHUNK + 10, CHUNK - 5, 2 * CHUNK + 10])
    out = np.zeros((4, 20), np.uint8)
    assert obj.copy_rows(starts, out).tolist() == [True, False, False, True]
    for i in (0, 3):
        assert out[i].tobytes() == blobs[obj.key][starts[i] : starts[i] + 20]


def _worker(root: str, folder: str, seed: int, blobs: dict[str, bytes], q) -> None:
    store = Store.open(root)
    cs = ChunkStore(folder, 8 * CHUNK, CHUNK)
    objs = _objects(cs, store, blobs)
    rng = np.random.default_rng(seed)
    bad = 0
    for step in range(60):
        obj = objs[int(rng.integers(OBJECTS))]
        want = sorted(set(rng.integers(0, obj.count, 3).tolist()))
        cs.fetch(store, obj, want, [step + 5] * len(want), now=step)
        for c in want:
            a, b = c * CHUNK, min(obj.size, (c + 1) * CHUNK)
            got = cs.read(obj, a, b)
            bad += got is not None and got != blobs[obj.key][a:b]
        bad += cs.used() > cs.max_bytes
    q.put(bad)


def test_two_processes_share_one_folder(source, tmp_path):
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
    assert results == [0, 0]
    cs = ChunkStore(folder, 8 * CHUNK, CHUNK)
    assert cs.used() <= cs.max_bytes  # maps the other processes' objects first (no key)
    objs = _objects(cs, Store.open(root), blobs)
    assert _check_bytes(cs, objs, blobs) > 0
    obj = objs[0]
    for c in range(obj.count):  # and fetches through them
        cs.fetch(Store.open(root), obj, [c], [0], now=0, at=0)
        a, b = c * CHUNK, (c + 1) * CHUNK
        assert cs.read(obj, a, b) == blobs[obj.key][a:b]
        cs.release(obj, [c], 0, [NEVER])  # read: evictable again


class _Failing:
    url = "failing://"

    def get_ranges(self, reqs, copy=True):
        raise OSError("link down")


def test_failed_fetch_leaves_nothing_and_dead_fetch_is_reclaimed(source, tmp_path):
    root, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 2 * CHUNK, CHUNK)
    key = sorted(blobs)[0]
    obj = cs.object(Store.open(root), key, len(blobs[key]))
    with pytest.raises(OSError, match="link down"):
        cs.fetch(_Failing(), obj, [0, 1], [1, 1], now=0)
    assert cs.read(obj, 0, CHUNK) is None  # never a partial chunk
    assert cs.used() == 0
    assert not (cs.directory / f"{obj.name}.state").exists()  # holds nothing: removed
    # a fetch whose process died holds room until someone needs it
    dead = mp.get_context("spawn").Process(target=os.getpid)
    dead.start()
    dead.join()
    assert cs.reserve([(obj, [0, 1], [5, 5])], now=0) == ([[0, 1]], [[]])  # made anew
    obj.words[0, :3] = [FETCHING, 5, dead.pid]
    obj.words[1, :3] = [FETCHING, 5, dead.pid]
    assert cs.used() == 2 * CHUNK
    assert cs.fetch(Store.open(root), obj, [2], [3], now=0) == []
    assert cs.read(obj, 2 * CHUNK, 3 * CHUNK) == blobs[key][2 * CHUNK : 3 * CHUNK]
    assert cs.used() <= cs.max_bytes
    # a chunk no step will need again (NEVER) still reclaims a dead fetch's room (one room
    # scan per reservation took candidates only while needed later than the miss)
    obj.words[1, :3] = [FETCHING, 5, dead.pid]
    assert cs.fetch(Store.open(root), obj, [3], [NEVER], now=0) == []
    assert cs.read(obj, 3 * CHUNK, 4 * CHUNK) == blobs[key][3 * CHUNK : 4 * CHUNK]
    assert not obj.present(1) and cs.used() <= cs.max_bytes


def test_chunk_store_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "0")
    assert "off" in chunk_store()
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "64M")
    cs = chunk_store()
    assert isinstance(cs, ChunkStore)
    assert cs.max_bytes == 64 << 20 and cs.directory == tmp_path / "objects" / "chunk-slots"


def test_a_chunk_cache_bound_under_one_chunk_is_off_and_names_both_settings(tmp_path, monkeypatch):
    """A bound that cannot hold one chunk fetched nothing, yet the ``chunk cache`` fast path
    said on (``TREADLE_CACHE_BYTES=1K`` with lookahead: every row a Lance take, silently)."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "10K")
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "1M")
    why = chunk_store()
    assert why == (
        "the chunk cache's bound (10,240 bytes, TREADLE_CHUNK_CACHE_BYTES) is less than one "
        "chunk (1,048,576 bytes, TREADLE_CHUNK_BYTES)"
    )
    monkeypatch.delenv("TREADLE_CHUNK_BYTES")
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "2K")  # under the least default chunk
    assert chunk_store() == (
        "the chunk cache's bound (2,048 bytes, TREADLE_CHUNK_CACHE_BYTES) is less than one "
        "chunk (4,096 bytes, the least size unset)"
    )
    monkeypatch.delenv("TREADLE_CHUNK_CACHE_BYTES")
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")  # the default bound: the object cache's
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "4K")
    assert "(1,024 bytes, TREADLE_CACHE_BYTES) is less than one chunk (4,096 bytes" in chunk_store()
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "1K")  # one chunk fits: a store
    assert isinstance(chunk_store(), ChunkStore)


def test_a_small_bound_gets_small_chunks_not_a_cache_turned_off(tmp_path, monkeypatch):
    """With 1 MiB chunks by default, a bound under 1 MiB (1/8 of 6.3 MB of video streams:
    issue 48's video rows) turned the chunk cache off: every window a range request, at
    0.14 requests a sample where the goal is 1/16. Without ``$TREADLE_CHUNK_BYTES`` the
    chunks shrink to fit 16 in the bound; a set size is kept (and may still not fit)."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.delenv("TREADLE_CHUNK_BYTES", raising=False)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "792975")
    cs = chunk_store()
    assert isinstance(cs, ChunkStore) and cs.chunk_bytes == 32 << 10
    assert cs.max_bytes // cs.chunk_bytes >= 16
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "64M")  # a bound of 16 MiB or more: 1 MiB
    assert chunk_store().chunk_bytes == 1 << 20


@given(st.integers(min_value=0, max_value=1 << 40))
def test_the_default_chunk_size_fits_sixteen_chunks_or_is_the_least(bound):
    from treadle.storage.chunkfiles import MIN_BARE_CHUNK_BYTES, default_chunk_bytes

    size = default_chunk_bytes(bound)
    assert size & (size - 1) == 0 and MIN_BARE_CHUNK_BYTES <= size <= 1 << 20
    assert bound // size >= 16 or size == MIN_BARE_CHUNK_BYTES
    assert size == 1 << 20 or bound // (2 * size) < 16  # the largest that fits 16


def test_an_unusable_chunk_folder_is_named(tmp_path, monkeypatch):
    """It said "the chunk cache folder is not usable (Is a directory)": neither the folder nor
    the file in the way."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    (tmp_path / "objects" / "chunk-slots" / ".boot").mkdir(parents=True)  # where the mark goes
    why = chunk_store(64 << 20)
    folder = tmp_path / "objects" / "chunk-slots"
    assert why.startswith(f"the chunk cache folder {str(folder)!r} is not usable (")
    assert ".boot" in why


def test_a_chunk_folder_on_a_file_system_machines_share_is_not_used(tmp_path, monkeypatch):
    """The default cache folder is under ``~/.cache``, on NFS where a cluster shares its home
    folders: the chunk cache marks chunks present with their bytes in one machine's page
    cache, unflushed, so another machine read words and bytes written back in no order (and
    its own cached pages of slots other chunks had taken). A folder on such a file system
    turns the chunk cache off, naming it; a local one is used."""
    from treadle.storage import chunkfiles

    objects = tmp_path / "home" / "objects"
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(objects))
    mounts = tmp_path / "mountinfo"
    mounts.write_text(
        "22 27 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"40 22 0:50 / {tmp_path / 'home'} rw,relatime - nfs4 server:/home rw,vers=4.2\n"
    )
    monkeypatch.setattr(chunkfiles, "MOUNTINFO", mounts)
    why = chunk_store(64 << 20)
    assert why == (
        f"the chunk cache folder {str(objects / 'chunk-slots')!r} is on nfs4, which other "
        "machines may share (set TREADLE_CACHE_DIR to a local disk)"
    )
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "local"))
    assert isinstance(chunk_store(64 << 20), ChunkStore)


def test_chunk_settings_that_are_not_sizes_name_themselves(tmp_path, monkeypatch):
    """A wrong ``$TREADLE_CHUNK_BYTES`` or ``$TREADLE_CHUNK_CACHE_BYTES`` is an error naming
    that setting (they said ``TREADLE_CACHE_BYTES``), and chunks of 0 bytes are refused
    (they failed later with a ZeroDivisionError naming nothing)."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match="^TREADLE_CHUNK_CACHE_BYTES='lots' is not a size"):
        chunk_store()
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "64M")
    for raw, why in (
        ("-1", "is negative"),
        ("x", "is not a size"),
        ("0", "must be at least 1 byte"),
    ):
        monkeypatch.setenv("TREADLE_CHUNK_BYTES", raw)
        with pytest.raises(ValueError, match=f"^TREADLE_CHUNK_BYTES='{raw}' {why}"):
            chunk_store()
    assert not (tmp_path / "objects" / "chunk-slots").exists()  # nothing made


def test_a_chunk_size_without_a_unit_under_4k_is_refused(tmp_path, monkeypatch):
    """``TREADLE_CHUNK_BYTES=4`` (meant as ``4M``) made 4-byte chunks, 24 bytes of state each,
    silently: a bare number under 4096 is refused naming the setting and the least; a small
    chunk written with its unit (``256B``, ``1K``) and a bare 4096 are taken."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "64M")
    for raw in ("4", " 16 ", "4095", "1.5"):
        monkeypatch.setenv("TREADLE_CHUNK_BYTES", raw)
        with pytest.raises(ValueError, match=f"^TREADLE_CHUNK_BYTES='{raw}' is .* at least 4096"):
            chunk_store()
    assert not (tmp_path / "objects" / "chunk-slots").exists()  # nothing made
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "4")
    with pytest.raises(ValueError, match="write 4M for MiB, or 4B if 4-byte chunks are meant"):
        chunk_store()
    for raw, want in (("256B", 256), ("1K", 1024), ("4096", 4096), ("4M", 4 << 20)):
        monkeypatch.setenv("TREADLE_CHUNK_BYTES", raw)
        assert chunk_store().chunk_bytes == want


def test_other_processes_objects_are_not_kept_mapped(source, tmp_path, monkeypatch):
    """A store reads the objects other processes fetched to count their chunks (a copy of
    their state words), maps them only to evict chunks, and keeps at most MAX_FOREIGN of
    them open between scans (before, every object
    of the folder stayed mapped, two descriptors each, for the life of every process that
    ever made room). It still evicts their chunks, and adopts one it is asked for."""
    from treadle.storage import chunkstore

    monkeypatch.setattr(chunkstore, "MAX_FOREIGN", 2)
    root, blobs = source
    store = Store.open(root)
    other = ChunkStore(tmp_path / "chunks", 6 * CHUNK, CHUNK)  # stands in for another process
    for obj in _objects(other, store, blobs):
        other.fetch(store, obj, [0], [NEVER], now=0)
    assert other.used() == OBJECTS * CHUNK
    fds = len(os.listdir("/proc/self/fd"))
    cs = ChunkStore(tmp_path / "chunks", 6 * CHUNK, CHUNK)
    assert cs.used() == OBJECTS * CHUNK and not cs._foreign and not cs._objects  # read only
    assert len(os.listdir("/proc/self/fd")) <= fds + 3  # its slot file, slot table and its map
    key = "data/o0.lance"
    mine = cs.object(store, key, len(blobs[key]))
    cs.fetch(store, mine, [1, 2, 3, 4], [5, 5, 5, 5], now=1)  # room made from the others'
    assert cs.used() <= cs.max_bytes and len(cs._foreign) <= 2
    assert _check_bytes(cs, [mine], blobs) >= 4
    assert cs.read(mine, CHUNK, 5 * CHUNK) == blobs[key][CHUNK : 5 * CHUNK]


def test_processes_with_other_chunk_sizes_keep_their_own_files(source, tmp_path):
    """Two stores of one folder with other chunk sizes (``$TREADLE_CHUNK_BYTES`` set apart in
    two processes of a node): each object gets files of its own per chunk size. Before, both
    mapped one state file, the second re-sized it to its chunk count and the first read its
    chunks' words over another layout: bytes of the wrong range, or none."""
    root, blobs = source
    store = Store.open(root)
    small = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)
    large = ChunkStore(tmp_path / "chunks", 1 << 20, 4 * CHUNK)
    key = "data/o0.lance"
    a, b = small.object(store, key, len(blobs[key])), large.object(store, key, len(blobs[key]))
    assert a.name != b.name and (a.count, b.count) == (CHUNKS_PER_OBJECT, CHUNKS_PER_OBJECT // 4)
    small.fetch(store, a, [0, 5], [1, 1], now=0)
    large.fetch(store, b, [1], [1], now=0)
    assert small.read(a, 5 * CHUNK, 6 * CHUNK) == blobs[key][5 * CHUNK : 6 * CHUNK]
    assert small.read(a, 4 * CHUNK, 5 * CHUNK) is None  # its own chunk 4 was never fetched
    assert large.read(b, 4 * CHUNK, 8 * CHUNK) == blobs[key][4 * CHUNK : 8 * CHUNK]
    assert large.read(b, 0, 10) is None
    assert small.used() == large.used() == 2 * CHUNK + 4 * CHUNK  # one bound counts both


def test_a_purge_forgets_the_chunks_of_every_chunk_size(source, tmp_path, monkeypatch):
    """``forget_copies`` (a purge's old data files) removes an object's chunks whatever chunk
    size made them, and no other object's: their state files go and no slot holds their
    bytes."""
    from treadle.storage.filecache import forget_copies

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    root, blobs = source
    store = Store.open(root)
    folder = tmp_path / "objects" / "chunk-slots"
    for size in (CHUNK, 2 * CHUNK):
        cs = ChunkStore(folder, 1 << 20, size)
        for key in ("data/o0.lance", "data/o1.lance"):
            cs.fetch(store, cs.object(store, key, len(blobs[key])), [0], [1], now=0)
    assert len(list(folder.glob("*.state"))) == 4
    forget_copies(store, "data/o0.lance", len(blobs["data/o0.lance"]))
    left = ChunkStore(folder, 1 << 20, CHUNK)
    assert len(list(folder.glob("*.state"))) == 2
    assert left.used() == CHUNK + 2 * CHUNK  # o1's chunk of each size
    slots = b"".join(p.read_bytes() for p in folder.glob("slots_*.data"))
    assert blobs["data/o0.lance"][:CHUNK] not in slots
    assert blobs["data/o1.lance"][: 2 * CHUNK] in slots


def test_a_purge_punches_a_slot_taken_for_another_objects_fetch(source, tmp_path, monkeypatch):
    """A slot freed by an eviction keeps its bytes until the chunk that took it is written:
    a purge in between punches them (the slot is tagged with the object whose bytes it
    holds), and the fetch that took it still lands whole."""
    from treadle.storage.filecache import forget_copies

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    root, blobs = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "objects" / "chunk-slots", CHUNK, CHUNK)
    o0, o1 = (cs.object(store, k, len(blobs[k])) for k in ("data/o0.lance", "data/o1.lance"))
    cs.fetch(store, o0, [0], [9], now=0)
    assert cs.reserve([(o1, [0], [1])], now=0) == ([[0]], [[]])  # o0's chunk evicted
    forget_copies(store, "data/o0.lance", len(blobs["data/o0.lance"]))
    slots = (cs.directory / f"slots_{CHUNK}.data").read_bytes()
    assert blobs["data/o0.lance"][:CHUNK] not in slots
    cs.download(store, [(o1, [0])])
    assert cs.read(o1, 0, CHUNK) == blobs["data/o1.lance"][:CHUNK]


def test_a_reservation_scans_the_folder_once_and_evicts_farthest_first(source, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    """Three misses that each need room: one scan of the folder serves them all (it was a
    listing and a sort of every present chunk per missing chunk), and each evicts what a
    fresh scan would: the chunk needed farthest from now, only if later than the miss."""
    from treadle.storage.chunkfolder import ChunkFolder

    root, blobs = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o0.lance", len(blobs["data/o0.lance"]))
    cs.fetch(store, obj, [0, 1, 2, 3], [10, 20, 30, 40], now=0)  # full: next uses 10..40
    scans = []
    real = ChunkFolder.scan
    monkeypatch.setattr(ChunkFolder, "scan", lambda self: scans.append(1) or real(self))
    reserved, skipped = cs.reserve([(obj, [4, 5, 6], [5, 15, 35])], now=0)
    assert len(scans) == 1
    assert reserved == [[4, 5]] and skipped == [[6]]  # 6 is needed after every kept chunk
    assert [obj.present(c) for c in range(4)] == [True, True, False, False]  # 40, 30 went
    cs.download(store, [(obj, [4, 5])])
    assert (
        cs.used() == 4 * CHUNK
        and cs.read(obj, 4 * CHUNK, 6 * CHUNK) == blobs[obj.key][4 * CHUNK : 6 * CHUNK]
    )


def test_state_files_of_another_layout_are_removed(source, tmp_path):
    """A state file whose name holds no object size, or whose words are laid out for
    another count, was made by an older treadle: no store reads it now, so the next scan
    removes it (a 4 MiB-chunk object met by a 1 MiB store was skipped, forever)."""
    root, blobs = source
    folder = tmp_path / "chunks"
    folder.mkdir()
    (folder / f"{'ab' * 20}_{4 * CHUNK}.state").write_bytes(b"\2" * 24)
    (folder / f"{'cd' * 20}_{len(blobs['data/o0.lance'])}_{CHUNK}.state").write_bytes(b"\2" * 24)
    store = Store.open(root)
    cs = ChunkStore(folder, 8 * CHUNK, CHUNK)
    cs.fetch(store, cs.object(store, "data/o1.lance", len(blobs["data/o1.lance"])), [0], [1], now=0)
    assert cs.used() == CHUNK  # its own chunk only
    assert [p.name for p in folder.glob("*.state")] == [
        f"{cs.object(store, 'data/o1.lance', len(blobs['data/o1.lance'])).name}.state"
    ]


def test_the_chunk_folder_before_slots_is_removed(tmp_path, monkeypatch):
    """The folder of the layout before slots (a sparse data file per object, ``chunks``)
    is emptied when a store of this one opens: its bytes were outside every bound."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    old = tmp_path / "objects" / "chunks"
    old.mkdir(parents=True)
    for name in (f"{'ab' * 20}_{CHUNK}.state", f"{'ab' * 20}_{CHUNK}.data", "keep.txt"):
        (old / name).write_bytes(b"x" * 100)
    assert isinstance(chunk_store(64 << 20), ChunkStore)
    assert sorted(p.name for p in old.iterdir() if not p.name.startswith(".")) == ["keep.txt"]


def test_odd_names_and_torn_state_files_do_not_stop_a_scan(source, tmp_path):
    """A stray name whose tail is a non-ASCII digit, and a state file cut mid-word (a crash
    while it was made), are removed by the scan; before, ``int('²')`` and ``np.frombuffer``
    of 13 bytes raised in every reservation's scan."""
    from treadle.storage.chunkfolder import chunk_of

    assert (chunk_of("ab" * 20 + "_5000_1048576"), chunk_of("ab_²_3"), chunk_of("ab" * 20)) == (
        1 << 20,
        None,
        None,
    )
    root, blobs = source
    folder = tmp_path / "chunks"
    folder.mkdir()
    for name, state in (("cd_5_²", b"\0" * 32), (f"{'ef' * 20}_5000_{CHUNK}", b"\0" * 13)):
        (folder / f"{name}.state").write_bytes(state)
    cs = ChunkStore(folder, 4 * CHUNK, CHUNK)
    store = Store.open(root)
    cs.fetch(store, cs.object(store, "data/o1.lance", len(blobs["data/o1.lance"])), [0], [1], now=0)
    assert cs.used() == CHUNK and len(list(folder.glob("*.state"))) == 1

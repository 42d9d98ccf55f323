"""The chunk folder damaged under live processes (a cache cleared in part by hand, files cut)
and odd objects: a reader gets the object's bytes or nothing, never zeros nor another
chunk's bytes, and the slots that damage leaves held are freed by the next scan."""

from __future__ import annotations

import os

import numpy as np
import pytest

from test_chunk_slots import slot_bytes_on_disk
from treadle.storage import Store
from treadle.storage.chunkstore import ChunkStore
from treadle.storage.folderlock import folder_lock

CHUNK = 4096


@pytest.fixture()
def source(tmp_path):
    """A local root with objects o, p, q of four chunks of random non-zero bytes, and an
    empty object z."""
    store = Store.open(str(tmp_path / "src"), create=True)
    rng = np.random.default_rng(0)
    blobs = {k: rng.integers(1, 256, 4 * CHUNK, dtype=np.uint8).tobytes() for k in "opq"}
    blobs["z"] = b""
    for k, v in blobs.items():
        store.put(k, v)
    return store, blobs


def _check(cs: ChunkStore, store: Store, blobs: dict[str, bytes], key: str) -> int:
    """Read every chunk of ``key`` through ``cs`` (``read`` and ``copy_rows``): each one read
    must be the object's. Returns how many were read."""
    obj, blob, read = cs.object(store, key, len(blobs[key])), blobs[key], 0
    for c in range(obj.count):
        a, b = c * CHUNK, min(len(blob), (c + 1) * CHUNK)
        got = cs.read(obj, a, b)
        assert got is None or got == blob[a:b], (key, c)
        out = np.zeros((1, b - a), np.uint8)
        if obj.copy_rows(np.array([a]), out)[0]:
            assert out[0].tobytes() == blob[a:b], (key, c)
        read += got is not None
    return read


def _data(cs: ChunkStore):
    return cs.directory / f"slots_{CHUNK}.data"


@pytest.mark.parametrize("cut", [0, CHUNK + 100])
def test_a_slot_file_cut_and_regrown_by_another_process_serves_no_zeros(source, tmp_path, cut):
    """The slot file cut (``truncate``) under a process whose chunks are present, then
    regrown by another process's fetch (reserved before the cut, or after a scan that saw
    a file long enough): the first process read the cut slots' zeros as its chunks' bytes.
    Now every read is the object's or none, and the next scan forgets the folder's chunks
    of that size (fetched again)."""
    store, blobs = source
    a = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)
    b = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)  # another process's files
    o = a.object(store, "o", 4 * CHUNK)
    assert a.fetch(store, o, [0, 1], [5, 5], now=0) == []
    q = b.object(store, "q", 4 * CHUNK)
    assert b.reserve([(q, [0, 1, 2], [5] * 3)], now=0)[0] == [[0, 1, 2]]
    os.truncate(_data(a), cut)
    b.download(store, [(q, [0, 1, 2])])  # the file is regrown past o's slots
    assert os.stat(_data(a)).st_size >= 5 * CHUNK
    for cs in (a, b):
        for key in "oq":
            _check(cs, store, blobs, key)
    assert a.used() == 0  # a scan: the chunks of the cut file are forgotten
    assert a.fetch(store, o, [0, 1, 2, 3], [5] * 4, now=0) == []
    assert _check(a, store, blobs, "o") == 4 and _check(b, store, blobs, "o") == 4
    for cs in (a, b):
        _check(cs, store, blobs, "q")


def test_state_files_deleted_under_a_process_serve_no_other_chunk(source, tmp_path):
    """Only the ``*.state`` files deleted (a cache cleared in part by hand) while a process
    maps them: the next scan (of any process) freed the slots their words named, and
    another process's fetches were written into them, while the first process still read
    its chunks through the deleted words: another object's bytes. Now it reads only its
    objects' bytes, and fetches them again into state files the folder lists."""
    store, blobs = source
    a = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    b = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)  # another process's mappings
    o = a.object(store, "o", 4 * CHUNK)
    assert a.fetch(store, o, [0, 1, 2, 3], [5] * 4, now=0) == []
    for f in a.directory.glob("*.state"):
        os.unlink(f)
    q = b.object(store, "q", 4 * CHUNK)
    assert b.fetch(store, q, [0, 1, 2, 3], [5] * 4, now=0) == []  # into o's slots
    assert _check(b, store, blobs, "q") == 4
    assert _check(a, store, blobs, "o") == 0
    assert a.fetch(store, o, [0, 1], [1, 1], now=0) == []  # evicts two of q's chunks
    assert _check(a, store, blobs, "o") == 2 and _check(b, store, blobs, "o") == 2
    assert _check(a, store, blobs, "q") == 2 and a.used() == 4 * CHUNK


def test_a_fetch_into_deleted_state_files_writes_no_slot_another_chunk_took(source, tmp_path):
    """A fetch reserved in state words whose file is then deleted: the next scan of another
    process frees its slot and fetches another object's chunk into it. The first fetch's
    bytes then landed over that chunk's (read by the other process as its own). Now a fetch
    writes only while its state file is the folder's."""
    store, blobs = source
    a = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    b = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    o = a.object(store, "o", 4 * CHUNK)
    assert a.reserve([(o, [0, 1], [5, 5])], now=0)[0] == [[0, 1]]
    for f in a.directory.glob("*.state"):
        os.unlink(f)
    q = b.object(store, "q", 4 * CHUNK)
    assert b.fetch(store, q, [0, 1, 2, 3], [5] * 4, now=0) == []  # into o's slots
    a.download(store, [(o, [0, 1])])
    assert _check(b, store, blobs, "q") == 4 and _check(a, store, blobs, "q") == 4
    assert _check(a, store, blobs, "o") == 0


def test_slots_named_only_by_deleted_state_files_are_freed_by_the_next_scan(source, tmp_path):
    """The slots of present and fetching chunks whose state files were deleted are named by
    no listed file: the next scan frees and punches them (the bound counts none of them),
    and the process whose words named them fetches its chunks again within the bound."""
    store, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    o = cs.object(store, "o", 4 * CHUNK)
    assert cs.fetch(store, o, [0, 1], [5, 5], now=0) == []
    assert cs.reserve([(o, [2], [5])], now=0)[0] == [[2]]  # fetching, not yet written
    for f in cs.directory.glob("*.state"):
        os.unlink(f)
    assert cs.used() == 0  # a scan
    with folder_lock(cs.directory):
        table = cs._slots.refresh()
        assert not np.any(table[table[:, 1] != -1])  # every slot free and empty, but marks
    assert slot_bytes_on_disk(_data(cs)) == 0
    cs.download(store, [(o, [2])])
    assert cs.fetch(store, o, [0, 1, 2, 3], [5] * 4, now=0) == []
    assert _check(cs, store, blobs, "o") == 4 and cs.used() == 4 * CHUNK


def test_an_empty_object_reads_as_empty(source, tmp_path):
    """A zero-byte object through the chunk store: its fetch sent a range request of no
    bytes, which the store refused (``StorageError``). It is now present at once, and reads
    as empty."""
    store, _ = source
    cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    z = cs.object(store, "z", 0)
    assert cs.fetch(store, z, [0], [5], now=0) == []
    assert cs.read(z, 0, 0) == b""
    assert cs.stats.requests == 0 and cs.used() == 0
    assert z.copy_rows(np.array([0]), np.zeros((1, 0), np.uint8)).tolist() == [True]


def test_a_slot_table_cut_under_a_fetch_is_no_error_and_serves_no_other_chunk(source, tmp_path):
    """The slot table cut (``truncate``) while a fetch is under way: writing its slot's tag
    raised ``IndexError`` (the round's download lost with an error). Now the fetch is not
    written, no chunk read is another's, and the next scan empties the folder's chunks of
    that size (the table no longer says which slots are held)."""
    store, blobs = source
    a = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)
    b = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)
    o = a.object(store, "o", 4 * CHUNK)
    assert a.fetch(store, o, [0, 1, 2, 3], [5] * 4, now=0) == []
    q = b.object(store, "q", 4 * CHUNK)
    assert b.reserve([(q, [0, 1], [5, 5])], now=0)[0] == [[0, 1]]
    os.truncate(a.directory / f"slots_{CHUNK}.table", 0)
    b.download(store, [(q, [0, 1])])
    p = a.object(store, "p", 4 * CHUNK)
    assert a.fetch(store, p, [0, 1, 2, 3], [5] * 4, now=0) == []  # a scan: forgotten, anew
    for cs in (a, b):
        assert [_check(cs, store, blobs, k) for k in "opq"] == [0, 4, 0]

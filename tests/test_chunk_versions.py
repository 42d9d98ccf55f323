"""The node's chunk cache holds chunks of one version of an object, whichever process (or
run) fetched them: the first fetch records the object's ETag in its state file, and every
later fetch asks for it, so an object replaced by another of its size in between is
:class:`ChangedObject`, never a row (or a batch) of bytes of two objects."""

from __future__ import annotations

import pytest

from treadle.storage import RangeRequest, Store
from treadle.storage.chunkstore import ChunkStore
from treadle.storage.store_errors import ChangedObject

OLD, NEW = bytes(range(256)) * 16, bytes(255 - b for b in range(256)) * 16  # 4 KiB each
CHUNK = 1024


def _process(root, folder) -> tuple[Store, ChunkStore]:
    """A process of the node: its own store (no pins shared) and chunk store, one folder."""
    url, opts = root
    return Store.open(url, opts), ChunkStore(folder, 1 << 20, chunk_bytes=CHUNK)


def test_a_chunk_fetched_by_another_process_pins_the_version(any_root, tmp_path):
    """Before, the second process fetched chunk 1 of the new object beside chunk 0 of the
    old one: a row across them read bytes of both, silently (S3, Azure and local disk)."""
    store_a, a = _process(any_root, tmp_path / "chunks")
    store_a.put("obj", OLD)
    obj_a = a.object(store_a, "obj", len(OLD))
    assert a.fetch(store_a, obj_a, [0], [5], now=0) == []
    store_a.put("obj", NEW)  # replaced, same size
    store_b, b = _process(any_root, tmp_path / "chunks")
    obj_b = b.object(store_b, "obj", len(OLD))
    with pytest.raises(ChangedObject, match=r"obj changed .* chunk cache, .*chunks") as e:
        b.fetch(store_b, obj_b, [1], [5], now=0)
    assert e.value.key == "obj" and e.value.first != e.value.now
    assert b.read(obj_b, 1000, 1100) is None  # no chunk of the new object kept
    assert b.read(obj_b, 0, 100) == OLD[:100]  # the old one's chunks: one version
    store_c, c = _process(any_root, tmp_path / "chunks")  # a later run: still checked
    with pytest.raises(ChangedObject, match="obj"):
        c.fetch(store_c, c.object(store_c, "obj", len(OLD)), [2, 3], [5, 5], now=0)
    with pytest.raises(ChangedObject, match="obj"):  # and its direct reads, pinned to it
        store_b.get_ranges([RangeRequest("obj", 2000, 2100)])
    assert b.used() == CHUNK


class _ReplacedMidFetch:
    """A store whose ranges arrive after the object was replaced and another process
    fetched (and kept) a chunk of the new one: both first fetches, no version recorded."""

    def __init__(self, store, after):
        self.store, self.after = store, after

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get_ranges(self, reqs, copy=True):
        got = self.store.get_ranges(reqs, copy)
        self.after()
        return got


def test_two_first_fetches_of_two_versions_keep_one(s3_root, tmp_path):
    store_a, a = _process(s3_root, tmp_path / "chunks")
    store_a.put("obj", OLD)
    obj_a = a.object(store_a, "obj", len(OLD))
    store_b, b = _process(s3_root, tmp_path / "chunks")
    obj_b = b.object(store_b, "obj", len(OLD))

    def replaced():
        store_b.put("obj", NEW)
        assert b.fetch(store_b, obj_b, [1], [5], now=0) == []

    with pytest.raises(ChangedObject, match=r"obj changed .* chunk cache"):
        a.fetch(_ReplacedMidFetch(store_a, replaced), obj_a, [0], [5], now=0)
    assert a.read(obj_a, 0, CHUNK) is None  # the old object's chunk: not kept
    assert b.read(obj_b, CHUNK, 2 * CHUNK) == NEW[CHUNK : 2 * CHUNK]
    assert b.fetch(store_b, obj_b, [0], [5], now=0) == []
    assert b.read(obj_b, 1000, 1100) == NEW[1000:1100]  # one version


def test_a_store_that_gives_no_etag_is_fetched_unchecked(local_root, tmp_path, no_etags):
    """Nothing to record: chunks are fetched as before, never a false alarm."""
    store_a, a = _process((local_root, None), tmp_path / "chunks")
    store_a.put("obj", OLD)
    obj_a = a.object(store_a, "obj", len(OLD))
    assert a.fetch(store_a, obj_a, [0], [5], now=0) == []
    assert obj_a.etag() is None
    store_a.put("obj", NEW)
    store_b, b = _process((local_root, None), tmp_path / "chunks")
    obj_b = b.object(store_b, "obj", len(OLD))
    assert b.fetch(store_b, obj_b, [1], [5], now=0) == []
    assert b.read(obj_b, CHUNK, 2 * CHUNK) == NEW[CHUNK : 2 * CHUNK]


def test_once_its_chunks_left_the_cache_the_new_version_is_fetched(s3_root, tmp_path):
    """The version lives as long as the object's state file: no chunk held, the next
    process's fetch records the version it sees (no object stays an error for ever)."""
    url, opts = s3_root
    store_a = Store.open(url, opts)
    a = ChunkStore(tmp_path / "chunks", CHUNK, chunk_bytes=CHUNK)  # room for one chunk
    store_a.put("obj", OLD)
    store_a.put("other", NEW)
    assert a.fetch(store_a, a.object(store_a, "obj", len(OLD)), [0], [5], now=0) == []
    store_a.put("obj", NEW)
    assert a.fetch(store_a, a.object(store_a, "other", len(NEW)), [0], [1], now=0) == []
    assert a.used() == CHUNK  # obj's chunk evicted, its state file removed by the scan
    store_b, b = _process(s3_root, tmp_path / "chunks")
    obj_b = b.object(store_b, "obj", len(NEW))
    assert b.fetch(store_b, obj_b, [1], [5], now=0) == []
    assert b.read(obj_b, CHUNK, 2 * CHUNK) == NEW[CHUNK : 2 * CHUNK]
    assert obj_b.etag() == store_b.stat("obj").etag

"""An object replaced by another of the same size between two reads of it (re-uploaded, a
bucket without versioning) is an error naming it, never bytes of two objects: ranged reads,
a copy in parts, the chunk cache's fetches and an importer's reader (on local disk, the S3
server and Azurite: Azure's ETags and ``If-Match`` answers are its own)."""

from __future__ import annotations

import io

import pytest

from treadle.errors import CorruptData
from treadle.importers.sources import Source
from treadle.storage import RangeRequest, Store
from treadle.storage.chunkstore import ChunkStore
from treadle.storage.store_errors import ChangedObject

OLD, NEW = bytes(range(256)) * 16, bytes(255 - b for b in range(256)) * 16  # 4 KiB each


def _store(root) -> Store:
    url, opts = root
    return Store.open(url, opts)


def test_a_replaced_object_between_two_range_reads_raises(any_root):
    """Before, the second read returned the new object's bytes after the old one's: a
    silent mix of two objects."""
    store = _store(any_root)
    store.put("obj", OLD)
    assert store.get_ranges([RangeRequest("obj", 0, 100)]) == [OLD[:100]]
    store.put("obj", NEW)  # same size: no read is cut short
    with pytest.raises(ChangedObject, match=r"object .*/obj changed while it was being read"):
        store.get_ranges([RangeRequest("obj", 1000, 1100)])
    with pytest.raises(CorruptData, match="obj"):  # every later read of it too
        store.get_ranges([RangeRequest("obj", 0, 100), RangeRequest("obj", 3000, 3100)])
    assert _store(any_root).get_ranges([RangeRequest("obj", 0, 4)]) == [NEW[:4]]  # a new store


def test_the_named_version_is_the_one_read(any_root):
    store = _store(any_root)
    store.put("obj", OLD)
    info = store.stat("obj")
    assert info.size == len(OLD) and info.etag
    got = store.get_ranges([RangeRequest("obj", 8, 16, info.etag)], copy=False)
    assert bytes(got[0]) == OLD[8:16]
    store.put("obj", NEW)
    with pytest.raises(ChangedObject) as e:
        store.get_ranges([RangeRequest("obj", 8, 16, info.etag)])
    assert e.value.key == "obj" and e.value.first == info.etag
    assert e.value.now == store.stat("obj").etag != info.etag


def test_coalesced_ranges_come_back_whole_and_in_order(any_root):
    store = _store(any_root)
    store.put("obj", OLD)
    asked = [(4000, 4096), (0, 10), (5, 7), (10, 10), (300, 2000), (100, 4096)]
    got = store.get_ranges([RangeRequest("obj", a, b) for a, b in asked])
    assert got == [OLD[a:b] for a, b in asked]


def test_a_copy_in_parts_is_of_one_version(any_root, tmp_path):
    store = _store(any_root)
    store.put("obj", OLD)
    path = tmp_path / "copy"
    with open(path, "wb+") as f:
        store.download("obj", f.fileno(), len(OLD), 1000, 2)
    assert path.read_bytes() == OLD
    store.put("obj", NEW)
    with open(path, "wb+") as f, pytest.raises(ChangedObject, match="obj"):
        store.download("obj", f.fileno(), len(OLD), 1000, 2)


def test_the_chunk_cache_never_mixes_chunks_of_two_versions(s3_root, tmp_path):
    """One process fetched chunk 0, the object is replaced, then it fetches chunk 1."""
    store = _store(s3_root)
    store.put("obj", OLD)
    chunks = ChunkStore(tmp_path / "chunks", 1 << 20, chunk_bytes=1024)
    obj = chunks.object(store, "obj", len(OLD))
    assert chunks.fetch(store, obj, [0], [5], now=0) == []
    assert chunks.read(obj, 0, 1024) == OLD[:1024]
    store.put("obj", NEW)
    with pytest.raises(ChangedObject, match="obj"):
        chunks.fetch(store, obj, [1], [5], now=0)
    assert chunks.read(obj, 1024, 2048) is None  # nothing of the new object kept


def test_an_imported_file_replaced_mid_read_raises(s3_root):
    url, opts = s3_root
    store = _store(s3_root)
    store.put("src/big.bin", OLD * 8)
    reader = Source(url, opts).open("src/big.bin")
    assert isinstance(reader, io.BufferedReader)
    reader.raw.CHUNK = 4096  # type: ignore[attr-defined]
    assert reader.read(4096) == OLD
    store.put("src/big.bin", NEW * 8)
    with pytest.raises(ChangedObject, match="big.bin"):
        reader.read()


def test_a_store_that_gives_no_etag_is_read_unchecked(local_root, no_etags):
    """Nothing to compare: the reads go through (as before), never a false alarm."""
    store = Store.open(local_root)
    store.put("obj", OLD)
    assert store.get_ranges([RangeRequest("obj", 0, 4)]) == [OLD[:4]]
    store.put("obj", NEW)
    assert store.get_ranges([RangeRequest("obj", 0, 4)]) == [NEW[:4]]


def test_a_range_past_the_end_is_a_short_object(any_root):
    """Cut short (or replaced by a shorter one before any read): named, with its size."""
    from treadle.storage.store_errors import ShortObject

    store = _store(any_root)
    store.put("obj", OLD[:100])
    for start in (50, 150):  # through the end, and wholly past it
        with pytest.raises(ShortObject, match=r"obj is 100 bytes, but a read asked") as e:
            _store(any_root).get_ranges(
                [RangeRequest("obj", 0, 10), RangeRequest("obj", start, 200)]
            )
        assert e.value.size == 100


def test_a_range_that_ends_before_it_starts_is_refused(local_root):
    store = Store.open(local_root)
    store.put("obj", OLD)
    for start, end in ((10, 5), (-1, 5)):
        with pytest.raises(ValueError, match=r"no such range of .*/obj"):
            store.get_ranges([RangeRequest("obj", start, end)])

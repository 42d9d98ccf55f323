"""The caches' files on a disk that fills up or is damaged (treadle.storage.chunkstore,
treadle.storage.filecache): never a hole's zeros served as data, never a process killed by
a full disk."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from treadle.storage import Store
from treadle.storage.chunkstore import ChunkStore
from treadle.storage.filecache import FileCache

CHUNK = 4096


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    store = Store.open(str(root), create=True)
    blob = np.random.default_rng(0).integers(1, 256, 8 * CHUNK, dtype=np.uint8).tobytes()
    store.put("data/o.lance", blob)
    return str(root), blob


@pytest.fixture
def full_disk(monkeypatch):
    """``os.pwrite`` as Linux's on a disk with ``room[0]`` bytes free: a write that does not
    fit writes what does and returns that count (no error); once full, ``ENOSPC``."""
    real, room = os.pwrite, [0]

    def pwrite(fd, data, offset):
        data = memoryview(data).cast("B")
        if len(data) and room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, data[: max(0, min(len(data), room[0]))], offset)
        room[0] -= n
        return n

    monkeypatch.setattr(os, "pwrite", pwrite)
    return room


def test_a_chunk_cut_short_by_a_full_disk_is_never_present(source, tmp_path, full_disk):
    """The disk fills up while a fetch writes its chunks: the write stops mid-range and says
    how much it wrote. That count was ignored: both chunks were marked present, the part not
    written a hole, and readers took its zeros as the object's bytes."""
    root, blob = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    full_disk[0] = CHUNK + CHUNK // 2  # room for one chunk and a half
    with pytest.raises(OSError) as err:
        cs.fetch(store, obj, [0, 1, 2], [5, 5, 5], now=0)
    assert err.value.errno == errno.ENOSPC
    full_disk[0] = 1 << 30  # room again (state words are written in place: no new room)
    for c in range(3):
        assert cs.read(obj, c * CHUNK, (c + 1) * CHUNK) is None  # not present: taken
    assert cs.used() == 0  # their room given back
    assert cs.fetch(store, obj, [0, 1, 2], [5, 5, 5], now=0) == []
    assert cs.read(obj, 0, 3 * CHUNK) == blob[: 3 * CHUNK]


def test_a_copy_cut_short_by_a_full_disk_is_never_kept(source, tmp_path, full_disk):
    """The object cache's download (``Store.download``) ignored the count too: the copy was
    flushed and renamed into place with a hole of zeros where the disk had filled up."""
    root, blob = source
    store = Store.open(root)
    cache = FileCache(tmp_path / "objects", 1 << 20, min_free=0)
    full_disk[0] = len(blob) // 2
    with pytest.raises(OSError) as err:
        cache.open(store, "data/o.lance", len(blob))
    assert "No space left" in str(err.value)
    assert not [p for p in (tmp_path / "objects").iterdir() if not p.name.endswith(".lock")]
    full_disk[0] = 1 << 30
    got = cache.open(store, "data/o.lance", len(blob))
    assert got.path.read_bytes() == blob
    got.close()

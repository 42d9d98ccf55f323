"""The caches' files on a disk that fills up or is damaged (treadle.storage.chunkstore,
treadle.storage.filecache): never a hole's zeros served as data, never a process killed by
a full disk."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from chunk_fixtures import CHUNK, make_source
from treadle.storage import Store
from treadle.storage.chunkstate import ETAG_BYTES
from treadle.storage.chunkstore import ChunkStore
from treadle.storage.filecache import FileCache


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_source(tmp_path_factory)


@pytest.fixture
def full_disk(monkeypatch):
    """``os.pwrite`` as Linux's on a disk with ``room[0]`` bytes free (1 GiB until set): a
    write that does not fit writes what does and returns that count (no error); once full,
    ``ENOSPC``."""
    real, room = os.pwrite, [1 << 30]

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


def _present_then_damaged(source, tmp_path, damage) -> tuple[ChunkStore, object]:
    """A chunk fetched by a process that ended, ``damage(slot file)`` done to the slot file
    that holds its bytes, then the object as a new process's store opens it."""
    root, blob = source
    store = Store.open(root)
    old = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    obj = old.object(store, "data/o.lance", len(blob))
    assert old.fetch(store, obj, [0, 1], [5, 5], now=0) == []
    data = tmp_path / "chunks" / f"slots_{CHUNK}.data"
    obj.close()
    damage(data)
    new = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    new._objects.clear()  # another process: none of this one's mappings
    return new, new.object(store, "data/o.lance", len(blob))


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_a_lost_or_cut_data_file_is_never_read_as_present(source, tmp_path, damage):
    """A chunk's slot file removed or cut (a cleaner of old files, ``truncate``) while its
    state file says present: the next process must not read zeros (or the bytes of other
    chunks written into a new file) as its bytes. The folder is emptied: its chunks are
    absent, fetched again."""
    blob = source[1]

    def cut(path):
        if damage == "removed":
            path.unlink()
        else:
            os.truncate(path, CHUNK // 2)

    cs, obj = _present_then_damaged(source, tmp_path, cut)
    assert cs.read(obj, 0, CHUNK) is None and cs.read(obj, CHUNK, 2 * CHUNK) is None
    assert cs.used() == 0  # nothing counted that is not there
    assert cs.fetch(Store.open(source[0]), obj, [0, 1], [5, 5], now=0) == []
    assert cs.read(obj, 0, 2 * CHUNK) == blob[: 2 * CHUNK]


def test_a_state_file_holds_its_blocks(source, tmp_path):
    """An object's state words are written through a shared mapping: made by ``ftruncate``
    (a hole), the first word written on a full disk killed the process with ``SIGBUS``, no
    message. Its blocks are written when it is made, where a full disk is ``OSError``."""
    root, blob = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    state = os.stat(tmp_path / "chunks" / f"{obj.name}.state")
    assert state.st_size == obj.count * 32 + ETAG_BYTES and state.st_blocks * 512 >= state.st_size


def test_a_full_disk_when_an_object_is_made_is_an_error_and_its_rows_are_taken(
    source, tmp_path, full_disk, monkeypatch
):
    """A data file whose chunk files cannot be made (the disk is full) is read as without
    ``lookahead``: its rows are taken, and the ``chunk cache`` fast path says why."""
    import pyarrow as pa
    from lance.file import LanceFileWriter

    from treadle import fastpaths
    from treadle.read.chunk_rows import ChunkedColumn, DataFile

    monkeypatch.setattr(fastpaths, "_OFF", {})
    root, blob = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    full_disk[0] = 0
    with pytest.raises(OSError) as err:
        cs.object(store, "data/o.lance", len(blob))
    assert err.value.errno == errno.ENOSPC
    t = pa.table({"x": pa.array(np.arange(100, dtype=np.int64))})
    path = tmp_path / "f.lance"
    with LanceFileWriter(str(path), t.schema) as w:
        w.write_batch(t)
    files = [DataFile(0, 100, str(path), "f.lance", path.stat().st_size, 0)]
    col = ChunkedColumn("table 't' column 'x'", files, np.dtype(np.int64), (), store, cs,
                        lambda page, dtype, n: (0, 100))  # fmt: skip
    col.resolve([0])
    assert col._pages[0] is None  # its rows are taken
    why = fastpaths.reasons()["chunk cache"]
    assert "its chunk files could not be made" in why and "No space left" in why


def test_an_object_whose_files_cannot_be_made_again_is_read_another_way(
    source, tmp_path, full_disk
):
    """An object whose files a scan removed (it held no chunk) is made anew when it is next
    released, reserved or read. On a full disk that raised ``OSError`` in the lookahead's
    release of a step read, which ended its thread and failed the loader's next batch. Its
    chunks are now not kept, nor read (taken as without ``lookahead``) until room is back."""
    from treadle.storage.chunkstore import NEVER

    root, blob = source
    store = Store.open(root)
    store.put("data/p.lance", blob[: 2 * CHUNK])
    cs = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)
    x = cs.object(store, "data/o.lance", len(blob))
    y = cs.object(store, "data/p.lance", 2 * CHUNK)
    assert cs.fetch(store, x, [0], [NEVER], now=0) == []
    assert cs.fetch(store, y, [0], [1], now=0) == []  # x's chunk evicted
    assert cs.used() == CHUNK and x.removed()  # that scan removed x's files
    full_disk[0] = 0
    cs.release(x, [0], 1, [5])
    assert cs.reserve([(x, [0, 1], [2, 2])], now=1) == ([[]], [[0, 1]])
    out = np.zeros((1, 10), np.uint8)
    assert x.copy_rows(np.array([0]), out).tolist() == [False]
    assert cs.read(x, 0, 10) is None
    full_disk[0] = 1 << 30  # room again: made anew and fetched
    assert cs.fetch(store, x, [0], [3], now=2) == []
    assert cs.read(x, 0, CHUNK) == blob[:CHUNK] and cs.used() == CHUNK


def test_a_slot_table_that_cannot_grow_keeps_nothing_and_leaves_nothing_fetching(
    source, tmp_path, monkeypatch
):
    """The slot table grows (its blocks written) when every slot is held; on a full disk
    the chunks that needed a new slot are not kept (read another way), and none is left
    "being fetched" by this live process, holding room for the rest of the run."""
    from treadle.storage import slotfile

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    root, blob = source
    store = Store.open(root)
    cs = ChunkStore(tmp_path / "chunks", 8 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    monkeypatch.setattr(slotfile, "write_at", full)  # the table's growth
    assert cs.fetch(store, obj, [0, 1], [5, 5], now=0) == [0, 1]  # not kept
    assert [int(w) & 3 for w in obj.words[:2, 0]] == [0, 0] and cs.used() == 0
    monkeypatch.undo()
    assert cs.fetch(store, obj, [0, 1], [5, 5], now=0) == []
    assert cs.read(obj, 0, 2 * CHUNK) == blob[: 2 * CHUNK]

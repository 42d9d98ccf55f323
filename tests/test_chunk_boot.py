"""The chunk folder's chunks are not flushed to disk where the machine tells its boots apart
(treadle.storage.chunkfiles.same_boot): a folder written in another boot is emptied before
anything reads it, and where there is no boot id every fetch is flushed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from treadle.storage import Store, chunkfiles
from treadle.storage.chunkstore import ChunkStore

CHUNK = 1024


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    store = Store.open(str(root), create=True)
    blob = np.random.default_rng(0).integers(0, 256, 2 * CHUNK, dtype=np.uint8).tobytes()
    store.put("data/o.lance", blob)
    return store, blob


@pytest.fixture
def boot(tmp_path, monkeypatch):
    """This machine's boot id, as a file the test rewrites (a reboot)."""
    path = tmp_path / "boot_id"
    path.write_text("boot-a\n")
    monkeypatch.setattr(chunkfiles, "BOOT_ID", path)
    return path


def test_a_folder_of_another_boot_is_emptied_before_use(source, boot, tmp_path):
    store, blob = source
    old = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    obj = old.object(store, "data/o.lance", len(blob))
    assert old.fetch(store, obj, [0, 1], [1, 1], now=0) == []
    assert old.read(obj, 0, CHUNK) == blob[:CHUNK]
    same = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)  # this boot: kept
    assert same.used() == 2 * CHUNK
    assert same.read(same.object(store, "data/o.lance", len(blob)), 0, CHUNK) == blob[:CHUNK]

    boot.write_text("boot-b\n")  # the machine stopped: states may be on disk without bytes
    new = ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    assert new.used() == 0
    assert not any(p.suffix == ".state" for p in (tmp_path / "chunks").iterdir())
    assert (tmp_path / "chunks" / f"slots_{CHUNK}.data").stat().st_size == 0
    assert (tmp_path / "chunks" / ".boot").read_text().strip() == "boot-b"
    again = new.object(store, "data/o.lance", len(blob))
    assert new.read(again, 0, CHUNK) is None  # absent: fetched again, not trusted
    assert new.fetch(store, again, [0], [1], now=0) == []
    assert new.read(again, 0, CHUNK) == blob[:CHUNK] and new.stats.requests == 1
    # a mapping of the removed files never reads from them (their words say removed)
    assert old.read(obj, CHUNK, 2 * CHUNK) is None


def _flushes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    return calls


def test_fetches_are_flushed_only_where_the_machine_has_no_boot_id(source, boot, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    store, blob = source
    calls = _flushes(monkeypatch)
    cs = ChunkStore(tmp_path / "a", 4 * CHUNK, CHUNK)
    assert cs.fetch(store, cs.object(store, "data/o.lance", len(blob)), [0], [1], now=0) == []
    assert calls == []
    monkeypatch.setattr(chunkfiles, "BOOT_ID", tmp_path / "no-such-file")
    cs = ChunkStore(tmp_path / "b", 4 * CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    assert cs.fetch(store, obj, [0], [1], now=0) == []
    assert len(calls) == 1 and cs.read(obj, 0, CHUNK) == blob[:CHUNK]


def test_a_store_that_must_flush_says_so_once(source, tmp_path, monkeypatch, caplog):
    """Without a boot id the ``unflushed chunks`` fast path is off: one warning per process,
    and ``td.info()`` says why."""
    import logging

    import treadle as td
    from treadle import fastpaths

    monkeypatch.setattr(fastpaths, "_OFF", {})
    monkeypatch.setattr(chunkfiles, "BOOT_ID", tmp_path / "no-such-file")
    caplog.set_level(logging.WARNING, logger="treadle")
    ChunkStore(tmp_path / "a", 4 * CHUNK, CHUNK)
    ChunkStore(tmp_path / "b", 4 * CHUNK, CHUNK)
    offs = [r for r in caplog.records if "unflushed chunks is off" in r.getMessage()]
    assert len(offs) == 1 and "no boot id" in offs[0].getMessage()
    path = td.info().paths["unflushed chunks"]
    assert not path.on and "no boot id" in path.reason


def _forgotten_while_fetching(source, folder):
    """A store of this process with chunk 0 of the object being fetched when another
    process empties the folder (its ``.boot`` gone: deleted, or the folder made by a
    treadle before boots were recorded)."""
    store, blob = source
    cs = ChunkStore(folder, CHUNK, CHUNK)
    obj = cs.object(store, "data/o.lance", len(blob))
    assert cs.reserve([(obj, [0], [5])], now=0, at=0) == ([[0]], [[]])  # chunk 0 fetching
    (folder / ".boot").unlink()
    ChunkStore(folder, CHUNK, CHUNK)  # another process starts: the folder is emptied
    return cs, obj


class _Racing:
    """A store whose ranges arrive after ``after`` ran (another thread of the process
    reserving the next round of the same object while the request is under way)."""

    def __init__(self, store, after):
        self.store, self.after, self.url = store, after, store.url

    def get_ranges(self, reqs, copy=True):
        self.after()
        return self.store.get_ranges(reqs, copy)


def test_a_fetch_cut_by_forget_never_marks_a_hole_present(source, boot, tmp_path):
    """The stage's next round (another thread) maps the object anew while chunk 0's request
    is under way: the new files must not say present over a slot that holds nothing of it
    (zeros, or another chunk's bytes, read as the object's)."""
    store, blob = source
    cs, obj = _forgotten_while_fetching(source, tmp_path / "chunks")
    nxt = lambda: cs.reserve([(obj, [1], [6])], now=0, at=1)  # noqa: E731
    cs.download(_Racing(store, nxt), [(obj, [0])])
    other = ChunkStore(tmp_path / "chunks", CHUNK, CHUNK)
    for s in (cs, other):
        assert s.read(s.object(store, "data/o.lance", len(blob)), 0, CHUNK) in (None, blob[:CHUNK])


def test_a_fetch_cut_by_forget_keeps_the_bound(source, boot, tmp_path):
    """The next round maps the object anew while chunk 0's request is under way: chunk 0,
    reserved in the removed files, must not become present in the new ones beyond the
    bound (one chunk: chunk 1 holds it)."""
    store, _ = source
    cs, obj = _forgotten_while_fetching(source, tmp_path / "chunks")
    nxt = lambda: cs.reserve([(obj, [1], [6])], now=0, at=1)  # noqa: E731
    cs.download(_Racing(store, nxt), [(obj, [0])])
    assert cs.used() <= cs.max_bytes


def test_a_boot_mark_of_other_bytes_is_another_boot(source, boot, tmp_path):
    """A ``.boot`` that is not text (a disk's garbage, a user's file) is not this boot:
    the folder is emptied, and the store is made (not a UnicodeDecodeError)."""
    store, blob = source
    folder = tmp_path / "chunks"
    cs = ChunkStore(folder, 4 * CHUNK, CHUNK)
    assert cs.fetch(store, cs.object(store, "data/o.lance", len(blob)), [0], [1], now=0) == []
    (folder / ".boot").write_bytes(b"\xff\xfe\x80boot-a")
    assert ChunkStore(folder, 4 * CHUNK, CHUNK).used() == 0
    assert (folder / ".boot").read_text().strip() == "boot-a"


def test_a_fetch_reserved_before_forget_keeps_the_bound_in_new_files(source, boot, tmp_path):
    """The next round maps the object anew before chunk 0's download begins: chunk 0's
    bytes go to the new files, where no room was reserved for it: it stays absent."""
    store, blob = source
    cs, obj = _forgotten_while_fetching(source, tmp_path / "chunks")
    assert cs.reserve([(obj, [1], [6])], now=0, at=1) == ([[1]], [[]])
    cs.download(store, [(obj, [0])])
    assert cs.used() <= cs.max_bytes
    assert cs.read(obj, 0, CHUNK) in (None, blob[:CHUNK])


def test_a_new_boot_empties_the_slots_of_every_chunk_size(source, boot, tmp_path):
    """Slots of every chunk size in the folder, and their tables, are emptied when the
    folder was written in another boot (their bytes were on disk outside every bound)."""
    store, blob = source
    for size in (CHUNK, 2 * CHUNK):
        cs = ChunkStore(tmp_path / "chunks", 4 * CHUNK, size)
        assert cs.fetch(store, cs.object(store, "data/o.lance", len(blob)), [0], [1], now=0) == []
    files = [tmp_path / "chunks" / f"slots_{size}.{e}" for size in (CHUNK, 2 * CHUNK)
             for e in ("data", "table")]  # fmt: skip
    assert all(f.stat().st_size > 0 for f in files)
    boot.write_text("boot-b\n")
    ChunkStore(tmp_path / "chunks", 4 * CHUNK, CHUNK)
    assert [f.stat().st_size for f in files] == [0, 0, 0, 0]
    assert not any(p.suffix == ".state" for p in (tmp_path / "chunks").iterdir())

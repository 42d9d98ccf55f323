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
    assert not any(p.suffix in (".data", ".state") for p in (tmp_path / "chunks").iterdir())
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

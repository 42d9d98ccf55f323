"""Attacks on the chunk cache's slots (issue 48): whatever the schedule, a reader gets the
object's bytes at that offset or nothing (never another chunk's, never zeros), the disk
holds what the bound counts, and a purge leaves no byte of the object in any slot."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from treadle.storage import Store
from treadle.storage.chunkstore import ChunkStore

CHUNK = 4096


@pytest.fixture()
def source(tmp_path):
    """A local root with objects o, p, q of four chunks of random non-zero bytes, and r of
    two chunks, the last one short."""
    store = Store.open(str(tmp_path / "src"), create=True)
    rng = np.random.default_rng(0)
    blobs = {k: rng.integers(1, 256, 4 * CHUNK, dtype=np.uint8).tobytes() for k in "opq"}
    blobs["r"] = rng.integers(1, 256, CHUNK + 1000, dtype=np.uint8).tobytes()
    for k, v in blobs.items():
        store.put(k, v)
    return store, blobs


def _check(cs: ChunkStore, store: Store, blobs: dict[str, bytes], key: str) -> int:
    """Read every chunk of ``key`` through ``cs``; each one read must be the object's.
    Returns how many were read."""
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


def test_bytes_past_an_object_s_end_are_not_read_from_its_last_slot(source, tmp_path):
    """A short last chunk's slot is a whole chunk: its tail holds zeros (punched), and the
    slots of other objects follow it in the file. A read reaching past the object's end
    returned those zeros as the object's bytes (its own sparse file, before, ended with the
    object: a short read, None), and one past its last chunk raised IndexError. Now: None,
    and such a row is not copied."""
    store, blobs = source
    cs = ChunkStore(tmp_path / "chunks", 1 << 20, CHUNK)
    r, p = cs.object(store, "r", len(blobs["r"])), cs.object(store, "p", 4 * CHUNK)
    assert cs.fetch(store, r, [0, 1], [5, 5], now=0) == []
    assert cs.fetch(store, p, [0, 1], [5, 5], now=0) == []  # slots after r's
    end = len(blobs["r"])
    assert cs.read(r, end - 10, end) == blobs["r"][-10:]
    assert cs.read(r, end - 10, end + 10) is None
    assert cs.read(r, 2 * CHUNK, 2 * CHUNK + 10) is None
    out = np.full((3, 20), 7, np.uint8)
    assert r.copy_rows(np.array([end - 30, end - 10, 0]), out).tolist() == [True, False, True]
    assert out[0].tobytes() == blobs["r"][-30:-10] and out[2].tobytes() == blobs["r"][:20]


@pytest.mark.parametrize("removed", ["slot files", "folder"])
def test_slot_files_removed_under_a_running_process_serve_no_other_chunk(source, tmp_path,
                                                                          removed):  # fmt: skip
    """The slot files (or the whole folder) removed while a process runs (a cache cleared
    by hand): the process kept writing and reading the files it had open, a process started
    after made new ones, and both marked chunks present in the same state words, each with
    a slot of its own file. A chunk one marked was read by the other from the other file:
    another object's bytes. A process now follows the files at the folder's paths (and lets
    go of the words naming slots of the old ones); every chunk read is the object's."""
    store, blobs = source
    folder = tmp_path / "chunks"
    a = ChunkStore(folder, 1 << 20, CHUNK)  # a store of its own: another process's files
    assert a.fetch(store, a.object(store, "o", 4 * CHUNK), [0, 1], [5, 5], now=0) == []
    if removed == "folder":
        shutil.rmtree(folder)
    else:
        for f in folder.glob("slots_*"):
            os.unlink(f)
    b = ChunkStore(folder, 1 << 20, CHUNK)
    assert b.fetch(store, b.object(store, "q", 4 * CHUNK), [0, 1, 2, 3], [5] * 4, now=0) == []
    assert a.fetch(store, a.object(store, "p", 4 * CHUNK), [0], [5], now=0) == []
    assert b.fetch(store, b.object(store, "o", 4 * CHUNK), [2], [5], now=0) == []
    for cs in (a, b):
        for key in "opq":
            _check(cs, store, blobs, key)
    assert _check(b, store, blobs, "p") == 1 and _check(a, store, blobs, "q") == 4


def _lock_fork_and_die(folder: str, pid_file: str) -> None:
    """Hold slot 0's lock as a fetch writing it does, fork a child that lives on, and die
    (SIGKILL) holding it."""
    import signal

    from treadle.storage.fileio import range_lock

    cs = ChunkStore(folder, 1 << 20, CHUNK)
    range_lock(cs._slots.fd, 0, CHUNK)
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    with open(pid_file, "w") as f:
        f.write(str(child))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_slot_locked_by_a_killed_writer_is_not_held_by_its_forked_child(tmp_path):
    """A slot's lock belongs to the open slot file, which a child forked while a fetch
    wrote shares: the writer's process killed, the child held the slot locked for its
    whole life, and every removal of a chunk fetching into that slot (a purge, a folder of
    another boot) waited for it under the folder's lock, the node's cache with it. A
    forked child now opens the slot files anew."""
    import multiprocessing as mp

    folder, pid_file = tmp_path / "chunks", tmp_path / "child.pid"
    p = mp.get_context("spawn").Process(target=_lock_fork_and_die,
                                        args=(str(folder), str(pid_file)))  # fmt: skip
    p.start()
    deadline = time.monotonic() + 60
    while p.is_alive() and time.monotonic() < deadline:  # join() waits for the child too
        time.sleep(0.05)
    assert p.exitcode == -9
    child = int(pid_file.read_text())
    try:
        cs = ChunkStore(folder, 1 << 20, CHUNK)
        with cs._slots.fenced(0, wait=False) as free:
            assert free
    finally:
        os.kill(child, 9)

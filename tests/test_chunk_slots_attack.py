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


SIZES = (8 * CHUNK, 8 * CHUNK - 1000, 5000, 3 * CHUNK + 1)


def _blobs() -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    return {f"s{i}": rng.integers(1, 256, n, dtype=np.uint8).tobytes() for i, n in enumerate(SIZES)}


def _stress(root: str, folder: str, seed: int, chunk: int, mode: str) -> int:
    """One process of :func:`test_processes_fetching_reading_and_purging_read_only_the_objects_bytes`:
    two threads fetch, read and copy rows of random objects (``mode``: also purge them, or
    take every other process's fetch for dead); the count of wrong bytes read."""
    import threading

    from treadle.storage import chunkfiles, chunkroom
    from treadle.storage.chunkfolder import remove_named
    from treadle.storage.filecache import copy_name
    from treadle.storage.folderlock import folder_lock

    store, blobs, bad = Store.open(root), _blobs(), []
    if mode == "paranoid":  # alive only itself (another pid namespace's view)
        me = chunkfiles.fetcher_id()
        chunkfiles.alive = chunkroom.alive = lambda ids: np.asarray(ids) == me
    cs = ChunkStore(folder, 6 * chunk, chunk)

    def run(rng: np.random.Generator) -> None:
        for step in range(40):
            key = f"s{int(rng.integers(len(SIZES)))}"
            blob = blobs[key]
            if mode == "purge" and rng.random() < 0.2:
                with folder_lock(cs.directory):
                    remove_named(cs.directory, copy_name(store, key, len(blob)))
                continue
            if mode == "vandal" and rng.random() < 0.25:  # by hand, under every process
                _vandal(cs.directory, chunk, rng)
            obj = cs.object(store, key, len(blob))
            want = sorted(set(rng.integers(0, obj.count, 3).tolist()))
            cs.fetch(store, obj, want, (step + rng.integers(1, 30, len(want))).tolist(), step)
            a = int(rng.integers(0, len(blob)))
            b = min(len(blob), a + int(rng.integers(1, 3 * chunk)))
            got = cs.read(obj, a, b)
            bad.append(got is not None and got != blob[a:b])
            n = min(len(blob), int(rng.integers(1, 2 * chunk)))
            starts = rng.integers(0, len(blob) - n + 1, 4)
            out = np.zeros((4, n), np.uint8)
            for i in np.flatnonzero(obj.copy_rows(starts, out)).tolist():
                bad.append(out[i].tobytes() != blob[starts[i] : starts[i] + n])

    threads = [threading.Thread(target=run, args=(np.random.default_rng(seed * 10 + t),))
               for t in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(bad)


def _vandal(folder, chunk: int, rng: np.random.Generator) -> None:
    """Delete a state file, or cut the slot file (``truncate``) to a random length."""
    import contextlib
    from pathlib import Path

    states = sorted(Path(folder).glob("*.state"))
    with contextlib.suppress(FileNotFoundError):
        if states and rng.random() < 0.6:
            os.unlink(states[int(rng.integers(len(states)))])
        else:
            data = Path(folder) / f"slots_{chunk}.data"
            os.truncate(data, int(rng.integers(0, os.stat(data).st_size + 1)))


@pytest.mark.slow  # three processes (~10 s)
@pytest.mark.parametrize("chunk", [CHUNK, 1000])
def test_processes_read_only_the_objects_bytes_while_files_are_cut_and_deleted(tmp_path, chunk):
    """Three processes fetch, read and copy rows as below, one of them deleting state files
    and cutting the slot file at random (a cache cleared in part by hand, ``truncate``):
    every byte read is the object's. Before, zeros of cut slots and other objects' bytes in
    slots freed under deleted state files were read."""
    from concurrent.futures import ProcessPoolExecutor

    store, blobs = Store.open(str(tmp_path / "src"), create=True), _blobs()
    for k, v in blobs.items():
        store.put(k, v)
    folder = str(tmp_path / "chunks")
    ChunkStore(folder, 6 * chunk, chunk)
    import multiprocessing as mp

    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as pool:
        runs = [pool.submit(_stress, store.url, folder, i, chunk, mode)
                for i, mode in enumerate(["plain", "vandal", "paranoid"])]  # fmt: skip
        assert [r.result(timeout=300) for r in runs] == [0, 0, 0]


@pytest.mark.slow  # three processes (~10 s)
@pytest.mark.parametrize("chunk", [CHUNK, 1000])
def test_processes_fetching_reading_and_purging_read_only_the_objects_bytes(tmp_path, chunk):
    """Three processes of two threads fetch, read and copy rows of four objects (short last
    chunks; chunks of a page and of 1000 bytes) under a bound of six chunks, one purging
    them at random, one taking every other process's fetch for dead: every byte read is the
    object's, the bound holds, and once every object is purged no slot holds a byte of any."""
    from concurrent.futures import ProcessPoolExecutor

    from treadle.storage import slotfile
    from treadle.storage.chunkfolder import remove_named
    from treadle.storage.filecache import copy_name
    from treadle.storage.folderlock import folder_lock

    store, blobs = Store.open(str(tmp_path / "src"), create=True), _blobs()
    for k, v in blobs.items():
        store.put(k, v)
    folder = str(tmp_path / "chunks")
    ChunkStore(folder, 6 * chunk, chunk)
    import multiprocessing as mp

    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as pool:
        runs = [pool.submit(_stress, store.url, folder, i, chunk, mode)
                for i, mode in enumerate(["plain", "purge", "paranoid"])]  # fmt: skip
        assert [r.result(timeout=300) for r in runs] == [0, 0, 0]
    cs = ChunkStore(folder, 6 * chunk, chunk)
    assert cs.used() <= cs.max_bytes
    with folder_lock(cs.directory):
        for k, v in blobs.items():
            remove_named(cs.directory, copy_name(store, k, len(v)))
    for path in cs.directory.glob("slots_*.data"):
        data = bytearray(path.read_bytes())
        for m in slotfile._mark_slots(0, len(data) // chunk):  # a region's mark: its own
            data[m * chunk : (m + 1) * chunk] = bytes(chunk)
        assert not any(data), path.name


def test_a_table_grown_is_used_though_a_writer_s_thread_maps_an_older_one(tmp_path):
    """A download thread's write maps the slot table anew where another process grew it,
    with no folder lock: it may read the old size, and assign its mapping after a
    reservation's thread grew the table and mapped it. The reservation then indexed the
    writer's table (the attribute, read again) with the new slot: ``IndexError``, the
    reservation lost. Each call now uses the table it mapped."""
    from treadle.storage import slotfile

    class Raced(slotfile.SlotFile):
        stale: np.ndarray | None = None

        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name == "table" and self.stale is not None and len(value) > len(self.stale):
                super().__setattr__("table", self.stale)  # the writer's thread, just after

    slots = Raced(tmp_path, CHUNK)
    taken = [slots.take() for _ in range(63)]  # slot 63: the region's mark
    slots.stale = slots.table  # 64 slots: what the writer's thread mapped
    assert slots.take() == 64 and sorted(taken) == list(range(63))
    table = np.frombuffer((tmp_path / f"slots_{CHUNK}.table").read_bytes(), np.int64)
    assert int(table[128]) == 1  # slot 64 held


def _killed_in(root: str, folder: str, where: str) -> None:
    """Fetch chunks 0-1 of object o (after chunks 0-3 of q, present) and die (SIGKILL) in
    ``where``: half of chunk 0's bytes written into its slot, or both written and tagged,
    not yet marked present."""
    import signal

    from treadle.storage import chunkstore, slotfile

    store = Store.open(root)
    cs = ChunkStore(folder, 6 * CHUNK, CHUNK)
    cs.fetch(store, cs.object(store, "q", 4 * CHUNK), [0, 1, 2, 3], [9] * 4, now=0)
    real = slotfile.write_at

    def half(fd: int, data: memoryview, at: int) -> None:
        real(fd, memoryview(data)[: len(data) // 2], at)
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "write":
        slotfile.write_at = half
    else:
        chunkstore.mark_present = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
    cs.fetch(store, cs.object(store, "o", 4 * CHUNK), [0, 1], [1, 1], now=0)


@pytest.mark.parametrize("where", ["write", "mark"])
def test_a_process_killed_writing_a_slot_leaves_no_bytes_read_and_its_room(source, tmp_path,
                                                                           where):  # fmt: skip
    """SIGKILL while a fetch's bytes are written into their slot (half of them), or after
    they are but before they are marked present: the next process reads none of them,
    takes their room back (evicting q's chunks, needed later) and reads every chunk as the
    object's; the bound and the disk hold."""
    import multiprocessing as mp

    store, blobs = source
    folder = str(tmp_path / "chunks")
    p = mp.get_context("spawn").Process(target=_killed_in, args=(store.url, folder, where))
    p.start()
    p.join(60)
    assert p.exitcode == -9
    cs = ChunkStore(folder, 6 * CHUNK, CHUNK)
    o = cs.object(store, "o", 4 * CHUNK)
    assert cs.read(o, 0, CHUNK) is None and cs.read(o, CHUNK, 2 * CHUNK) is None
    assert cs.fetch(store, o, [0, 1, 2, 3], [1, 1, 1, 1], now=1) == []
    assert _check(cs, store, blobs, "o") == 4 and _check(cs, store, blobs, "q") == 2
    assert cs.used() <= cs.max_bytes
    from test_chunk_slots import slot_bytes_on_disk

    assert sum(slot_bytes_on_disk(f) for f in cs.directory.glob("slots_*.data")) <= cs.max_bytes

"""treadle never closes, writes or maps a descriptor number it no longer owns, and leaves
none it made open when what it made them for fails.

A number closed is soon another file's (the next ``open``, ``pipe`` or ``socket`` of any
thread takes the lowest free one): a second close, or a write after the close, lands on
that file (a pipe another thread waits on, a server's log, a chunk file). Each test frees
a number the way treadle's code does, lets a fresh file take it, then checks that file.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from descriptors import is_open
from treadle.errors import StorageError
from treadle.storage import folderlock
from treadle.storage.folderlock import FolderLock
from treadle.storage.loop import _Loop
from treadle.storage.slotfile import SlotFile
from treadle.storage.store import Store
from treadle.workers.processes import _Handle
from treadle.workers.slots import Slot


class _GaveUp(BaseException):
    """What a Ctrl-C is to the downloading thread (a signal handler's exception)."""


def test_a_download_given_up_writes_no_part_into_the_file_that_took_its_number(tmp_path):
    # The object cache closes its part file as soon as download() raises (Ctrl-C): a part
    # whose bytes had already arrived still wrote them, through the closed number.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a signal handler's exception needs the main thread")
    store = Store.open(tmp_path / "root", create=True)
    part = 4096
    release = threading.Event()

    async def read(key, end, call, expect=None):  # its bytes arrive as the caller gives up
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        release.wait(30)  # the loop thread is in this part until the caller has moved on
        return None, b"x" * part  # (ETag: none, bytes), as Store._read gives them

    def give_up(*_):
        raise _GaveUp

    store._read = read
    target = tmp_path / "object.part"
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    before = signal.signal(signal.SIGUSR1, give_up)
    other = None
    try:
        with pytest.raises(_GaveUp):
            store.download("key", fd, part, part, 1)
        os.close(fd)  # as FileCache.open does when the download raises
        other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o644)
    finally:
        signal.signal(signal.SIGUSR1, before)
        release.set()
    _Loop.run(_noop())  # the part's step, queued before this, has run
    try:
        written = os.fstat(other).st_size
    finally:
        os.close(other)
    # its bytes went where it was asked to write them (before: through the closed number,
    # into the file that took it, usually the next one opened, or nowhere: EBADF) ...
    assert target.read_bytes() == b"x" * part
    # ... and none into the file opened meanwhile
    assert written == 0, f"a given-up download wrote {written} bytes into another file"


def test_a_download_closes_the_descriptor_its_parts_wrote_through(tmp_path):
    store = Store.open(tmp_path / "root", create=True)
    data = bytes(range(256)) * 40
    store.put("obj", data)
    fd = os.open(tmp_path / "copy", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        store.download("obj", fd, len(data), 4096, 2)  # the loop thread runs at this point
        before = set(os.listdir("/proc/self/fd"))
        store.download("obj", fd, len(data), 4096, 2)
        _Loop.run(_noop())
        left = set(os.listdir("/proc/self/fd")) - before
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
    assert not left, f"a download left descriptors open: {sorted(left)}"


@pytest.mark.parametrize("where", ["io thread", "ctrl-c"])
def test_a_download_that_never_starts_its_parts_leaves_no_descriptor_open(
    tmp_path, monkeypatch, where
):
    # the descriptor the parts write through was closed only by the parts' coroutine, which
    # never runs when the call fails (or is interrupted) before the loop runs it
    store = Store.open(tmp_path / "root", create=True)
    store.put("obj", b"x" * 8192)
    fd = os.open(tmp_path / "copy", os.O_RDWR | os.O_CREAT, 0o644)
    failed: list[BaseException] = []

    def download() -> None:
        try:
            store.download("obj", fd, 8192, 4096, 2)
        except BaseException as e:
            failed.append(e)

    loop = _Loop.get()
    before = _open_files()
    try:
        if where == "io thread":  # a finalizer run there: a named error, not a hang
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (download(), done.set()))
            assert done.wait(30)
        else:  # a Ctrl-C as the call is handed to the loop
            monkeypatch.setattr(_Loop, "get", classmethod(_interrupted))
            download()
            monkeypatch.undo()
        _Loop.run(_noop())
        left = _open_files() - before
    finally:
        os.close(fd)
    assert [type(e) for e in failed] == [StorageError if where == "io thread" else _GaveUp]
    assert not left, f"a download that never started left descriptors open: {sorted(left)}"


def _interrupted(cls):
    raise _GaveUp


async def _noop() -> None:
    return None


def test_a_batch_slot_closed_twice_closes_its_descriptor_once():
    slot = Slot(os.memfd_create("test-slot"))
    slot.unpack(slot.pack({"a": np.arange(10.0)}))  # mapped, as a loader's slots are
    slot.close()
    others = [os.pipe() for _ in range(4)]  # files opened meanwhile take the freed number
    slot.close()  # a handle closed again (_Handle.close runs for each of its slots)
    lost = [fd for pair in others for fd in pair if not is_open(fd)]
    _close_all(others)
    assert not lost, f"a slot closed twice closed descriptors it did not own: {lost}"


def test_a_closed_batch_slot_never_maps_the_file_that_took_its_number():
    slot = Slot(os.memfd_create("test-slot"))
    layout = slot.pack({"a": np.arange(1024.0)})
    slot.close()
    other = os.memfd_create("someone-else")  # takes the freed number
    try:
        os.ftruncate(other, 1 << 16)
        os.pwrite(other, b"\x07" * 8192, 0)
        with pytest.raises(RuntimeError, match="closed"):
            slot.unpack(layout)  # not another file's bytes as the batch
    finally:
        os.close(other)


def test_a_slot_file_closed_twice_closes_its_descriptors_once(tmp_path):
    slots = SlotFile(tmp_path, 4096)
    slots.close()  # a folder used for one purge (chunkfolder.remove_named)
    others = [os.pipe() for _ in range(4)]
    slots.close()
    lost = [fd for pair in others for fd in pair if not is_open(fd)]
    _close_all(others)
    assert not lost, f"a slot file closed twice closed descriptors it did not own: {lost}"


def _close_all(pairs: list[tuple[int, int]]) -> None:
    for pair in pairs:
        for fd in pair:
            if is_open(fd):
                os.close(fd)


def test_a_fork_while_the_folder_lock_closes_its_file_never_closes_another(tmp_path, monkeypatch):
    # A thread lets the lock file go (removed while open: FolderLock._lock_file) while
    # another forks: the child's at-fork handler sees the lock as it was at the fork.
    lock = FolderLock(tmp_path / ".lock")
    with lock:
        pass
    taken: list[tuple[int, int]] = []

    class _ForkingAfterClose:
        def __getattr__(self, name):
            return getattr(os, name)

        def close(self, fd):
            os.close(fd)
            if not taken:  # the forking thread's pipe takes the number, then the fork
                taken.append(os.pipe())
                lock._after_fork()  # what the child's handler does, in that state

    monkeypatch.setattr(folderlock, "os", _ForkingAfterClose())
    lock._close()
    monkeypatch.undo()
    lost = [fd for fd in taken[0] if not is_open(fd)]
    _close_all(taken)
    assert not lost, f"the folder lock's at-fork close hit another file's descriptor: {lost}"


class _FailingContext:
    """A multiprocessing context whose ``fail`` call (``Pipe`` 2, ``Process``) raises
    EMFILE, as a process out of descriptors does."""

    def __init__(self, fail: str):
        self.fail, self.pipes = fail, 0

    def Pipe(self, duplex):  # noqa: N802 (multiprocessing's name)
        self.pipes += 1
        if self.fail == "Pipe" and self.pipes == 2:
            raise OSError(24, "Too many open files")
        return multiprocessing.Pipe(duplex)

    def Process(self, **kwargs):  # noqa: N802
        raise OSError(24, "Too many open files")


@pytest.mark.parametrize("fail", ["Pipe", "Process"])
def test_a_worker_handle_that_fails_to_start_leaves_no_descriptor_open(fail):
    # its slots' memfds (and a first pipe) were made before the try that closes them
    before = _open_files()
    with pytest.raises(OSError, match="Too many open files"):
        _Handle(_FailingContext(fail), SimpleNamespace(depth=2), 0, 1)
    left = _open_files() - before
    for fd, _ in left:
        os.close(fd)
    assert not left, f"a worker handle that failed left descriptors open: {sorted(left)}"


def _open_files() -> set[tuple[int, str]]:
    """This process's open descriptors and what each names (a number freed and taken again
    by another file is a new entry)."""
    files = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            files.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:  # listdir's own descriptor, closed since
            continue
    return files

"""The chunk folder's lock (:mod:`treadle.storage.chunkstore`): exclusive between the
processes of a node and between the threads of one.

Every reservation, release and mark of the chunk store takes it, a few times a step. An
``flock`` on a file opened for each acquisition (:func:`treadle.storage.filecache._locked`)
costs five system calls (open, lock, two stats, close), each letting the other threads of
the loader take the GIL and the caller wait to get it back (issue 48's case reads 3-13%
more samples a second without them). :class:`FolderLock` keeps the file open for
the life of the process: a thread lock, then ``flock`` and one ``stat`` (the lock file
must still be the folder's: one removed or made anew is opened again), then ``flock``
to unlock.

An ``flock`` belongs to the open file, which a forked child shares with its parent: the
child closes its copy and opens its own on first use (``os.register_at_fork``), so a
parent and its child still exclude each other.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from pathlib import Path

from treadle.fork_locks import renew_lock_in_child

__all__ = ["FolderLock", "folder_lock"]

_LOCKS: dict[str, FolderLock] = {}
_REGISTRY = threading.Lock()


class FolderLock:
    """``with lock:`` holds ``path`` (a lock file, made if missing) exclusively against
    every other holder, thread or process. Not reentrant."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._thread = threading.Lock()
        self._fd = -1
        self._inode = -1

    def __enter__(self) -> FolderLock:
        self._thread.acquire()
        try:
            self._lock_file()
        except BaseException:
            self._thread.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread.release()

    def _lock_file(self) -> None:
        """Under the thread lock: ``flock`` the file that is the folder's lock file now."""
        while True:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._inode = os.fstat(self._fd).st_ino
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino == self._inode:
                    return
            except FileNotFoundError:
                pass
            self._close()  # removed (or replaced) while it was open: lock the one there now

    def _close(self) -> None:
        # forgotten before it is closed: a child forked in between would otherwise close the
        # number again (its at-fork handler), by then perhaps the forking thread's new pipe
        fd, self._fd, self._inode = self._fd, -1, -1
        if fd >= 0:
            os.close(fd)  # unlocks it, where this was its last open copy

    def _after_fork(self) -> None:
        """In a forked child: a fresh thread lock, and its own open file when first used."""
        self._thread = threading.Lock()
        self._close()


def folder_lock(directory: Path) -> FolderLock:
    """The process's lock of the chunk folder ``directory`` (its ``.lock`` file)."""
    key = os.fspath(directory)
    got = _LOCKS.get(key)
    if got is None:
        with _REGISTRY:
            got = _LOCKS.setdefault(key, FolderLock(Path(directory) / ".lock"))
    return got


def _files_after_fork_in_child() -> None:
    for lock in _LOCKS.values():
        lock._after_fork()


renew_lock_in_child(sys.modules[__name__], "_REGISTRY")
os.register_at_fork(after_in_child=_files_after_fork_in_child)

"""The chunk folder's lock held open (treadle.storage.folderlock): it excludes other open
files of the lock (other processes), other threads, a forked child, and follows a lock file
made anew."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import threading

import pytest

from treadle.storage.folderlock import FolderLock, folder_lock


def _free_elsewhere(path) -> bool:
    """Whether another open file of ``path`` (as another process has) could lock it now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _readable(fd: int, seconds: float) -> bool:
    """Whether ``fd`` has bytes to read within ``seconds`` (poll: a test process of the
    whole suite holds more than select()'s 1,024 descriptors)."""
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    return bool(waiting.poll(seconds * 1000))


def test_held_it_excludes_other_open_files_and_is_free_after(tmp_path):
    lock = folder_lock(tmp_path)
    assert folder_lock(tmp_path) is lock  # one per folder in a process
    with lock:
        assert not _free_elsewhere(tmp_path / ".lock")
    assert _free_elsewhere(tmp_path / ".lock")
    with lock:  # the file stays open: taken again
        assert not _free_elsewhere(tmp_path / ".lock")


def test_threads_of_one_process_exclude_each_other(tmp_path):
    lock = FolderLock(tmp_path / ".lock")
    count = [0]

    def bump() -> None:
        for _ in range(300):
            with lock:
                seen = count[0]
                os.sched_yield()  # another thread would run here, and lose an update
                count[0] = seen + 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count[0] == 1200


def test_a_lock_file_removed_or_replaced_is_opened_anew(tmp_path):
    lock = FolderLock(tmp_path / ".lock")
    with lock:
        pass
    os.unlink(tmp_path / ".lock")  # another process now locks the file made anew
    with lock:
        assert (tmp_path / ".lock").exists()
        assert not _free_elsewhere(tmp_path / ".lock")
    assert _free_elsewhere(tmp_path / ".lock")


def test_an_error_while_locking_leaves_it_free_for_other_threads(tmp_path):
    lock = FolderLock(tmp_path / "missing" / ".lock")
    with pytest.raises(FileNotFoundError):
        with lock:
            pass
    (tmp_path / "missing").mkdir()
    with lock:
        assert not _free_elsewhere(tmp_path / "missing" / ".lock")


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # the child touches no table
def test_a_forked_child_waits_for_its_parents_hold(tmp_path):
    """An flock belongs to the open file, which a fork shares: a child locking the parent's
    copy would get it at once, while the parent holds it."""
    lock = folder_lock(tmp_path)
    r, w = os.pipe()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: lock, say so, leave
            try:
                with lock:
                    os.write(w, b"in")
            finally:
                os._exit(0)
        early = _readable(r, 0.5)
    try:
        later = _readable(r, 30)
    finally:
        if not later:
            os.kill(pid, signal.SIGKILL)  # waiting forever (a thread lock copied held)
        os.waitpid(pid, 0)
        os.close(w)
    got = os.read(r, 2) if later else b""
    os.close(r)
    assert not early, "the child took the lock its parent holds"
    assert got == b"in", "the child never took the lock"
    with lock:  # the parent's own file is still open and works
        assert not _free_elsewhere(tmp_path / ".lock")

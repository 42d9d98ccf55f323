"""Writing bytes at an offset of an open file, all of them or an error.

``os.pwrite`` returns how many bytes it wrote: on a disk that fills up mid-write (or a file
at ``RLIMIT_FSIZE``) Linux writes what fits and returns that count, no error. A cache that
ignores the count keeps the rest of the range a hole (zeros) in a sparse file, and serves
those zeros as data: :func:`write_at` writes again from where it stopped, so the next call
raises ``OSError`` (``ENOSPC``) instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct

__all__ = ["RANGE_LOCKS", "punch", "range_lock", "range_unlock", "write_at"]

_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (Linux)


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` of file ``fd``, or raise ``OSError``."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:  # nothing written, no error: the disk takes no more
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


_LIBC = None


def punch(fd: int, offset: int, length: int) -> None:
    """Free bytes of a file without changing its size (a hole), or zero them where the file
    system cannot punch holes (then the disk space is not freed)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    with contextlib.suppress(AttributeError):
        if _LIBC.fallocate(fd, _FALLOC_PUNCH, offset, length) == 0:
            return
    os.pwrite(fd, bytes(length), offset)


_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)
RANGE_LOCKS = _OFD_SETLK is not None
"""Whether this system has open file description locks (Linux): byte-range locks held by an
open file, not by a process, so two threads' or two processes' opens of a file exclude each
other, and a lock goes when its holder dies (whatever pid namespace it ran in)."""


def _flock(kind: int, start: int, length: int) -> bytes:
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)  # struct flock, l_pid 0


def range_lock(fd: int, start: int, length: int, wait: bool = True) -> bool:
    """Lock bytes ``[start, start + length)`` of the file open as ``fd`` (0: to its end)
    against every other open of it; ``wait=False``: whether it was free (else not taken).
    True at once where the system has no such locks (:data:`RANGE_LOCKS`)."""
    if _OFD_SETLK is None or _OFD_SETLKW is None:
        return True
    try:
        fcntl.fcntl(fd, _OFD_SETLKW if wait else _OFD_SETLK, _flock(fcntl.F_WRLCK, start, length))
    except OSError as e:
        if not wait and e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def range_unlock(fd: int, start: int, length: int) -> None:
    """Let go of :func:`range_lock`'s lock."""
    if _OFD_SETLKW is not None:
        fcntl.fcntl(fd, _OFD_SETLKW, _flock(fcntl.F_UNLCK, start, length))

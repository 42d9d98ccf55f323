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
import os

__all__ = ["punch", "write_at"]

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

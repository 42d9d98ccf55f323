"""Writing bytes at an offset of an open file, all of them or an error.

``os.pwrite`` returns how many bytes it wrote: on a disk that fills up mid-write (or a file
at ``RLIMIT_FSIZE``) Linux writes what fits and returns that count, no error. A cache that
ignores the count keeps the rest of the range a hole (zeros) in a sparse file, and serves
those zeros as data: :func:`write_at` writes again from where it stopped, so the next call
raises ``OSError`` (``ENOSPC``) instead.
"""

from __future__ import annotations

import errno
import os

__all__ = ["write_at"]


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` of file ``fd``, or raise ``OSError``."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:  # nothing written, no error: the disk takes no more
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n

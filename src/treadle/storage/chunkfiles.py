"""File-level helpers of the chunk store (:mod:`treadle.storage.chunkstore`): freeing an
evicted chunk's bytes (a hole in its sparse file), and telling whether a fetching process
still lives."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

import numpy as np

__all__ = ["alive", "punch"]

_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (Linux)


def alive(pids: np.ndarray) -> np.ndarray:
    """Whether each process id (0: none) is a live process."""
    out = np.zeros(pids.shape, bool)
    for i, p in enumerate(pids.tolist()):
        if p:
            try:
                os.kill(int(p), 0)
                out[i] = True
            except ProcessLookupError:
                pass
            except PermissionError:
                out[i] = True
    return out


_LIBC = None


def punch(fd: int, offset: int, length: int) -> None:
    """Free bytes of a file without changing its size (a hole), or zero them where the file
    system cannot punch holes (then the disk space is freed only when the object goes)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    with contextlib.suppress(AttributeError):
        if _LIBC.fallocate(fd, _FALLOC_PUNCH, offset, length) == 0:
            return
    os.pwrite(fd, bytes(length), offset)

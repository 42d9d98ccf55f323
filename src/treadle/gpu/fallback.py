"""The GPU path's warnings: one :class:`GpuFallbackWarning` per reason per process.

Used by :mod:`treadle.gpu.backend` (no GPU, no NVDEC, no Triton) and
:mod:`treadle.gpu.nvdec_decode` (a stream NVDEC cannot take, a window it failed on).
"""

from __future__ import annotations

import sys
import threading
import warnings

from treadle.fork_locks import renew_lock_in_child


class GpuFallbackWarning(UserWarning):
    """The GPU video path is unavailable (or partly so) and the CPU path is used instead."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


renew_lock_in_child(sys.modules[__name__], "_warned_lock")


def warn_once(key: str, message: str) -> bool:
    """Emit ``message`` as a :class:`GpuFallbackWarning` the first time ``key`` is seen.

    Returns True when it warned. Deduplicated per process (not per call site), so a
    loader re-created every epoch does not repeat it.
    """
    with _warned_lock:
        if key in _warned:
            return False
        _warned.add(key)
    warnings.warn(message, GpuFallbackWarning, stacklevel=3)
    return True

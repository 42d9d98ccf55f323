"""The GPU path's warnings: one :class:`GpuFallbackWarning` per reason per process.

Used by :mod:`treadle.gpu.backend` (no GPU, no NVDEC, no Triton) and
:mod:`treadle.gpu.nvdec_decode` (a stream NVDEC cannot take, a window it failed on).
"""

from __future__ import annotations

import os
import threading
import warnings


class GpuFallbackWarning(UserWarning):
    """The GPU video path is unavailable (or partly so) and the CPU path is used instead."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _reset_in_child() -> None:
    global _warned_lock
    _warned_lock = threading.Lock()  # the parent's may be held by a thread the child lacks


os.register_at_fork(after_in_child=_reset_in_child)


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

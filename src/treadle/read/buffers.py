"""Batch buffers of decoded video, reused once nothing outside the pool refers to them.

A fresh ``[b, T, H, W, 3]`` buffer per batch (108 MB for 8 windows of 90 frames at
224x224) is memory the kernel must map and zero on first touch: measured, that was a
quarter of the CPU time of a 224x224 window read, more than the colour conversion. So
a reader keeps the buffers it handed out and gives one back out only when no batch,
tensor or view can still see it: a numpy array's reference count counts every view of it
(a view's ``base`` is the owner) and every ``torch.from_numpy`` tensor (its storage holds
the array), so a buffer whose count is the pool's own is unreachable from outside.

Every element of a reused buffer is overwritten by the batch's windows (each slot's
window fills all its frames or the read raises), so batches are the same as with fresh
buffers. Only numpy-typed host outputs are pooled (``bfloat16`` and device tensors are
allocated as before).
"""

from __future__ import annotations

import math
import mmap
import sys
import threading
from typing import Any

import numpy as np

#: Buffers a pool keeps at most: a loader's batches in flight (prefetched, being read,
#: held by the training step) and one more.
DEFAULT_BUFFERS = 6

#: Buffers of this size and more are private anonymous maps of ordinary pages, not numpy's
#: allocations: numpy asks the kernel for huge pages (``madvise``) on arrays of 4 MiB and
#: more, and on the 2-core development VM faulting a loader's fresh huge pages in halved
#: the rate of 1 run in 5 (the host took CPU meanwhile: steal time; none in 24 runs without
#: them; issue 33's closing note). A batch buffer is written front to back once per batch:
#: huge pages save little there.
MAP_BYTES = 4 << 20


def _fresh(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, of ordinary pages when it is large."""
    n = math.prod(shape) * dtype.itemsize
    if n < MAP_BYTES or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(shape, dtype)
    # private: a forked child gets copy-on-write pages, as with malloc; the array's base is
    # the map itself, so every view of it counts in the array's references (see the pool)
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.ndarray(shape, dtype, buffer=buf)


class BufferPool:
    """Host batch buffers by shape and dtype, at most ``max_buffers`` kept. Thread-safe: the
    reader prepares the next batches' buffers on its take threads."""

    def __init__(self, max_buffers: int = DEFAULT_BUFFERS):
        self.max_buffers = int(max_buffers)
        # the count of a buffer only the pool holds, seen through _refs: measured, not
        # assumed (interpreters differ in what getrefcount adds)
        self._items: list[np.ndarray] = [np.empty(1)]
        self._free_refs = self._refs(0)
        self._items = []
        self._lock = threading.Lock()

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self._items[i])

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array: a buffer nothing else refers to, or a fresh one (kept
        for reuse while the pool has room or an unused buffer of another shape to drop).

        No loop variable holds a buffer here: it would count as a reference."""
        dtype = np.dtype(dtype)
        with self._lock:  # take threads must never both see one buffer free (free-threaded builds)
            return self._take(shape, dtype)

    def _take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        items, spare = self._items, -1
        for i in range(len(items)):
            if self._refs(i) > self._free_refs:
                continue
            if items[i].shape == shape and items[i].dtype == dtype:
                return items[i]
            if spare < 0:
                spare = i
        out = _fresh(shape, dtype)
        if len(items) < self.max_buffers:
            items.append(out)
        elif spare >= 0:
            items[spare] = out
        return out

    def clear(self) -> None:
        """Drop every buffer (batches handed out keep theirs)."""
        self._items = []

    def allocate(self, frame: Any, t: int, height: int, width: int, batch: int) -> Any:
        """:meth:`~treadle.video.frame_spec.FrameSpec.allocate` of a host batch, pooled when its
        dtype is a numpy one."""
        dtype = frame.numpy_dtype
        if dtype is None:
            return frame.allocate(t, height, width, batch=batch)
        return self.empty((batch, *frame.shape(t, height, width)), dtype)

"""Shared-memory batch slots between a worker process and its loader.

A worker owns a few *slots*, each an anonymous shared-memory file (``memfd``) made once by
the loader and inherited by the worker. The worker writes a batch's fixed-width arrays
into a free slot (:meth:`Slot.pack`) and sends only the slot number and the *layout*
(key, dtype, shape, offset per array) through its pipe; the loader copies the arrays out
(:meth:`Slot.unpack`, one memcpy each, so the caller may keep the batch as long as it
likes) and hands the slot back. A slot grows (the worker truncates the file larger) when
a batch does not fit, so variable-size batches work; values that are not fixed-width
arrays (lists, strings, object arrays, dtypes numpy lacks) travel pickled in the message
(plain pickle: a tensor's bytes go inline, never into a shared-memory segment of its own).
No shared-memory segment is made per batch, and nothing is left behind: the kernel frees
a memfd when its last descriptor and mapping close.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import pickle
from multiprocessing import reduction
from typing import Any

import numpy as np

_ALIGN = 64
_KINDS = set("biufcmM")  # numpy kinds that are plain bytes (no objects, no structs)

Layout = list[tuple[str, Any]]
"""Per key in batch order: ``(key, (dtype, shape, offset))`` in the slot, or ``(key, pickled)``."""


def _as_array(v: Any) -> np.ndarray | None:
    """``v`` as a numpy array of plain bytes, or None (then it travels pickled)."""
    if not isinstance(v, np.ndarray) and type(v).__name__ == "Tensor":  # a CPU torch tensor
        try:
            v = v.detach().numpy()
        except (TypeError, RuntimeError):  # bfloat16 and friends: no numpy dtype
            return None
    if isinstance(v, np.ndarray) and v.dtype.kind in _KINDS and not v.dtype.hasobject:
        return v
    return None


def _end(spec: tuple[str, tuple[int, ...], int]) -> int:
    dtype, shape, offset = spec
    return offset + _dtype(dtype).itemsize * math.prod(shape)


@functools.lru_cache(maxsize=256)
def _dtype(code: str) -> np.dtype:
    """A layout's dtype (per array and batch: numpy's parse and ``np.prod`` of a shape
    tuple were a third of the loader's time per batch with 2 workers; issue 48)."""
    return np.dtype(code)


class Slot:
    """One reusable shared-memory buffer (a memfd), mapped on demand and grown by its writer."""

    def __init__(self, fd: int):
        self.fd = fd
        self._map: mmap.mmap | None = None

    def _mapping(self, size: int, grow: bool) -> mmap.mmap:
        if self._map is not None and len(self._map) >= size:
            return self._map
        if self.fd < 0:  # its number may be another file's now: never mapped, nor grown
            raise RuntimeError("batch slot used after it was closed")
        have = os.fstat(self.fd).st_size
        if have < size:
            if not grow:
                raise RuntimeError(f"batch slot holds {have} bytes, the layout needs {size}")
            have = size + size // 4  # room for batches a little larger than this one
            os.ftruncate(self.fd, have)
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self.fd, have)
        return self._map

    def pack(self, batch: dict[str, Any]) -> Layout:
        """Write ``batch``'s fixed-width arrays into this slot; the layout to send."""
        arrays, layout, size = [], [], 0
        for key, value in batch.items():
            a = _as_array(value)
            if a is None:
                layout.append((key, pickle.dumps(value, protocol=5)))
                continue
            arrays.append((size, a))
            layout.append((key, (a.dtype.str, a.shape, size)))
            size += -(-a.nbytes // _ALIGN) * _ALIGN
        if size:
            buf = self._mapping(size, grow=True)
            for offset, a in arrays:
                if a.nbytes:
                    view = np.frombuffer(buf, a.dtype, a.size, offset).reshape(a.shape)
                    np.copyto(view, a, casting="no")
                    del view  # no export of the mapping may outlive this call
        return layout

    def unpack(self, layout: Layout) -> dict[str, Any]:
        """The batch ``layout`` describes, its arrays copied out of this slot (own memory)."""
        end = max((_end(s) for _, s in layout if isinstance(s, tuple)), default=0)
        buf = self._mapping(end, grow=False) if end else None
        out: dict[str, Any] = {}
        for key, spec in layout:
            if isinstance(spec, bytes):
                out[key] = pickle.loads(spec)
                continue
            dtype, shape, offset = _dtype(spec[0]), spec[1], spec[2]
            n = math.prod(shape)
            a = np.empty(shape, dtype)
            if n:
                np.copyto(a, np.frombuffer(buf, dtype, n, offset).reshape(shape))
            out[key] = a
        return out

    def close(self) -> None:
        """Unmap and close this side's descriptor."""
        if self._map is not None:
            self._map.close()
            self._map = None
        fd, self.fd = self.fd, -1  # closed once: a second close would hit a reused number
        if fd >= 0:
            os.close(fd)


class SlotFd:
    """A slot's descriptor handed to a worker at its start (multiprocessing duplicates it
    into the worker, where it unpickles as the plain ``int``)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _inherit, (reduction.DupFd(self.fd),)


def _inherit(dup: Any) -> int:
    return dup.detach()

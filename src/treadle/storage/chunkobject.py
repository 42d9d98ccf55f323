"""One object's chunks as a reader of this process sees them (:mod:`treadle.storage.chunkstore`).

Its files are :class:`~treadle.storage.chunkfolder.ObjectFiles`'. A reader copies rows out of
present chunks with :meth:`ObjectChunks.copy_rows`: the state words of every row are checked
at once, before and after the copy (an eviction between marks the chunk absent with a new
generation, which the second check sees), and each row is read straight into its place in the
batch (``preadv``: no bytes object, no second copy).
"""

from __future__ import annotations

import os

import numpy as np

from treadle.storage.chunkfolder import PRESENT, ObjectFiles
from treadle.storage.chunkfolder import STATE_MASK as _STATE_MASK
from treadle.storage.folderlock import folder_lock

__all__ = ["ObjectChunks"]


class ObjectChunks(ObjectFiles):
    """One object's files in the store: its sparse data file and mapped state words."""

    def present(self, index: int) -> bool:
        return int(self.words[index, 0]) & _STATE_MASK == PRESENT

    def reopen_removed(self) -> bool:
        """Under the folder's lock: whether this object, its files removed, is mapped anew
        (where some process of the node made them again)."""
        with folder_lock(self.directory):
            return self.removed() and self.reopen(create=False)

    def copy_rows(self, starts: np.ndarray, out: np.ndarray,
                  into: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """Copy bytes ``[s, s + length)`` for each ``s`` of ``starts`` into row ``into[i]``
        of ``out`` (uint8, C-contiguous ``[rows, length]``; ``into``: by default row ``i``)
        where every chunk they touch is present and stays so while copied; whether each was
        (the rows of the others hold nothing to use)."""
        starts = np.asarray(starts, np.int64)
        into = np.arange(len(starts)) if into is None else np.asarray(into, np.int64)
        length = out.shape[1]
        if length <= 0:
            return np.ones(len(starts), bool)
        if self.removed():
            self.reopen_removed()
        if not len(starts):
            return np.zeros(0, bool)
        words = self.words  # one mapping for both checks (a re-open switches it)
        first, last = starts // self.chunk, (starts + length - 1) // self.chunk
        lo, hi = int(first.min()), int(last.max()) + 1  # the state words of the chunks in reach
        first, last = first - lo, last - lo
        before = words[lo:hi, 0].copy()
        ok = _all_in_spans(before & _STATE_MASK == PRESENT, first, last)
        idx = np.flatnonzero(ok)
        for i, row, at in zip(idx.tolist(), into[idx].tolist(), starts[idx].tolist()):
            if os.preadv(self.fd, [out[row]], at) != length:
                ok[i] = False
        if len(idx):  # evicted (and maybe fetched again) while copied: not trusted
            ok[idx] &= _all_in_spans(words[lo:hi, 0] == before, first[idx], last[idx])
        return ok


def _all_in_spans(good: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per span ``[first[i], last[i]]`` of indices into ``good``: whether all are good."""
    bad = np.concatenate([[0], np.cumsum(~good)])
    return bad[last + 1] == bad[first]

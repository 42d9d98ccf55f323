"""One object's chunks as a reader of this process sees them (:mod:`treadle.storage.chunkstore`).

Its state words are :class:`~treadle.storage.chunkfolder.ObjectFiles`'; each present chunk's
bytes are in the slot its words name (:mod:`~treadle.storage.slotfile`). A reader copies rows
out of present chunks with :meth:`ObjectChunks.copy_rows`: the state words of every row are
checked at once, before and after the copy (an eviction between marks the chunk absent with a
new generation, which the second check sees; its slot changes hands only after that), and
each row is read straight into its place in the batch (``preadv``: no bytes object, no second
copy), in one piece per chunk it touches. After the copy, and before the second check, the
slot file's mark (not cut under the bytes: :meth:`~treadle.storage.slotfile.SlotFile.marked`)
and the state file (not deleted by hand: :meth:`ObjectChunks.linked`) are checked too.
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
        """Under the folder's lock: whether this object, its files removed (or deleted by
        hand), is mapped anew (where some process of the node made them again)."""
        with folder_lock(self.directory):
            if not self.removed() and not self.linked():
                self.let_go()
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
        inside = (starts >= 0) & (starts + length <= self.size)
        if not inside.all():  # past the object's end: its last slot's tail holds zeros
            ok = np.zeros(len(starts), bool)
            if inside.any():
                ok[inside] = self.copy_rows(starts[inside], out, into[inside])
            return ok
        words = self.words  # one mapping for both checks (a re-open switches it)
        first, last = starts // self.chunk, (starts + length - 1) // self.chunk
        lo, hi = int(first.min()), int(last.max()) + 1  # the state words of the chunks in reach
        first, last = first - lo, last - lo
        before = words[lo:hi, 0].copy()
        slots = words[lo:hi, 3].copy()  # after the states: a slot changes hands after them
        ok = _all_in_spans((before & _STATE_MASK == PRESENT) & (slots >= 0), first, last)
        idx = np.flatnonzero(ok)
        fd, chunk = self.slots.fd, self.chunk
        at = slots[first[idx]] * chunk + (starts[idx] - (first[idx] + lo) * chunk)
        one = first[idx] == last[idx]
        for i, row, pos in zip(idx[one].tolist(), into[idx[one]].tolist(), at[one].tolist()):
            if os.preadv(fd, [out[row]], pos) != length:
                ok[i] = False
        for i in idx[~one].tolist():  # a row across chunks: a piece from each one's slot
            ok[i] = self._copy_pieces(out[into[i]], int(starts[i]), slots, lo, fd)
        if len(idx) and not self.slots.marked(int(slots.max()), fd):  # the file cut under
            ok[idx] = False  # them: zeros, or bytes written since (SlotFile.marked)
        if len(idx) and not self.linked():  # state file deleted: its slots may be freed
            ok[idx] = False
            self.reopen_removed()
        if len(idx):  # evicted (and maybe fetched again) while copied: not trusted
            ok[idx] &= _all_in_spans(words[lo:hi, 0] == before, first[idx], last[idx])
        return ok

    def _copy_pieces(self, row: np.ndarray, start: int, slots: np.ndarray, lo: int,
                     fd: int) -> bool:  # fmt: skip
        """Copy bytes ``[start, start + len(row))`` of the slot file open as ``fd`` into
        ``row``, a piece per chunk (its slot: ``slots[chunk - lo]``); whether every piece was
        read whole."""
        end, at = start + len(row), start
        while at < end:
            c = at // self.chunk
            stop = min(end, (c + 1) * self.chunk)
            if slots[c - lo] < 0:  # evicted since its state was read
                return False
            pos = int(slots[c - lo]) * self.chunk + (at - c * self.chunk)
            if os.preadv(fd, [row[at - start : stop - start]], pos) != stop - at:
                return False
            at = stop
        return True

    def read(self, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` when every chunk they touch is present (and stays so while
        they are copied), else None (also past the object's end: the tail of its last
        chunk's slot holds zeros, not bytes of it)."""
        if start < 0 or end > self.size:
            return None
        first, last = start // self.chunk, max(start, end - 1) // self.chunk
        for _ in range(2):  # again once the files of a removed object were mapped anew
            words = self.words  # one mapping for both checks (a re-open switches it)
            before = words[first : last + 1, 0].tolist()  # 1-2 words: Python is quicker
            if any(w & _STATE_MASK != PRESENT for w in before):
                if self.removed() and self.reopen_removed():
                    continue
                return None
            out, fd = np.empty(end - start, np.uint8), self.slots.fd
            slots = words[first : last + 1, 3].copy()
            whole = self._copy_pieces(out, start, slots, first, fd)
            whole = whole and self.slots.marked(int(slots.max()), fd)  # not cut under them
            if whole and not self.linked():  # its state file deleted: its slots may be freed
                if self.reopen_removed():
                    continue
                return None
            if not whole or words[first : last + 1, 0].tolist() != before:
                return None  # evicted (and maybe fetched again) while copied: not trusted
            return out.tobytes()
        return None


def _all_in_spans(good: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per span ``[first[i], last[i]]`` of indices into ``good``: whether all are good."""
    bad = np.concatenate([[0], np.cumsum(~good)])
    return bad[last + 1] == bad[first]

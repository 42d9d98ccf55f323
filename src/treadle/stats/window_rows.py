"""Which rows of a scan of a table the windows of a run take (``plan.stats``'s row path,
:mod:`treadle.stats.plan_stats`), and those rows' values.

A run's statistics weigh each row by the unpadded window offsets of its anchors that take
it; a row no window takes weighs 0. Such a row may hold a null (an episode the run leaves
out with ``episodes=`` or ``where=``, the remedy the plan's null check names): it is not
counted, so its null is no error here. A null a window takes is refused as a batch would.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from treadle.table.tensors import to_numpy

__all__ = ["Taken", "window_values"]


class Taken:
    """Which rows ``lo .. lo+n-1`` the window offset ``o`` of an anchor takes unpadded: the
    row ``row - o`` is one of the component's anchors and lies in the row's episode (anchor
    runs and episodes over the rows the offsets reach, built from the boundaries that fall
    among them; each offset is then a slice)."""

    def __init__(self, lo: int, n: int, reach: tuple[int, int], first: np.ndarray,
                 stop: np.ndarray, starts: np.ndarray):  # fmt: skip
        self.n, self.lo = n, lo
        self.s0 = lo - max(reach[1], 0)  # positions s0 .. s1-1: the rows and every row - o
        m = lo + n - min(reach[0], 0) - self.s0
        self.ok = _inside(first, stop, self.s0, m)
        self.episode = _segment(starts, self.s0, m)
        self.own = self.episode[lo - self.s0 : lo - self.s0 + n]
        self.memo: dict[int, np.ndarray] = {}

    def by(self, o: int) -> np.ndarray:
        if o not in self.memo:
            at = self.lo - o - self.s0
            s = slice(at, at + self.n)
            self.memo[o] = self.ok[s] & (self.episode[s] == self.own)
        return self.memo[o]

    def times(self, offsets: np.ndarray) -> np.ndarray:
        """How many of ``offsets`` take each row."""
        out = np.zeros(self.n, np.int32)  # adds bools much faster than int64
        for o in offsets.tolist():
            out += self.by(o)
        return out


def _segment(starts: np.ndarray, s0: int, m: int) -> np.ndarray:
    """The episode of each row ``s0 .. s0+m-1`` (``-1`` before the first): the index of the
    last of the sorted ``starts`` at or before it, from the starts among those rows."""
    e0 = int(np.searchsorted(starts, s0, side="right")) - 1
    e1 = int(np.searchsorted(starts, s0 + m - 1, side="right"))
    out = np.zeros(m, np.int64)
    np.add.at(out, starts[e0 + 1 : e1] - s0, 1)
    np.cumsum(out, out=out)
    out += e0
    return out


def _inside(first: np.ndarray, stop: np.ndarray, s0: int, m: int) -> np.ndarray:
    """Whether each row ``s0 .. s0+m-1`` lies in one of the sorted, disjoint runs
    ``[first, stop)``, from the runs that reach those rows."""
    r0 = max(int(np.searchsorted(first, s0, side="right")) - 1, 0)
    r1 = int(np.searchsorted(first, s0 + m, side="left"))
    edge = np.zeros(m + 1, np.int64)
    np.add.at(edge, np.clip(first[r0:r1] - s0, 0, m), 1)
    np.add.at(edge, np.clip(stop[r0:r1] - s0, 0, m), -1)
    return np.cumsum(edge[:m]) > 0


def window_values(
    column: pa.Array | pa.ChunkedArray, field: pa.Field, taken: Taken, offsets: np.ndarray,
    table: str,
) -> np.ndarray | None:  # fmt: skip
    """``column``'s values over the scanned rows as numpy ``[rows, ...]``, each null in a
    row no offset takes (weight 0) replaced by another row's value (never counted); None
    when every row is such a null. A null a window takes is the
    :class:`~treadle.errors.CorruptData` :func:`~treadle.table.tensors.to_numpy` raises."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        null = column.is_null().to_numpy(zero_copy_only=False)
        if not (null & (taken.times(offsets) > 0)).any():
            valid = np.flatnonzero(~null)
            if not len(valid):
                return None
            pick = np.arange(len(column), dtype=np.int64)
            pick[null] = valid[0]
            column = column.take(pa.array(pick))
    return to_numpy(column, field, f"table {table!r}")

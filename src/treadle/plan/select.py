"""Which moments of a table a component draws: runs of anchor rows.

A component's anchors are the eligible moments of its episodes (those its unpadded windows
fit), restricted to the episodes it names (``episodes=``) and to the rows whose own values
satisfy its ``where`` predicate. They are kept as sorted, disjoint runs ``[begin, end)`` of
row ids, so a plan's memory is proportional to the runs, not to the table.

:func:`intersect_runs` and :func:`episode_runs` are pure; :func:`component_runs` evaluates
``where`` through the pinned table (the only I/O, done when a recipe is planned or a plan is
rebuilt from its record).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.null_rows import check_null_rows
from treadle.plan.windows import Windows

if TYPE_CHECKING:
    from treadle.table.table import Table

Runs = tuple[np.ndarray, np.ndarray]
"""(begin, end) int64 arrays: sorted, disjoint, non-empty row ranges."""


def intersect_runs(a: Runs, b: Runs) -> Runs:
    """The rows in both ``a`` and ``b`` (both sorted, disjoint), as runs; O(|a| + |b| + out)."""
    ab, ae = (np.asarray(x, np.int64) for x in a)
    bb, be = (np.asarray(x, np.int64) for x in b)
    j0 = np.searchsorted(be, ab, side="right")
    j1 = np.searchsorted(bb, ae, side="left")
    counts = np.maximum(j1 - j0, 0)
    total = int(counts.sum())
    ai = np.repeat(np.arange(len(ab)), counts)
    bj = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(j0, counts)
    begin = np.maximum(ab[ai], bb[bj])
    end = np.minimum(ae[ai], be[bj])
    keep = begin < end
    return begin[keep], end[keep]


def episode_runs(
    starts: np.ndarray, lengths: np.ndarray, windows: Windows | None, keep: np.ndarray | None
) -> Runs:
    """Per kept episode, the run of its eligible anchors (unpadded windows fit)."""
    lo, hi = (0, 0) if windows is None else windows.eligible_span()
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(lengths, np.int64) - (hi - lo)  # a new array: changed in place below
    mask = counts > 0
    if keep is not None:
        mask &= keep
    # in place where it can be: at 1M episodes every temporary array is 8 MB (issue 33)
    if mask.all():
        begin = starts - lo
        counts += begin
        return begin, counts
    begin = starts[mask]
    begin -= lo
    end = counts[mask]
    end += begin
    return begin, end


def episode_mask(
    names: Sequence[str], wanted: Sequence[str] | None, where: str
) -> np.ndarray | None:
    """Which episodes of a table ``wanted`` names; a :class:`PlanError` listing (up to five)
    names the table does not have."""
    if wanted is None:
        return None
    have = set(names)
    unknown = [n for n in wanted if n not in have]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        hint = ""
        if any(n.startswith("episode_") and n[8:].isdigit() for n in unknown):
            hint = " (an integer in episodes= is a LeRobot episode index, named episode_{i:06d})"
        raise PlanError(
            f"{where}: episodes {unknown[:5]}{more} are not episodes of the table "
            f"({len(names)} episodes, e.g. {list(names[:3])}){hint}"
        )
    wanted_set = set(wanted)
    return np.fromiter((n in wanted_set for n in names), np.bool_, len(names))


def component_runs(
    table: Table,
    episodes: Any,
    windows: Windows | None,
    where: str | None,
    names: Sequence[str] | None,
    label: str,
) -> Runs:
    """A component's anchor runs. ``where`` is evaluated by ``table.select_runs`` (one
    streaming scan of the predicate); a bad predicate is a :class:`PlanError` naming ``label``."""
    keep = episode_mask(episodes.names, names, label)
    runs = episode_runs(episodes.starts, episodes.lengths, windows, keep)
    # before where=: a purged row's values are gone, so whether it matched is unknown
    check_purged(table, episodes, runs)
    if where is not None:
        try:
            selected = table.select_runs(where)
        except PlanError as e:
            raise PlanError(f"{label}: {e}") from None
        runs = intersect_runs(runs, selected)
    check_null_rows(table, episodes, windows, runs, label)
    return runs


def check_purged(table: Table, episodes: Any, runs: Runs) -> None:
    """Raise :class:`~treadle.errors.Purged` when an anchor run reaches an episode a purge
    removed (so a pinned run fails when it is planned or resumed, not at step N)."""
    purged = table.purged(fresh=True)
    if not purged:
        return
    begin, end = (np.asarray(x, np.int64) for x in runs)
    for name, err in purged.items():
        if name in episodes.names:
            i = episodes.names.index(name)
            start = int(episodes.starts[i])
            stop = start + int(episodes.lengths[i])
            if np.any((begin < stop) & (end > start)):
                raise err

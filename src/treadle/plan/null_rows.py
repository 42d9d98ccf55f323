"""Null values a component's windows would read: a :class:`PlanError` before step 0.

A batch holds number and tensor columns as tensors, which have no null. Such a column
holds nulls where an added column without a ``default=`` meets episodes appended after it
(or merged in), where ``update({col: None})`` set them, or where an import kept a latched
topic's rows before its first message. Found only when a batch reads such a row, that is
an error at whatever step draws it; the plan finds it first instead, naming the table, the
column, an episode and a frame, and the ways out.

Number and tensor columns are read (the column whole: 8 bytes a row for a number) only
where they may hold a null: added without a value for later episodes (``add_column``), or
recorded by a write that held one (:mod:`treadle.table.null_columns`: Arrow's null counts,
no row read), so a plan over columns that never held one reads nothing; image columns read by
``td.Video`` only when their writes recorded a null (:mod:`treadle.table.image_sizes`),
which also records the first value that is not an image, or not of the first one's bit
depth: a window that reads it is refused too. What a column holds is kept with the pinned
:class:`~treadle.table.table.Table` it was read through (a version is immutable; a URI and a
version number are not enough: a store removed and written again reuses them).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.errors import PlanError, TreadleError
from treadle.plan.column_kinds import batch_column_kind, default_columns
from treadle.plan.windows import Rows, Video, Windows
from treadle.table.defaults import is_added
from treadle.table.image_sizes import recorded_images
from treadle.table.null_columns import recorded_nulls

if TYPE_CHECKING:
    from treadle.table.table import Table

Runs = tuple[np.ndarray, np.ndarray]

_kept: weakref.WeakKeyDictionary[Table, dict[str, Runs]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _reads(table: Table, windows: Windows | None) -> list[tuple[str, tuple[int, ...], bool]]:
    """``(column, offsets, pad)`` of every number or tensor column the component reads
    that may hold nulls."""
    if windows is None or not windows.specs:
        specs = [(c, (0,), False) for c in default_columns(table)]
    else:
        specs = [
            (c, s.offsets, s.pad)
            for c, s in windows.items()
            if isinstance(s, Rows) and s.offsets is not None and c in table.schema.names
        ]
    out = []
    images, written = recorded_images(table.schema), recorded_nulls(table.schema)
    if windows is not None:  # image columns that a write recorded a null in
        out = [
            (c, tuple(s.offsets), bool(s.pad))
            for c, s in windows.items()
            if isinstance(s, Video) and s.offsets is not None and images.get(c, {}).get("nulls")
        ]
    for col, offsets, pad in specs:
        field = table.schema.field(col)
        try:
            kind = batch_column_kind(table, field)
        except TreadleError:
            continue  # check_windows says so, naming the component
        maybe = is_added(field) or col in written
        if kind in ("scalar", "tensor") and maybe:
            out.append((col, tuple(offsets), bool(pad)))
    return out


def null_runs(table: Table, column: str) -> Runs:
    """The rows of ``column`` that are null, as sorted runs ``(begin, end)``."""
    with _lock:
        hit = _kept.get(table, {}).get(column)
    if hit is not None:
        return hit
    begins, ends, base = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0
    try:
        for batch in table.dataset.to_batches(columns=[column]):
            null = batch.column(0).is_null().to_numpy(zero_copy_only=False).astype(np.int8)
            edges = np.diff(np.concatenate([[0], null, [0]]))
            begins.append(np.flatnonzero(edges == 1) + base)
            ends.append(np.flatnonzero(edges == -1) + base)
            base += len(null)
    except (OSError, ValueError, pa.ArrowException) as e:
        if isinstance(e, TreadleError):
            raise
        raise table.read_error(e, f"reading column {column!r} of {table!r}") from None
    runs = (np.concatenate(begins), np.concatenate(ends))
    with _lock:
        _kept.setdefault(table, {})[column] = runs
    return runs


def _first_read(
    anchors: Runs, offset: int, pad: bool, starts: np.ndarray, lengths: np.ndarray, nulls: Runs
) -> int | None:
    """The first null row the anchors read at ``offset`` (each anchor run lies in one
    episode; ``pad``: offsets outside it take its nearest row), or None."""
    begin, end = (np.asarray(x, np.int64) for x in anchors)
    lo, hi = begin + offset, end + offset
    if pad:
        ep = np.searchsorted(starts, begin, side="right") - 1
        s, e = starts[ep], starts[ep] + lengths[ep]
        rb, re = np.clip(lo, s, e), np.clip(hi, s, e)
        re = np.where(lo < s, np.maximum(re, s + 1), re)
        rb = np.where(hi > e, np.minimum(rb, e - 1), rb)
        lo, hi = rb, re
    nb, ne = nulls
    j = np.searchsorted(ne, lo, side="right")
    inside = j < len(nb)
    hit = inside & (nb[np.minimum(j, len(nb) - 1)] < hi)
    if not hit.any():
        return None
    return int(np.maximum(lo[hit], nb[j[hit]]).min())


def check_null_rows(
    table: Table,
    episodes: Any,
    windows: Windows | None,
    anchors: Runs,
    label: str,
    *,
    reader: str = "a window",
    out: str = "leave those moments out (where=, episodes=)",
) -> None:
    """:class:`PlanError` when a window of one of ``anchors`` reads a null value of a
    number or tensor column (which a batch cannot hold), naming the episode, frame and row
    (``reader`` and ``out``: what reads it and the way out, in that error)."""
    if not len(anchors[0]) or not hasattr(type(table), "dataset"):
        return  # a stand-in with no rows (simulate's tables, the planner's tests)
    starts = np.asarray(episodes.starts, np.int64)
    lengths = np.asarray(episodes.lengths, np.int64)
    _check_odd_images(table, episodes, windows, anchors, label, starts, lengths)
    for col, offsets, pad in _reads(table, windows):
        nulls = null_runs(table, col)
        if not len(nulls[0]):
            continue
        rows = [_first_read(anchors, o, pad, starts, lengths, nulls) for o in offsets]
        found = [r for r in rows if r is not None]
        if not found:
            continue
        row = min(found)
        i = int(np.searchsorted(starts, row, side="right")) - 1
        total = int((nulls[1] - nulls[0]).sum())
        added = is_added(table.schema.field(col))
        why = " (it was added without default=, then episodes were appended)" if added else ""
        raise PlanError(
            f"{label}: column {col!r} of table {table.name!r} is null at episode "
            f"{episodes.names[i]!r}, frame {row - int(starts[i])} (row {row}; null rows in "
            f"version {table.version}: {total}){why}, and {reader} reads it, which a batch "
            f'cannot hold: fill them (table.update({{{col!r}: value}}, where="{col} IS '
            f'NULL")), or {out}'
        )


def check_scan_rows(table: Table, columns: list[str], rows: np.ndarray, label: str) -> None:
    """:class:`PlanError` when one of ``rows`` (sorted row ids) is null in one of ``columns``
    that a batch holds as a tensor (a scan's columns, each at the row itself), naming the
    column, episode, frame and row; columns read as for a plan (those that may hold one)."""
    rows = np.asarray(rows, np.int64)
    tensors = [c for c in columns if c not in table.video_columns]
    if not len(rows) or not tensors or not hasattr(type(table), "dataset"):
        return
    windows = Windows({c: Rows([0]) for c in tensors})
    if not _reads(table, windows):
        return  # no column that may hold a null: the episode index is not needed either
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    runs = (rows[np.concatenate([[0], cut])], rows[np.concatenate([cut - 1, [len(rows) - 1]])] + 1)
    out = "leave those rows out (scan_request(columns, filter=...))"
    check_null_rows(table, table.episodes(), windows, runs, label, reader="the scan", out=out)


def _check_odd_images(
    table: Table,
    episodes: Any,
    windows: Windows | None,
    anchors: Runs,
    label: str,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """:class:`PlanError` when a ``td.Video`` window reads the value its image column's
    writes recorded as one it cannot decode beside the others (``odd``)."""
    images = recorded_images(table.schema)
    for col, spec in () if windows is None else windows.items():
        odd = images.get(col, {}).get("odd") if isinstance(spec, Video) else None
        if not odd or odd[0] is None or odd[1] is None or odd[0] not in episodes.names:
            continue  # not recorded, or its episode is gone: each frame is checked as read
        episode, frame, what = odd
        i = episodes.names.index(episode)
        if not 0 <= int(frame) < int(lengths[i]):
            continue
        row = int(starts[i]) + int(frame)
        one = (np.array([row], np.int64), np.array([row + 1], np.int64))
        if any(_first_read(anchors, o, spec.pad, starts, lengths, one) is not None
               for o in spec.offsets or ()):  # fmt: skip
            raise PlanError(
                f"{label}: column {col!r} of table {table.name!r} holds, at episode "
                f"{episode!r}, frame {frame}, {what}, which its td.Video window reads; leave "
                "those moments out (where=, episodes=) or write the episode again"
            )

"""Rows around an anchor: edge padding (``pad=True``), the anchor's episode and frame, and
string / variable-length list columns as Python values. Used by the row takes
(:mod:`treadle.read.takes`) and the reader (:mod:`treadle.read.sample_reader`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from treadle.table.table import Table

IS_PAD = "_is_pad"
"""Suffix of the bool ``[b, T]`` column that says which window entries were padded."""


def episode_bounds(table: Table, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode index, first row of that episode) of each moment row."""
    episodes = table.episodes()
    e = np.searchsorted(episodes.starts, moments, side="right") - 1
    return e.astype(np.int64), np.asarray(episodes.starts, np.int64)[e]


def padded_rows(
    table: Table, moments: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``moment + offset`` clamped to each moment's episode (``[n, T]``), and where
    they were clamped (bool ``[n, T]``): LeRobot's edge padding."""
    e, first = episode_bounds(table, moments)
    last = first + np.asarray(table.episodes().lengths, np.int64)[e] - 1
    want = moments[:, None] + offsets[None, :]
    rows = np.clip(want, first[:, None], last[:, None])
    return rows, rows != want


def listed_values(
    column: pa.ChunkedArray, inverse: np.ndarray, same: bool, spec: Any, t: int
) -> list[Any]:
    """A string / variable-length list column as Python values: one per sample, or a list
    of ``t`` per sample under a ``Rows`` window."""
    values = column.to_pylist()
    if not same:
        values = [values[i] for i in inverse.reshape(-1).tolist()]
    if spec is None:
        return values
    return [values[i : i + t] for i in range(0, len(values), t)]

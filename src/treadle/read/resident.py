"""The resident path of :mod:`treadle.read.fixed`: a narrow column of a pinned table read
whole, once, into one numpy array (actions, states, scalars: Lance's compressed mini-blocks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from treadle.table.tensors import to_numpy

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["whole_column"]


def whole_column(table: Table, column: str, f: pa.Field) -> np.ndarray:
    """``to_numpy`` of the whole column, filled batch by batch (in row order) into one
    array: the Arrow table, its combined copy and the array were ~3x the column at once,
    now one array and one batch (issue 33: a 32 MB column cost a worker 65 MB)."""
    out: np.ndarray | None = None
    at = 0
    try:
        for batch in table.dataset.to_batches(columns=[column], scan_in_order=True):
            part = to_numpy(batch.column(0), f)
            if out is None:
                out = np.empty((table.num_moments, *part.shape[1:]), part.dtype)
            out[at : at + len(part)] = part
            at += len(part)
    except (OSError, pa.ArrowException) as e:
        raise table.read_error(e, f"reading column {column!r} of {table!r}") from None
    if out is None or at != len(out):
        return to_numpy(table.to_arrow([column]).column(column), f)  # as before
    return out

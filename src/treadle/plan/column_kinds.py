"""Which columns a component reads, and how a batch holds each: :func:`default_columns`
and :func:`batch_column_kind` (re-exported by :mod:`treadle.plan.windows`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from treadle.errors import PlanError, TreadleError
from treadle.table.episodes import EPISODE, FRAME
from treadle.table.tensors import batch_kind

if TYPE_CHECKING:
    from treadle.table.table import Table


def default_columns(table: Table) -> list[str]:
    """The columns a component without windows reads: all but ``episode`` and ``frame``."""
    return [n for n in table.schema.names if n not in (EPISODE, FRAME)]


def _is_listed(t: pa.DataType) -> bool:
    """Strings, bytes and variable-length lists: a batch holds them as Python lists."""
    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_list, pa.types.is_large_list,
             pa.types.is_binary, pa.types.is_large_binary)  # fmt: skip
    return any(is_kind(t) for is_kind in kinds)


def batch_column_kind(table: Table, field: pa.Field) -> str:
    """How a batch holds a column it must hold (:func:`~treadle.table.tensors.batch_kind`,
    or ``"list"``: strings, bytes and variable-length lists, as Python lists of length ``b``);
    a :class:`PlanError` naming the table and the column when it cannot."""
    if field.name in table.video_columns:
        return "video"
    try:
        kind = batch_kind(field)
    except TreadleError as e:  # e.g. tensor shape metadata that does not fit the type
        raise PlanError(f"table {table.name!r}: {e}") from None
    blob = (field.metadata or {}).get(b"lance-encoding:blob") == b"true"  # takes: descriptors
    if kind is None and _is_listed(field.type) and not blob:
        return "list"
    if kind is None:
        raise PlanError(
            f"column {field.name!r} of table {table.name!r} is {field.type}, which a batch "
            "cannot hold (batches hold numbers, fixed-size tensors, video, and strings, bytes "
            "and lists as Python lists); name the columns to read with td.Windows (TrainLoader) "
            "or scan_request(columns)"
        )
    return kind

"""Batch keys treadle generates are reserved: no column or ``rename=`` may deliver one.

A batch carries keys of its own beside the columns it reads: ``_component``, ``_moment``,
``_episode``, ``_frame``, ``_valid``, and per column ``<col>_is_pad``, ``<col>_dim_mask`` and
``<col>_is_present``. A column delivered under one of those names would silently replace
(or be replaced by) the generated value, so the rule is one test on the name alone, true
whatever features a recipe turns on: a delivered key that starts with ``_`` or ends with
one of :data:`RESERVED_SUFFIXES` is a :class:`PlanError` when the plan is built. Rename
such a column (``Component(rename={"x_is_pad": "x_was_padded"})``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from treadle.errors import PlanError
from treadle.names import RESERVED_SUFFIXES
from treadle.plan.windows import Windows, default_columns

if TYPE_CHECKING:
    from treadle.table.table import Table

RESERVED_PREFIX = "_"


def reserved(key: str) -> bool:
    """Whether ``key`` is a name treadle generates (or may generate) in a batch."""
    return key.startswith(RESERVED_PREFIX) or key.endswith(RESERVED_SUFFIXES)


def delivered_keys(
    table: Table, windows: Windows | None, rename: Iterable[tuple[str, str]] | None
) -> list[tuple[str, str]]:
    """``(batch key, table column)`` for every column a component delivers."""
    read = default_columns(table) if windows is None or not windows.specs else windows.columns()
    names = dict(rename or ())
    return [(names.get(col, col), col) for col in read]


def check_batch_keys(
    table: Table,
    windows: Windows | None,
    rename: Iterable[tuple[str, str]] | None,
    where: str,
) -> None:
    """A :class:`PlanError` naming the first delivered key that is reserved."""
    for key, col in delivered_keys(table, windows, rename):
        if not reserved(key):
            continue
        how = f"column {col!r}" if key == col else f"rename {col!r} -> {key!r}"
        raise PlanError(
            f"{where}: {how} would deliver batch key {key!r}, which is reserved for the keys "
            f"treadle generates (names starting with {RESERVED_PREFIX!r} or ending with "
            f"{', '.join(RESERVED_SUFFIXES)}): rename it with "
            f"Component(rename={{{col!r}: ...}})"
        )

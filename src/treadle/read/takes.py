"""Row takes: the rows ``moment + offset`` of a component's samples, one Lance take per
set of columns that share offsets.

Stage 1 (:func:`take_groups`, :func:`fixed_groups`) groups a component's row columns (not video) by their
offsets and padding into :class:`Take` s; stage 2 (:func:`run_take`) runs one take and
reshapes it to ``[n, T, ...]`` (pure in its inputs, so takes run on any thread, ahead of
the batch that needs them); stage 3 (:func:`write_taken`) writes the results into a
batch's dict at the samples' slots, checking that every component gives the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.read.columns import ColumnSpec
from treadle.read.fixed import FixedReader, fixed_width
from treadle.read.rows import IS_PAD, listed_values, padded_rows
from treadle.table.tensors import to_numpy

if TYPE_CHECKING:
    from treadle.table.table import Table


@dataclass(frozen=True)
class Take:
    """One take: the columns ``group`` (same offsets) at ``moments``, for batch ``slots``."""

    table: Table
    group: tuple[ColumnSpec, ...]
    moments: np.ndarray
    slots: np.ndarray
    fixed: FixedReader | None = None  # every column is fixed-width: read through it


@dataclass(frozen=True)
class Taken:
    """What :func:`run_take` read: one array (or Python list) per column of the group, and,
    for a padded group, where the rows were clamped to the episode (bool ``[n, T]``)."""

    take: Take
    arrays: list[Any]
    pad: np.ndarray | None


def take_groups(columns: list[ColumnSpec]) -> list[tuple[ColumnSpec, ...]]:
    """The row columns of ``columns`` (not video) grouped by offsets and padding, in order."""
    groups: dict[tuple[Any, ...] | None, list[ColumnSpec]] = {}
    for cs in columns:
        if not cs.video and not cs.absent:
            key = None if cs.spec is None else (tuple(cs.spec.offsets), cs.spec.pad)
            groups.setdefault(key, []).append(cs)
    return [tuple(group) for group in groups.values()]


def fixed_groups(
    table: Table, columns: list[ColumnSpec], fixed: FixedReader | None
) -> list[tuple[tuple[ColumnSpec, ...], FixedReader | None]]:
    """:func:`take_groups`, each with ``fixed`` when every column of the group is
    fixed-width (read through it) and None otherwise (a Lance take). Depends only on the
    pinned schema: compute it once per table and reuse it for every batch."""
    return [
        (g, fixed if fixed is not None and all(_fixed(table, cs) for cs in g) else None)
        for g in take_groups(columns)
    ]


def component_takes(
    tables: list[Table],
    groups: list[list[tuple[tuple[ColumnSpec, ...], FixedReader | None]]],
    component: np.ndarray,
    moment: np.ndarray,
) -> list[Take]:
    """The row takes of these samples, per component in order: one per group of
    ``groups[c]`` (:func:`fixed_groups` of component ``c``'s table)."""
    out = []
    for c in np.unique(component):
        slots = np.flatnonzero(component == c)
        table, m = tables[int(c)], moment[slots]
        out += [Take(table, g, m, slots, f) for g, f in groups[int(c)]]
    return out


def cheap(take: Take) -> bool:
    """Whether ``take`` reads only memory (mapped pages, resident columns): less work than
    handing it to another thread. Chunked columns are not: rows whose chunks are not
    present are taken with Lance (a round trip)."""
    if take.fixed is None:
        return False
    return all(
        take.fixed.path(take.table, cs.column) in ("mapped", "resident") for cs in take.group
    )


def run_take(take: Take) -> Taken:
    """Run one take: the rows ``moment + offset`` of every column of the group, reshaped to
    ``[n, T, ...]`` (``[n, ...]`` for columns at the moment itself)."""
    table, group, moments = take.table, take.group, take.moments
    spec = group[0].spec
    offsets = np.asarray(spec.offsets if spec is not None else [0], np.int64)
    pad = None
    if spec is not None and spec.pad:
        grid, pad = padded_rows(table, moments, offsets)
        rows = grid.reshape(-1)
    else:
        rows = (moments[:, None] + offsets[None, :]).reshape(-1)
    if take.fixed is not None:
        got_fixed = take.fixed.read(table, rows, [cs.column for cs in group])
        shape = (len(moments), len(offsets)) if spec is not None else (len(moments),)
        arrays = [got_fixed[cs.column] for cs in group]
        arrays = [a.reshape((*shape, *a.shape[1:])) for a in arrays]
        return Taken(take, [pad_dims(a, cs) for a, cs in zip(arrays, group)], pad)
    uniq, inverse = np.unique(rows, return_inverse=True)
    got = table.take(uniq, [cs.column for cs in group])
    out: list[Any] = []
    same = len(uniq) == len(rows) and np.array_equal(uniq, rows)
    for cs in group:
        if cs.listed:
            out.append(listed_values(got.column(cs.column), inverse, same, spec, len(offsets)))
            continue
        values = to_numpy(
            got.column(cs.column), got.schema.field(cs.column), f"table {table.name!r}"
        )
        if not same:
            values = values[inverse]
        if spec is not None:
            values = values.reshape((len(moments), len(offsets), *values.shape[1:]))
        out.append(pad_dims(values, cs))
    return Taken(take, out, pad)


def pad_dims(values: np.ndarray, cs: ColumnSpec) -> np.ndarray:
    """``values`` with its last dimension zero-padded to ``cs.pad_to`` (``Component(pad_to=)``)."""
    if cs.pad_to is None or values.shape[-1] == cs.pad_to:
        return values
    out = np.zeros((*values.shape[:-1], cs.pad_to), values.dtype)
    out[..., : values.shape[-1]] = values
    return out


def _fixed(table: Table, cs: ColumnSpec) -> bool:
    return not cs.listed and fixed_width(table.schema.field(cs.column))


def write_taken(taken: list[Taken], out: dict[str, Any], b: int) -> None:
    """Write takes' results into ``out[name][slots]`` (arrays ``[b, ...]`` made on first
    write; Python lists of length ``b`` for listed columns), in order."""
    for t in taken:
        table, group, slots = t.take.table, t.take.group, t.take.slots
        for cs, arr in zip(group, t.arrays):
            if cs.listed:
                held = out.setdefault(cs.name, [None] * b)
                for s, v in zip(slots.tolist(), arr):
                    held[s] = v
                continue
            dest = out.get(cs.name)
            if dest is None:
                dest = out[cs.name] = np.empty((b, *arr.shape[1:]), arr.dtype)
            _check_shape(dest, arr, cs.column, table.name)
            dest[slots] = arr
        if t.pad is not None:  # after the shape checks: same window length everywhere
            for cs in group:
                out[f"{cs.name}{IS_PAD}"][slots] = t.pad


def _check_shape(dest: np.ndarray, arr: np.ndarray, column: str, table: str) -> None:
    if dest.shape[1:] != arr.shape[1:] or dest.dtype != arr.dtype:
        raise PlanError(
            f"column {column!r} of table {table!r} has rows of shape {arr.shape[1:]} "
            f"{arr.dtype}, other components give {dest.shape[1:]} {dest.dtype}"
        )

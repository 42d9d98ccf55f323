"""How the components of a plan stack into one batch: their names, the shapes their numeric
Rows columns deliver (after ``Component(pad_to=...)``), and the optional columns a
component's table lacks (``td.Rows(..., optional=True)``).

Pure: only the pinned schemas are read. :func:`stack_layout` is what the reader builds its
dimension masks, presence flags and zeros from; a component that cannot stack with the
others is a :class:`~treadle.errors.PlanError` naming both shapes when the plan is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.errors import PlanError
from treadle.plan.windows import Spec, Video, default_columns
from treadle.table.tensors import batch_kind, tensor_shape

if TYPE_CHECKING:
    from treadle.table.table import Table

DIM_MASK = "_dim_mask"
"""Suffix of the bool ``[b, size]`` column: True on a sample's real (unpadded) dimensions."""
IS_PRESENT = "_is_present"
"""Suffix of the bool ``[b]`` column: False where the sample's table lacks the column."""


def component_names(record: Any) -> list[str]:
    """Each component's name: the one given, else its table's name, made unique with
    ``-2``, ``-3``, ... (given names must differ from one another)."""
    given = [c.name for c in record.components if c.name is not None]
    twice = sorted({n for n in given if given.count(n) > 1})
    if twice:
        raise PlanError(f"component name {twice[0]!r} is given to more than one component")
    used, out = set(given), []
    for c in record.components:
        if c.name is not None:
            out.append(c.name)
            continue
        base = record.tables[c.table].name
        name, k = base, 2
        while name in used:
            name, k = f"{base}-{k}", k + 1
        used.add(name)
        out.append(name)
    return out


@dataclass(frozen=True)
class Placed:
    """One batch column of one component."""

    column: str  # the table's column
    spec: Spec | None  # None: at the moment itself (a component without windows)
    present: bool  # False: the table lacks it (an optional spec): zeros, ``_is_present`` False
    shape: tuple[int, ...] | None  # numeric rows: per-sample shape as delivered (after pad_to)
    dtype: str | None
    real: int | None  # numeric tensors: real size of the last dimension (before pad_to)
    row: tuple[int, ...] | None = None  # numeric: one row's shape as delivered (after pad_to)

    @property
    def padded(self) -> bool:
        """A tensor whose last dimension is zero-padded (a scalar has none: its last axis
        as delivered is the window's time axis)."""
        return self.real is not None and bool(self.row) and self.real != self.row[-1]


@dataclass(frozen=True)
class StackedColumn:
    """One batch column over every component: ``placed[c]`` per component."""

    name: str
    placed: tuple[Placed, ...]

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The delivered per-sample shape of a numeric rows column (None: video, lists)."""
        return next((p.shape for p in self.placed if p.present), None)

    @property
    def dtype(self) -> str | None:
        return next((p.dtype for p in self.placed if p.present), None)

    @property
    def masked(self) -> bool:
        """Some component pads it: the batch holds ``<name>_dim_mask``."""
        return any(p.present and p.padded for p in self.placed)

    @property
    def optional(self) -> bool:
        """Some component lacks it: the batch holds ``<name>_is_present``."""
        return not all(p.present for p in self.placed)


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def _placed(table: Table, col: str, spec: Spec | None, pad: int | None, where: str) -> Placed:
    if col not in table.schema.names:
        return Placed(col, spec, False, None, None, None)
    field = table.schema.field(col)
    kind = None if col in table.video_columns else batch_kind(field)
    if kind not in ("tensor", "scalar"):
        if pad is not None:
            raise PlanError(f"{where}: pad_to[{col!r}]: column {col!r} is not a numeric tensor")
        return Placed(col, spec, True, None, None, None)
    shape = tuple(tensor_shape(field) or ())
    real = shape[-1] if shape else None
    if pad is not None:
        if not shape:
            raise PlanError(f"{where}: pad_to[{col!r}]: column {col!r} is a scalar, not a tensor")
        if pad < shape[-1]:
            raise PlanError(
                f"{where}: pad_to[{col!r}]={pad} is smaller than the column's last dimension "
                f"{shape[-1]} (shape {shape})"
            )
        shape = (*shape[:-1], pad)
    t = () if spec is None else (len(spec.offsets or spec.seconds or ()),)
    dtype = np.dtype(_leaf(field.type).to_pandas_dtype()).str
    return Placed(col, spec, True, (*t, *shape), dtype, real, shape)


def stack_layout(record: Any, tables: Sequence[Table]) -> dict[str, StackedColumn]:
    """Every batch column (after rename) and how each component gives it; components that
    cannot stack (numeric shapes or dtypes that differ) are a :class:`PlanError`."""
    names = component_names(record)
    per: list[dict[str, Placed]] = []
    for i, c in enumerate(record.components):
        table = tables[c.table]
        where = f"component {i} ({names[i]!r}, table {table.name!r})"
        pads = dict(c.pad_to or ())
        rename = dict(c.rename or ())
        if c.windows is None or not c.windows.specs:
            items: list[tuple[str, Spec | None]] = [(n, None) for n in default_columns(table)]
        else:
            items = list(c.windows.items())
        unknown = sorted(set(pads) - {col for col, _ in items})
        if unknown:
            raise PlanError(
                f"{where}: pad_to names {unknown}, which it does not read (it reads "
                f"{sorted(col for col, _ in items)})"
            )
        per.append({rename.get(col, col): _placed(table, col, spec, pads.get(col), where)
                    for col, spec in items})  # fmt: skip
    out = {}
    for name in per[0]:
        if not all(name in p for p in per):
            continue  # components giving different names: the reader says which
        col = StackedColumn(name, tuple(p[name] for p in per))
        _check_column(col, names)
        out[name] = col
    return out


def _check_column(col: StackedColumn, names: list[str]) -> None:
    present = [i for i, p in enumerate(col.placed) if p.present]
    if not present:
        if all(isinstance(p.spec, Video) for p in col.placed):
            return  # zeros of the spec's size (check_windows asks for one): a robot alone
        raise PlanError(
            f"column {col.name!r} is optional in every component and no component's table has "
            "it: there is no shape to deliver (to evaluate one robot of a mix, give the mix: "
            "td.EvalLoader(plan, batch_size, only=<component name>))"
        )
    a = col.placed[present[0]]
    for i in present[1:]:
        b = col.placed[i]
        # one row's shape and dtype (window lengths: the reader's check, at loader start)
        if (a.row, a.dtype) != (b.row, b.dtype):
            hint = ""
            if a.row and b.row and len(a.row) == len(b.row) and a.dtype == b.dtype:
                big = max(a.row[-1], b.row[-1])
                hint = f"; give the smaller one Component(pad_to={{{b.column!r}: {big}}})"
            raise PlanError(
                f"column {col.name!r}: component {present[0]} ({names[present[0]]!r}) gives "
                f"rows of shape {a.row} {np.dtype(a.dtype or 'O')}, component {i} "
                f"({names[i]!r}) gives {b.row} {np.dtype(b.dtype or 'O')}: they cannot stack "
                f"into one batch{hint}"
            )
    for i, p in enumerate(col.placed):
        if not p.present and isinstance(p.spec, Video) is not isinstance(a.spec, Video):
            raise PlanError(
                f"column {col.name!r}: component {i} ({names[i]!r}) declares it "
                f"{type(p.spec).__name__}, the others read it as "
                f"{'video' if isinstance(a.spec, Video) else 'rows'}"
            )

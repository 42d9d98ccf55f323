"""What each component gives a batch: one :class:`ColumnSpec` per output column.

A component with windows gives its window columns (``Rows`` with a time axis, ``Video``
decoded windows); one without gives its columns at the moment itself
(:func:`moment_columns`: no time axis, a video column decoded to one frame). Every
component of a plan must give the same names (after ``Component(rename=...)``), so their
samples stack into one batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from treadle.errors import PlanError
from treadle.plan.image_columns import ImageColumn, image_column
from treadle.plan.stack import DIM_MASK, IS_PRESENT
from treadle.plan.windows import Rows, Video, Windows, batch_column_kind, default_columns
from treadle.read.rows import IS_PAD

if TYPE_CHECKING:
    from treadle.table.table import Table


@dataclass(frozen=True)
class ColumnSpec:
    """How one output column is made for one component."""

    column: str
    spec: Rows | Video | None  # None: the column at the moment itself, no time axis
    video: bool
    at_moment: bool = False  # a video frame at the moment itself: no time axis in the batch
    listed: bool = False  # strings, variable-length lists: a Python list per sample
    name: str = ""  # the batch's name for it (``Component(rename=...)``); "" = ``column``
    absent: bool = False  # the table lacks it (an optional spec): zeros, ``_is_present`` False
    pad_to: int | None = None  # numeric rows: the last dimension zero-padded to this size
    real: int | None = None  # numeric tensors: the real size of the last dimension
    zeros: tuple[tuple[int, ...], str] | None = None  # absent rows: per-sample shape, dtype
    image: ImageColumn | None = None  # a td.Video over a binary column of encoded images

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.column)


def output_columns(plan: Any) -> list[list[ColumnSpec]]:
    """Per component, the output columns; every component must give the same names."""
    per: list[list[ColumnSpec]] = []
    layout = plan.layout
    for c in range(plan.num_components):
        table = plan.table(c)
        windows: Windows | None = plan.windows(c)
        schema = table.schema
        specs: list[ColumnSpec] = []
        if windows is None or not windows.specs:
            specs = moment_columns(table)
        else:
            for col, spec in windows.items():
                if col not in schema.names:  # optional, and this table lacks it
                    specs.append(ColumnSpec(col, spec, isinstance(spec, Video), absent=True))
                    continue
                kind = batch_column_kind(table, schema.field(col))
                image = None
                if isinstance(spec, Video) and kind != "video":  # a binary column of images
                    image = image_column(table, col, spec, f"component {c}")
                video = kind == "video" or image is not None
                specs.append(ColumnSpec(col, spec, video, listed=kind == "list" and not video,
                                        image=image))  # fmt: skip
        rename = dict(plan.record.components[c].rename or ())
        if rename:
            specs = [dataclasses.replace(cs, name=rename.get(cs.column, cs.column)) for cs in specs]
        per.append([_stacked(cs, layout.get(cs.name), c) for cs in specs])
    names = [sorted(s.name for s in specs) for specs in per]
    for c, n in enumerate(names[1:], start=1):
        if n != names[0]:
            raise PlanError(
                f"components must give the same columns to stack a batch: component 0 gives "
                f"{names[0]}, component {c} gives {n}"
            )
    _check_stackable(per)
    return per


def _stacked(cs: ColumnSpec, col: Any, c: int) -> ColumnSpec:
    """``cs`` with what the plan's stack layout says of it for component ``c``."""
    if col is None:
        return cs
    p = col.placed[c]
    pad = p.row[-1] if p.present and p.padded and p.row else None
    zeros = None if p.present or col.shape is None else (col.shape, col.dtype)
    return dataclasses.replace(cs, pad_to=pad, real=p.real, zeros=zeros)


def _window_shape(cs: ColumnSpec) -> tuple[Any, ...] | None:
    """What a column's spec fixes of its batch shape and dtype (frame sizes and a table's
    own column shapes are checked as the rows arrive)."""
    spec = cs.spec
    if spec is None:
        return None
    t = len(spec.offsets if spec.offsets is not None else spec.seconds or ())
    if isinstance(spec, Video):
        return ("video", t, spec.layout, spec.dtype, cs.at_moment)
    return ("rows", t)


def _check_stackable(per: list[list[ColumnSpec]]) -> None:
    """Fail at plan time, not at the first batch that mixes them, on components whose
    windows of one column cannot stack (window length, video layout or dtype)."""
    first = {cs.name: cs for cs in per[0]}
    for c, specs in enumerate(per[1:], start=1):
        for cs in specs:
            a, b = _window_shape(first[cs.name]), _window_shape(cs)
            if a != b:
                raise PlanError(
                    f"column {cs.name!r}: component 0 gives windows {first[cs.name].spec}, "
                    f"component {c} gives {cs.spec}; their batches cannot stack (window "
                    "length, layout and dtype must agree)"
                )


def moment_columns(
    table: Table,
    columns: list[str] | None = None,
    sizes: Mapping[str, tuple[int, int]] | None = None,
) -> list[ColumnSpec]:
    """Columns at the moment itself (no time axis), video columns decoded to one frame
    (resized to ``sizes[column]``, ``(H, W)``, where given).

    ``columns=None`` means :func:`~treadle.plan.windows.default_columns`; a column a batch
    cannot hold is an error naming it, never left out silently.
    """
    wanted = default_columns(table) if columns is None else columns
    out = []
    for f in table.schema:
        if f.name not in wanted:
            continue
        kind = batch_column_kind(table, f)
        if kind == "video":
            size = (sizes or {}).get(f.name)
            out.append(ColumnSpec(f.name, Video([0], size=size), True, at_moment=True))
        else:
            out.append(ColumnSpec(f.name, None, False, listed=kind == "list"))
    return out


def camera_column(table: Table, column: str, spec: Video, where: str) -> ColumnSpec:
    """The column decoding ``column`` with ``spec``: a video column, or a binary column of
    images (:func:`~treadle.plan.image_columns.image_column`, errors naming ``where``)."""
    image = None if column in table.video_columns else image_column(table, column, spec, where)
    return ColumnSpec(column, spec, True, image=image)


def pad_columns(per: list[list[ColumnSpec]]) -> dict[str, int]:
    """``"<column>_is_pad"`` -> window length, for every column some component pads."""
    return {
        f"{cs.name}{IS_PAD}": len(cs.spec.offsets)
        for specs in per
        for cs in specs
        if cs.spec is not None and cs.spec.pad
    }


def mask_columns(per: list[list[ColumnSpec]]) -> dict[str, tuple[int, list[int]]]:
    """``"<column>_dim_mask"`` -> (size, real dimensions per component: 0 where absent), for
    every column some component pads."""
    out: dict[str, tuple[int, list[int]]] = {}
    for specs in per:
        for cs in specs:
            if cs.pad_to is not None:
                out[f"{cs.name}{DIM_MASK}"] = (cs.pad_to, [])
    for key, (size, real) in out.items():
        for specs in per:
            cs = next(s for s in specs if f"{s.name}{DIM_MASK}" == key)
            real.append(0 if cs.absent else size if cs.real is None else cs.real)
    return out


def present_columns(per: list[list[ColumnSpec]]) -> dict[str, list[bool]]:
    """``"<column>_is_present"`` -> presence per component, for every column some lacks."""
    names = {cs.name for specs in per for cs in specs if cs.absent}
    return {
        f"{n}{IS_PRESENT}": [not next(cs for cs in specs if cs.name == n).absent for specs in per]
        for n in sorted(names)
    }


def squeeze_moment_video(out: dict[str, Any], columns: list[ColumnSpec]) -> None:
    """Drop the length-1 time axis of video columns read at the moment itself."""
    for cs in columns:
        if cs.at_moment and cs.name in out and out[cs.name].ndim >= 2:
            out[cs.name] = out[cs.name][:, 0]

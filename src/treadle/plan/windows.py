"""Window specs: which frames or rows of a column a sample takes around its moment.

These are plain, hashable values with a canonical JSON form (they enter the run
record and therefore the run id). :func:`default_columns` and :func:`batch_column_kind`
say which columns a component reads and how a batch holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from treadle.errors import PlanError, TreadleError
from treadle.names import check_name
from treadle.table.episodes import EPISODE, FRAME
from treadle.table.tensors import batch_kind

_LAYOUTS = ("THWC", "TCHW")
_DTYPES = ("uint8", "float32", "float16", "bfloat16")
_MAX_OFFSET = 2**31 - 1  # frame offsets are int32 in the table; keeps every sum in int64


def _offsets(offsets: Iterable[int] | int, what: str) -> tuple[int, ...]:
    if isinstance(offsets, int):
        offsets = (offsets,)
    try:
        out = tuple(int(o) for o in offsets)
    except (TypeError, ValueError):
        raise PlanError(f"{what} offsets must be integers, got {offsets!r}") from None
    if any(isinstance(o, bool) for o in offsets):
        raise PlanError(f"{what} offsets must be integers, got booleans")
    if not out:
        raise PlanError(f"{what} offsets are empty")
    if any(abs(o) > _MAX_OFFSET for o in out):
        raise PlanError(f"{what} offsets must be within +-{_MAX_OFFSET:,} frames")
    if len(set(out)) != len(out):
        raise PlanError(f"{what} offsets repeat a value: {out[:10]}...")
    return out


def _offsets_json(offsets: tuple[int, ...]) -> Any:
    """Compact form: a contiguous ascending run is stored as [start, stop)."""
    if len(offsets) > 2 and offsets == tuple(range(offsets[0], offsets[-1] + 1)):
        return {"range": [offsets[0], offsets[-1] + 1]}
    return list(offsets)


def _offsets_from_json(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, dict):
        start, stop = value["range"]
        return _offsets(range(int(start), int(stop)), what)
    return _offsets(value, what)


@dataclass(frozen=True)
class Rows:
    """Take a (non-video) column at these offsets from the moment: ``Rows(range(-4, 1))``."""

    offsets: tuple[int, ...]

    def __init__(self, offsets: Iterable[int] | int):
        object.__setattr__(self, "offsets", _offsets(offsets, "Rows"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "rows", "offsets": _offsets_json(self.offsets)}


@dataclass(frozen=True)
class Video:
    """Decode frames of a video column at these offsets, with an optional transform.

    ``size=(H, W)`` resizes with FFmpeg's scaler in the decode pass; ``layout`` is
    ``"THWC"`` (default) or ``"TCHW"``; ``dtype`` is ``"uint8"`` (default) or a float
    type, in which case pixels are scaled to [0, 1] and then ``(x - mean) / std``
    per channel when ``mean``/``std`` are given.
    """

    offsets: tuple[int, ...]
    size: tuple[int, int] | None = None
    layout: str = "THWC"
    dtype: str = "uint8"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None

    def __init__(
        self,
        offsets: Iterable[int] | int,
        *,
        size: tuple[int, int] | None = None,
        layout: str = "THWC",
        dtype: str = "uint8",
        mean: Iterable[float] | None = None,
        std: Iterable[float] | None = None,
    ):
        object.__setattr__(self, "offsets", _offsets(offsets, "Video"))
        if size is not None:
            try:
                h, w = (int(v) for v in size)
            except (TypeError, ValueError):
                raise PlanError(f"Video size must be (height, width), got {size!r}") from None
            if h <= 0 or w <= 0 or h % 2 or w % 2:
                raise PlanError(f"Video size must be positive and even, got {size!r}")
            size = (h, w)
        if layout not in _LAYOUTS:
            raise PlanError(f"Video layout must be one of {_LAYOUTS}, got {layout!r}")
        if dtype not in _DTYPES:
            raise PlanError(f"Video dtype must be one of {_DTYPES}, got {dtype!r}")
        norm = []
        for name, v in (("mean", mean), ("std", std)):
            if v is None:
                norm.append(None)
                continue
            if dtype == "uint8":
                raise PlanError(f"Video {name} needs a float dtype")
            t = tuple(float(x) for x in v)
            if len(t) != 3 or (name == "std" and any(x <= 0 for x in t)):
                raise PlanError(f"Video {name} must be 3 numbers (std > 0), got {v!r}")
            norm.append(t)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "mean", norm[0])
        object.__setattr__(self, "std", norm[1])

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "video",
            "offsets": _offsets_json(self.offsets),
            "size": list(self.size) if self.size else None,
            "layout": self.layout,
            "dtype": self.dtype,
            "mean": list(self.mean) if self.mean else None,
            "std": list(self.std) if self.std else None,
        }


Spec = Rows | Video


def spec_from_json(value: Mapping[str, Any]) -> Spec:
    """Inverse of ``spec.to_json()``."""
    try:
        kind = value["kind"]
        if kind == "rows":
            return Rows(_offsets_from_json(value["offsets"], "Rows"))
        if kind == "video":
            return Video(
                _offsets_from_json(value["offsets"], "Video"),
                size=tuple(value["size"]) if value.get("size") else None,
                layout=value.get("layout", "THWC"),
                dtype=value.get("dtype", "uint8"),
                mean=value.get("mean"),
                std=value.get("std"),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"bad window spec {value!r}: {e}") from None
    raise PlanError(f"unknown window spec kind {value.get('kind')!r}")


@dataclass(frozen=True)
class Windows:
    """Map of column name -> :class:`Video` or :class:`Rows` spec."""

    specs: tuple[tuple[str, Spec], ...]

    def __init__(self, specs: Mapping[str, Spec] | None = None):
        if specs is None:
            specs = {}
        if not isinstance(specs, Mapping):
            raise PlanError(
                f"Windows takes a dict of column -> Video/Rows, got {type(specs).__name__}"
            )
        items = []
        for col, spec in specs.items():
            check_name(col, "column")
            if not isinstance(spec, (Rows, Video)):
                raise PlanError(
                    f"window for column {col!r} must be td.Video or td.Rows, got {spec!r}"
                )
            items.append((col, spec))
        object.__setattr__(self, "specs", tuple(sorted(items)))

    def __getitem__(self, col: str) -> Spec:
        return dict(self.specs)[col]

    def items(self) -> tuple[tuple[str, Spec], ...]:
        return self.specs

    def columns(self) -> list[str]:
        return [c for c, _ in self.specs]

    def span(self) -> tuple[int, int]:
        """(min offset, max offset) over every spec; (0, 0) when there are none."""
        if not self.specs:
            return (0, 0)
        lo = min(min(s.offsets) for _, s in self.specs)
        hi = max(max(s.offsets) for _, s in self.specs)
        return (min(lo, 0), max(hi, 0))

    def to_json(self) -> dict[str, Any]:
        return {col: spec.to_json() for col, spec in self.specs}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Windows:
        return cls({col: spec_from_json(v) for col, v in value.items()})


def default_columns(table: Any) -> list[str]:
    """The columns a component without windows reads: all but ``episode`` and ``frame``."""
    return [n for n in table.schema.names if n not in (EPISODE, FRAME)]


def batch_column_kind(table: Any, field: pa.Field) -> str:
    """How a batch holds a column it must hold (:func:`~treadle.table.tensors.batch_kind`);
    a :class:`PlanError` naming the table and the column when it cannot."""
    if field.name in table.video_columns:
        return "video"
    try:
        kind = batch_kind(field)
    except TreadleError as e:  # e.g. tensor shape metadata that does not fit the type
        raise PlanError(f"table {table.name!r}: {e}") from None
    if kind is None:
        raise PlanError(
            f"column {field.name!r} of table {table.name!r} is {field.type}, which a batch "
            "cannot hold (batches hold numbers, fixed-size tensors and video); name the "
            "columns to read with td.Windows (TrainLoader) or scan_request(columns)"
        )
    return kind

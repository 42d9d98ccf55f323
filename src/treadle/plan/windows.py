"""Window specs: which frames or rows of a column a sample takes around its moment.

These are plain, hashable values with a canonical JSON form (they enter the run
record and therefore the run id). :func:`default_columns` and :func:`batch_column_kind`
say which columns a component reads and how a batch holds them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import PlanError, VideoError
from treadle.names import check_name
from treadle.plan.column_kinds import batch_column_kind, default_columns
from treadle.table.off_grid import check_on_grid
from treadle.video.frame_spec import DTYPES, FrameSpec

__all__ = ["Rows", "Video", "Windows", "batch_column_kind", "default_columns", "spec_from_json"]

DEFAULT_TOLERANCE_S = 1e-4
_MAX_OFFSET = 2**31 - 1  # frame offsets are int32 in the table; keeps every sum in int64


def _offsets(offsets: Iterable[int] | int, what: str) -> tuple[int, ...]:
    if isinstance(offsets, (int, np.integer)) and not isinstance(offsets, bool):
        offsets = (offsets,)
    try:
        items = list(offsets)
    except TypeError:
        raise PlanError(f"{what} offsets must be integers, got {offsets!r}") from None
    if any(isinstance(o, (bool, np.bool_)) for o in items):
        raise PlanError(f"{what} offsets must be integers, got booleans")
    bad = [o for o in items if not isinstance(o, (int, np.integer))]
    if bad:  # a float is never truncated to a frame: seconds go in seconds=[...]
        raise PlanError(
            f"{what} offsets must be integer frame offsets, got {bad[0]!r}; give offsets in "
            "seconds as seconds=[...]"
        )
    out = tuple(int(o) for o in items)
    if not out:
        raise PlanError(f"{what} offsets are empty")
    if any(abs(o) > _MAX_OFFSET for o in out):
        raise PlanError(f"{what} offsets must be within +-{_MAX_OFFSET:,} frames")
    if len(set(out)) != len(out):
        raise PlanError(f"{what} offsets repeat a value: {out[:10]}...")
    return out


def _seconds(seconds: Iterable[float], what: str) -> tuple[float, ...]:
    try:
        out = tuple(float(t) for t in seconds)
    except (TypeError, ValueError):
        raise PlanError(f"{what} seconds must be numbers, got {seconds!r}") from None
    if not out:
        raise PlanError(f"{what} seconds are empty")
    if not all(math.isfinite(t) for t in out):
        raise PlanError(f"{what} seconds must be finite, got {out[:10]}")
    if len(set(out)) != len(out):
        raise PlanError(f"{what} seconds repeat a value: {out[:10]}")
    return out


def _tolerance(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise PlanError(f"{what} tolerance_s must be a number >= 0, got {value!r}")
    return float(value)


def frame_offsets(
    seconds: tuple[float, ...], fps: float | None, tolerance_s: float, where: str
) -> tuple[int, ...]:
    """Seconds -> frame offsets ``round(t * fps)``; a :class:`PlanError` naming ``where`` (the
    column), the value and the fps when a time is off the frame grid by more than
    ``tolerance_s``, or when the table has no fps."""
    if fps is None:
        raise PlanError(
            f"{where}: seconds={list(seconds)[:5]} need the table's fps, and it has none "
            "(write one with append_episode(..., fps=...)); give frame offsets instead"
        )
    out = []
    for t in seconds:
        f = round(t * fps)
        if abs(f / fps - t) > tolerance_s:
            raise PlanError(
                f"{where}: {t!r} s is not a frame time at {fps:g} fps (nearest frame {f} is at "
                f"{f / fps!r} s, more than tolerance_s={tolerance_s:g} away)"
            )
        out.append(int(f))
    return _offsets(out, where)


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


class _Timed:
    """Shared by :class:`Rows` and :class:`Video`: frame offsets or seconds, and padding."""

    offsets: tuple[int, ...]
    pad: bool
    seconds: tuple[float, ...] | None
    tolerance_s: float
    optional: bool

    def _init_time(self, offsets: Any, seconds: Any, pad: Any, tolerance_s: Any, what: str,
                   optional: Any = False) -> None:  # fmt: skip
        if (offsets is None) == (seconds is None):
            raise PlanError(f"{what} takes frame offsets or seconds=[...], exactly one of them")
        for flag, v in (("pad", pad), ("optional", optional)):
            if not isinstance(v, (bool, np.bool_)):
                raise PlanError(f"{what} {flag} must be True or False, got {v!r}")
        object.__setattr__(self, "offsets", None if offsets is None else _offsets(offsets, what))
        object.__setattr__(self, "seconds", None if seconds is None else _seconds(seconds, what))
        object.__setattr__(self, "pad", bool(pad))
        object.__setattr__(self, "tolerance_s", _tolerance(tolerance_s, what))
        object.__setattr__(self, "optional", bool(optional))

    def at_fps(self, fps: float | None, where: str) -> Any:
        """This spec with its seconds converted to frame offsets at ``fps`` (see
        :func:`frame_offsets`); a spec given in frames is returned as it is."""
        if self.seconds is None:
            return self
        out = copy.copy(self)
        offsets = frame_offsets(self.seconds, fps, self.tolerance_s, where)
        object.__setattr__(out, "offsets", offsets)
        return out

    def _time_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "offsets": None if self.offsets is None else _offsets_json(self.offsets)
        }
        if self.pad:
            out["pad"] = True
        if self.optional:  # written only when set: records without it keep their run ids
            out["optional"] = True
        if self.seconds is not None:
            out["seconds"] = list(self.seconds)
            if self.tolerance_s != DEFAULT_TOLERANCE_S:
                out["tolerance_s"] = self.tolerance_s
        return out


@dataclass(frozen=True)
class Rows(_Timed):
    """Take a (non-video) column at these offsets from the moment: ``Rows(range(-4, 1))``.

    ``seconds=[...]`` gives the offsets in seconds instead (converted with each table's fps
    at plan time, each within ``tolerance_s`` of a frame time). ``pad=True``: offsets outside
    the moment's episode take its nearest frame, the batch says where in
    ``"<column>_is_pad"``, and this spec does not limit which moments are eligible.
    ``optional=True``: a component whose table lacks the column delivers zeros of the plan's
    shape for it, and ``"<column>_is_present"`` (bool ``[b]``) says which samples have it.
    """

    offsets: tuple[int, ...]
    pad: bool = False
    seconds: tuple[float, ...] | None = None
    tolerance_s: float = DEFAULT_TOLERANCE_S
    optional: bool = False

    def __init__(
        self,
        offsets: Iterable[int] | int | None = None,
        *,
        pad: bool = False,
        seconds: Iterable[float] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        optional: bool = False,
    ):
        self._init_time(offsets, seconds, pad, tolerance_s, "Rows", optional)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "rows", **self._time_json()}


@dataclass(frozen=True)
class Video(_Timed):
    """Decode frames of a video column at these offsets, with an optional transform.

    ``size=(H, W)`` resizes with FFmpeg's scaler in the decode pass; ``layout`` is
    ``"THWC"`` (default) or ``"TCHW"``; ``dtype`` is ``"uint8"`` (default) or a float
    type, in which case pixels are scaled to [0, 1] and then ``(x - mean) / std``
    per channel when ``mean``/``std`` are given. ``seconds``, ``tolerance_s`` and ``pad``
    as for :class:`Rows` (padding repeats the decoded edge frame; nothing more is decoded).
    ``optional=True`` as for :class:`Rows`; where the table lacks the column, ``size=``.

    Over a binary column of encoded images (JPEG, PNG, WebP; one per moment) each frame is
    Pillow's decode converted to RGB, and ``size=`` is Pillow's bilinear resize.
    ``channels=1`` takes one channel: Pillow's grey (``convert("L")``), or a 16-bit PNG's
    own values (``uint16`` with the default dtype, the raw values as floats with a float
    dtype). Video columns are always ``channels=3``.
    """

    offsets: tuple[int, ...]
    size: tuple[int, int] | None = None
    layout: str = "THWC"
    dtype: str = "uint8"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    pad: bool = False
    seconds: tuple[float, ...] | None = None
    tolerance_s: float = DEFAULT_TOLERANCE_S
    optional: bool = False
    channels: int = 3

    def __init__(
        self,
        offsets: Iterable[int] | int | None = None,
        *,
        size: tuple[int, int] | None = None,
        layout: str = "THWC",
        dtype: str = "uint8",
        mean: Iterable[float] | None = None,
        std: Iterable[float] | None = None,
        pad: bool = False,
        seconds: Iterable[float] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        optional: bool = False,
        channels: int = 3,
    ):
        self._init_time(offsets, seconds, pad, tolerance_s, "Video", optional)
        if size is not None:
            try:
                h, w = (int(v) for v in size)
            except (TypeError, ValueError):
                raise PlanError(f"Video size must be (height, width), got {size!r}") from None
            if h <= 0 or w <= 0:  # even for video columns: checked by the plan
                raise PlanError(f"Video size must be positive, got {size!r}")
            size = (h, w)
        if dtype not in DTYPES:  # uint16 is a 16-bit image column's own type, not asked for
            raise PlanError(f"Video dtype must be one of {DTYPES}, got {dtype!r}")
        try:
            frame = FrameSpec(size, layout, dtype, mean, std, channels)
        except VideoError as e:
            raise PlanError(f"Video {e}") from None
        for name in ("size", "layout", "dtype", "mean", "std", "channels"):
            object.__setattr__(self, name, getattr(frame, name))
        object.__setattr__(self, "_frame", frame)  # not a field: eq, hash and repr as before

    @property
    def frame(self) -> FrameSpec:
        """What the decoded frames become (size, layout, dtype, normalisation)."""
        return self._frame

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "video",
            **self._time_json(),
            "size": list(self.size) if self.size else None,
            "layout": self.layout,
            "dtype": self.dtype,
            "mean": list(self.mean) if self.mean else None,
            "std": list(self.std) if self.std else None,
            **({"channels": self.channels} if self.channels != 3 else {}),  # run ids as before
        }


Spec = Rows | Video


def spec_from_json(value: Mapping[str, Any]) -> Spec:
    """Inverse of ``spec.to_json()``."""
    try:
        kind = value["kind"]
        what = {"rows": "Rows", "video": "Video"}.get(kind)
        if what is None:
            raise PlanError(f"unknown window spec kind {kind!r}")
        raw = value["offsets"]
        seconds = value.get("seconds")
        offsets = None if raw is None else _offsets_from_json(raw, what)
        time = {
            "pad": value.get("pad", False),
            "tolerance_s": value.get("tolerance_s", DEFAULT_TOLERANCE_S),
            "seconds": seconds,
            "optional": value.get("optional", False),
        }
        first = offsets if seconds is None else None
        if kind == "rows":
            spec: Spec = Rows(first, **time)
        else:
            spec = Video(
                first,
                size=tuple(value["size"]) if value.get("size") else None,
                layout=value.get("layout", "THWC"),
                dtype=value.get("dtype", "uint8"),
                mean=value.get("mean"),
                std=value.get("std"),
                channels=value.get("channels", 3),
                **time,
            )
        if seconds is not None and offsets is not None:  # converted at plan time
            object.__setattr__(spec, "offsets", offsets)
        return spec
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"bad window spec {value!r}: {e}") from None


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

    def span(self, *, padded: bool = True) -> tuple[int, int]:
        """(min offset, max offset) over every spec (``padded=False``: over the unpadded
        specs only, which are what limit eligibility), always including 0."""
        specs = [s for _, s in self.specs if padded or not s.pad]
        for s in specs:
            if s.offsets is None:
                raise PlanError("window offsets in seconds are not converted to frames yet")
        if not specs:
            return (0, 0)
        lo = min(min(s.offsets) for s in specs)
        hi = max(max(s.offsets) for s in specs)
        return (min(lo, 0), max(hi, 0))

    def eligible_span(self) -> tuple[int, int]:
        """:meth:`span` of the unpadded specs: a moment is eligible when it fits."""
        return self.span(padded=False)

    def at_fps(
        self, fps: float | None, where: str, off_grid: Mapping[str, Mapping[str, Any]] | None = None
    ) -> Windows:
        """These windows with offsets in seconds converted at ``fps`` (:func:`frame_offsets`).

        ``off_grid``: the table's video columns whose frames are not shown at ``k / fps``
        (:mod:`treadle.table.off_grid`); a :class:`Video` spec in seconds over one further
        off than its ``tolerance_s`` is a :class:`PlanError` naming the column, the episode
        and the deviation."""
        for c, s in self.specs:
            rec = (off_grid or {}).get(c)
            if isinstance(s, Video) and s.seconds is not None and rec is not None:
                check_on_grid(s.seconds, s.tolerance_s, rec, fps, f"{where}, column {c!r}")
        return Windows({c: s.at_fps(fps, f"{where}, column {c!r}") for c, s in self.specs})

    def to_json(self) -> dict[str, Any]:
        return {col: spec.to_json() for col, spec in self.specs}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Windows:
        return cls({col: spec_from_json(v) for col, v in value.items()})

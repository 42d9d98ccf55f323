"""``td.ColumnStats``: the statistics of one column, as ``table.stats`` and ``plan.stats``
give them, and in the form LeRobot's normalisers read (:meth:`ColumnStats.to_lerobot`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treadle.errors import PlanError

FIELDS = ("count", "mean", "std", "min", "max", "q01", "q99")
_INTEGERS = {f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)}


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column (arrays shaped like one row: ``()`` for scalars, the tensor
    shape for tensors, ``[T, *shape]`` for ``plan.stats(per_offset=True)``, ``(channels,)``
    for video). ``rank_error``: bound on the rank error of the quantiles, in values (0 =
    exact). ``source``: ``"treadle"`` (computed) or where imported values came from (e.g.
    ``"lerobot meta/stats.json"``). ``quantiles``: every quantile computed, ``{q: array}``
    (``q01``/``q99`` always). ``video``: pixel units, values 0..255 per channel before the
    spec's dtype, ``/ 255`` or ``mean``/``std`` (the repr says so). ``samples``: the
    rows or frames the statistics are over (``count`` counts values per element: pixels
    per channel for video). ``min``/``max`` of an integer column are in its dtype, exact
    (nanosecond timestamps past ``2**53`` included; float64 where an element has no
    values); the other fields are float64."""

    count: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    q01: np.ndarray
    q99: np.ndarray
    rank_error: int = 0
    source: str = "treadle"
    quantiles: dict[float, np.ndarray] = field(default_factory=dict, compare=False)
    video: bool = False
    samples: int | None = None

    def __repr__(self) -> str:
        """The fields, and for video the units: pixel values as stored, before the spec's
        dtype, ``/ 255`` and ``mean``/``std`` (normalise a float video with them once)."""
        units = "units='pixel values 0..255 per channel', " if self.video else ""
        shown = ", ".join(f"{k}={np.asarray(getattr(self, k))!r}" for k in FIELDS)
        extra = {q: v for q, v in self.quantiles.items() if q not in (0.01, 0.99)}
        return (f"ColumnStats({units}{shown}, quantiles={extra!r}, rank_error={self.rank_error}, "
                f"source={self.source!r}, samples={self.samples})")  # fmt: skip

    def quantile(self, q: float) -> np.ndarray:
        """The ``q`` quantile (one of those computed: ``plan.stats(quantiles=...)``)."""
        known = {0.01: self.q01, 0.99: self.q99, **self.quantiles}
        for k, v in known.items():
            if math.isclose(k, float(q), abs_tol=1e-12):
                return v
        raise PlanError(
            f"quantile {q!r} was not computed (computed: {sorted(known)}); ask "
            "plan.stats(..., quantiles=(...)) for it"
        )

    def to_lerobot(self) -> dict[str, np.ndarray]:
        """LeRobot's stats dict (``meta/stats.json``, ``dataset.meta.stats[key]``): ``mean``,
        ``std``, ``min``, ``max``, ``q01``/``q10``/``q50``/``q90``/``q99`` (those computed),
        and ``count`` as LeRobot counts it (``[samples]``: rows, or sampled frames). Video
        is in [0, 1], shaped ``(3, 1, 1)`` per channel, as LeRobot's image stats are
        (``(T, 3, 1, 1)`` per offset). An
        element without values (a dimension only ``pad_to`` gives) gets mean 0, std 1, min
        and low quantiles -1, max and high quantiles 1, q50 0: its padded zeros stay 0."""
        known = {0.01: self.q01, 0.99: self.q99, **self.quantiles}
        out: dict[str, np.ndarray] = {k: np.asarray(getattr(self, k), np.float64)
                                      for k in ("mean", "std", "min", "max")}  # fmt: skip
        for q, v in sorted(known.items()):
            pct = round(q * 100, 9)
            if pct == int(pct):  # LeRobot's keys: q01, q10, q50, ...
                out[f"q{int(pct):02d}"] = np.asarray(v, np.float64)
        if self.video:
            out = {k: (v / 255.0).reshape(*v.shape, 1, 1) for k, v in out.items()}
        else:
            _identity_where_empty(out, np.asarray(self.count) == 0)
        samples = self.samples if self.samples is not None else int(np.max(self.count))
        out["count"] = np.array([samples], np.int64)
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: np.asarray(getattr(self, k)).tolist() for k in FIELDS}
        out["quantiles"] = [[q, np.asarray(v).tolist()] for q, v in sorted(self.quantiles.items())]
        kind = np.asarray(self.min).dtype
        if kind.kind in "iu":
            out["extremes_dtype"] = kind.name
        return {**out, "rank_error": int(self.rank_error), "source": self.source,
                "video": self.video, "samples": self.samples}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ColumnStats:
        arrays = {k: np.asarray(d[k], np.int64 if k == "count" else np.float64) for k in FIELDS}
        ints = d.get("extremes_dtype")  # an integer column's min/max: exact in JSON
        if ints in _INTEGERS:
            arrays["min"], arrays["max"] = (
                np.asarray(d[k], np.dtype(ints)) for k in ("min", "max")
            )
        qs = {float(q): np.asarray(v, np.float64) for q, v in d.get("quantiles", [])}
        samples = d.get("samples")
        return cls(**arrays, rank_error=int(d.get("rank_error", 0)),
                   source=str(d.get("source", "treadle")), quantiles=qs,
                   video=bool(d.get("video", False)),
                   samples=None if samples is None else int(samples))  # fmt: skip


def _identity_where_empty(out: dict[str, np.ndarray], empty: np.ndarray) -> None:
    """Elements without values (dimensions only ``pad_to`` gives): statistics under which
    LeRobot's normalisers map 0 to 0 in every mode (mean 0, std 1; min, q < 0.5 at -1; max,
    q > 0.5 at 1; q50 at 0), not NaN, which turns the padded zeros into NaN."""
    if not empty.any():
        return
    for k, v in out.items():
        empty_k = np.broadcast_to(empty, v.shape)
        pct = int(k[1:]) if k.startswith("q") else None
        fill = {"mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0}.get(k)
        if fill is None:
            fill = -1.0 if pct < 50 else 0.0 if pct == 50 else 1.0  # type: ignore[operator]
        out[k] = np.where(empty_k, fill, v)

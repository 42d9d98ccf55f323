"""Derived values of ``plan.stats(derive={name: fn})``: ``fn`` runs on the batches of
every anchor of a component in table order (the batch as delivered, zeros for absent
columns, as numpy arrays). A value ``[b, D...]`` has no time axis; ``[b, T, D...]`` has one,
and so has ``[b, T]`` when a windowed scalar column ``fn`` reads is ``[b, T]`` (a ``[b, N]``
value whose ``N`` is also the last dimension of a tensor column it reads is refused: which
entries are padded cannot be said). Left out: entries padded in the ``*_is_pad`` of that
window length of a column ``fn`` reads, the samples whose table lacks a column it reads
(``*_is_present``), and the dimensions the ``*_dim_mask`` of its last size of the columns it
reads marks padded (real only where real in all of them). A value whose entries those
``*_is_pad`` cannot place (it slices or drops the time axis: ``b["action"][:, -1]``) has
``fn`` run again with the padded values NaN: entries NaN then are padded and left out; a
sample or entry mixing padded and real values is a :class:`~treadle.errors.PlanError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from treadle.errors import PlanError
from treadle.read.columns import ColumnSpec, output_columns
from treadle.stats.pooled import Part

_FLAGS = ("_is_pad", "_dim_mask", "_is_present")  # a column's delivery flags in a batch
Batches = Callable[[Any, int, list[ColumnSpec], np.ndarray], Iterator[dict]]


def derive_parts(
    plan: Any, c: int, derived: dict[str, Any], per_offset: bool, batches: Batches, budget: int
) -> dict[str, Part]:
    """Component ``c``'s part of each derived value: ``fn`` over the batches of every anchor
    (``batches(plan, c, specs, moments)``), sketches of ``budget`` items (module docstring)."""
    specs = [cs for cs in output_columns(plan)[c] if not cs.video]
    moments = plan.eligible_moments(c, np.arange(plan.eligible(c), dtype=np.int64))
    parts: dict[str, Part] = {}
    for batch in batches(plan, c, specs, moments):
        for name, fn in derived.items():
            seen = _Seen(batch)
            r = _numbers(name, fn(seen))
            flags = {k: v for k, v in batch.items()
                     for f in _FLAGS if k.endswith(f) and k[: -len(f)] in seen.read}  # fmt: skip
            axes = _axes(plan, c, seen.read)
            padded = _padded_entries(name, fn, batch, seen.read, r, _timed(r, axes))
            _add_derived(parts, name, {"_moment": batch["_moment"], **flags}, r, per_offset,
                         axes, budget, padded)  # fmt: skip
    return {n: p for n, p in parts.items() if any(mom.n for mom, _ in p.groups)}


def _numbers(name: str, value: Any) -> np.ndarray:
    """A derived value as float64: real numbers or booleans only (text is never parsed, and
    a complex value is refused rather than losing its imaginary part)."""
    r = np.asarray(value)
    if r.dtype.kind == "c":
        raise PlanError(
            f"plan.stats: derive {name!r} gave complex values ({r.dtype}); statistics are of "
            "real numbers: return .real, .imag or abs() of them"
        )
    if r.dtype.kind in "biuf":
        return r.astype(np.float64, copy=False)
    try:
        if r.dtype.kind != "O":
            raise TypeError(r.dtype)
        return r.astype(np.float64)  # Python numbers in an object array
    except (TypeError, ValueError):
        raise PlanError(
            f"plan.stats: derive {name!r} gave {r.dtype} values, not numbers (an array of "
            f"real numbers [b, ...] is needed), e.g. {r.ravel()[:3].tolist()!r:.80}"
        ) from None


def _timed(r: np.ndarray, axes: tuple[set[int], set[int]]) -> bool:
    """Whether a derived value ``r`` has a time axis (its second)."""
    return r.ndim >= 3 or (r.ndim == 2 and r.shape[1] in axes[0])


def _padded_entries(
    name: str, fn: Any, batch: dict, read: set[str], r: np.ndarray, timed: bool
) -> np.ndarray | None:
    """Which samples (``[b]``) or window entries (``[b, T]``) of ``r`` come from padded
    values, when the ``*_is_pad`` of the columns read cannot say it (a value that slices or
    drops the time axis: ``b["action"][:, -1]``); None when they can, or nothing read is
    padded. Found by running ``fn`` again with the padded values NaN: an entry NaN then and
    not before is padded. A sample or entry only partly so is a :class:`PlanError`."""
    pads = {k: np.asarray(batch[f"{k}_is_pad"], np.bool_) for k in read
            if f"{k}_is_pad" in batch and np.asarray(batch[f"{k}_is_pad"]).any()}  # fmt: skip
    if not pads or (timed and all(p.shape == r.shape[:2] for p in pads.values())):
        return None
    poisoned = dict(batch)
    for k, p in pads.items():
        v = np.array(batch[k], np.float64)
        v[p] = np.nan
        poisoned[k] = v
    try:
        again = np.asarray(fn(_Seen(poisoned)), np.float64)
    except Exception as e:  # a function that cannot take NaN: named below
        again = e
    if not isinstance(again, np.ndarray) or again.shape != r.shape:
        raise PlanError(
            f"plan.stats: derive {name!r} reads padded values of {sorted(pads)} and gives "
            f"{r.shape}, whose padded entries cannot be told ({again!r:.80} with the padded "
            "values NaN); return the whole window ([b, T, ...]) or read unpadded windows"
        )
    entry = np.isnan(again) & ~np.isnan(r)
    unit = entry.reshape(*entry.shape[: 2 if timed else 1], -1)
    some, every = unit.any(axis=-1), unit.all(axis=-1)
    if (some & ~every).any():
        raise PlanError(
            f"plan.stats: derive {name!r} mixes padded and real values of {sorted(pads)} "
            f"within one {'window entry' if timed else 'sample'} of its {r.shape} value; "
            "keep them in separate entries, or read unpadded windows"
        )
    return every


def _axes(plan: Any, c: int, read: set[str]) -> tuple[set[int], set[int]]:
    """Window lengths of the windowed scalar columns read (their ``[b, T]``), and the last
    dimensions of the tensor columns read."""
    cols = [(plan.layout[k].placed[c].spec is not None, plan.layout[k].shape or ())
            for k in read if k in plan.layout]  # fmt: skip
    steps = {shape[0] for timed, shape in cols if timed and len(shape) == 1}
    return steps, {shape[-1] for timed, shape in cols if len(shape) > timed}


class _Seen(dict):
    """A batch that records which columns a derive function reads: only their padding,
    dimension masks and presence decide what enters its statistics."""

    def __init__(self, batch: dict):
        super().__init__(batch)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def _add_derived(parts: dict[str, Part], name: str, batch: dict, r: np.ndarray,
                 per_offset: bool, axes: tuple[set[int], set[int]], budget: int,
                 padded: np.ndarray | None = None) -> None:  # fmt: skip
    b = len(batch["_moment"])
    if r.ndim < 1 or r.shape[0] != b:
        raise PlanError(f"plan.stats: derive {name!r} gave shape {r.shape}, not [{b}, ...]")
    # [b, T] is a time axis of scalars when a windowed scalar column it reads is [b, T]
    timed = _timed(r, axes)
    if r.ndim == 2 and r.shape[1] in axes[0] and r.shape[1] in axes[1]:
        raise PlanError(
            f"plan.stats: derive {name!r} gave {r.shape}: {r.shape[1]} is a window "
            "length and a dimension of columns it reads; give [b, T, 1] or [b, 1, D]"
        )
    keep = np.ones(r.shape[:2] if timed else (b,), np.bool_) if padded is None else ~padded
    for k, v in batch.items():
        v = np.asarray(v)
        if padded is None and timed and k.endswith("_is_pad") and v.shape == r.shape[:2]:
            keep &= ~v
        if k.endswith("_is_present"):
            keep &= v[:, None] if timed else v
    size = r.shape[-1] if r.ndim >= (3 if timed else 2) else None
    real = [int(np.asarray(v)[0].sum()) for k, v in batch.items()
            if k.endswith("_dim_mask") and np.asarray(v).shape[-1] == size]  # fmt: skip
    shape = r.shape[2:] if timed else r.shape[1:]
    if name not in parts:
        groups = r.shape[1] if timed and per_offset else 1
        parts[name] = Part.new(shape, min(real) if real else None, groups, budget)
        parts[name].per_offset = timed and per_offset
    part = parts[name]
    if part.shape != shape or (timed and per_offset and len(part.groups) != r.shape[1]):
        raise PlanError(f"plan.stats: derive {name!r} gave {r.shape} after {part.shape}")
    cut = lambda x: x[..., : min(real)] if real else x  # noqa: E731  (real in every column)
    part.anchors += int((keep.any(axis=1) if timed else keep).sum())
    if timed and per_offset:
        for g in range(r.shape[1]):
            x = cut(r[:, g][keep[:, g]])
            part.add(g, x.reshape(len(x), math.prod(x.shape[1:])))
    else:
        x = cut(r[keep])
        part.add(0, x.reshape(len(x), math.prod(x.shape[1:])))

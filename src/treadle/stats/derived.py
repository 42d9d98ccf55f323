"""Derived values of ``plan.stats(derive={name: fn})``: ``fn`` runs on the batches of
every anchor of a component in table order (the batch as delivered, zeros for absent
columns, as numpy arrays). A value ``[b, D...]`` has no time axis; ``[b, T, D...]`` has one,
and so has ``[b, T]`` when a windowed scalar column ``fn`` reads is ``[b, T]`` (a ``[b, N]``
value whose ``N`` is also the last dimension of a tensor column it reads is refused: which
entries are padded cannot be said). Left out: entries padded in the ``*_is_pad`` of that
window length of a column ``fn`` reads, the samples whose table lacks a column it reads
(``*_is_present``), and the dimensions the ``*_dim_mask`` of its last size of the columns it
reads marks padded (real only where real in all of them).
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
            r = np.asarray(fn(seen), np.float64)
            flags = {k: v for k, v in batch.items()
                     for f in _FLAGS if k.endswith(f) and k[: -len(f)] in seen.read}  # fmt: skip
            _add_derived(parts, name, {"_moment": batch["_moment"], **flags}, r, per_offset,
                         _axes(plan, c, seen.read), budget)  # fmt: skip
    return {n: p for n, p in parts.items() if any(mom.n for mom, _ in p.groups)}


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
                 per_offset: bool, axes: tuple[set[int], set[int]], budget: int) -> None:  # fmt: skip
    b = len(batch["_moment"])
    if r.ndim < 1 or r.shape[0] != b:
        raise PlanError(f"plan.stats: derive {name!r} gave shape {r.shape}, not [{b}, ...]")
    # [b, T] is a time axis of scalars when a windowed scalar column it reads is [b, T]
    timed = r.ndim >= 3 or (r.ndim == 2 and r.shape[1] in axes[0])
    if r.ndim == 2 and r.shape[1] in axes[0] and r.shape[1] in axes[1]:
        raise PlanError(
            f"plan.stats: derive {name!r} gave {r.shape}: {r.shape[1]} is a window "
            "length and a dimension of columns it reads; give [b, T, 1] or [b, 1, D]"
        )
    keep = np.ones(r.shape[:2] if timed else (b,), np.bool_)
    for k, v in batch.items():
        v = np.asarray(v)
        if timed and k.endswith("_is_pad") and v.shape == r.shape[:2]:
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

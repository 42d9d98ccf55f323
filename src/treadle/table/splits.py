"""Episode-level splits (train / val / ...) by a keyed hash of each episode's name."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from treadle.errors import PlanError

if TYPE_CHECKING:
    from treadle.table.table import Table

_SCALE = float(2**64)


def _unit(name: str, seed: int) -> float:
    """A uniform number in [0, 1) from (seed, name) alone: BLAKE2b keyed by the seed."""
    key = seed.to_bytes(8, "little")
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little") / _SCALE


def split_episodes(
    table: Table, fractions: Mapping[str, float], seed: int = 0
) -> dict[str, list[str]]:
    """Split a table's episodes: ``{"train": 0.9, "val": 0.1}`` -> ``{"train": [...], ...}``.

    Each episode goes to a split by a keyed hash of its name and ``seed`` only, so the split
    is deterministic and an episode never changes split when others are added. Fractions
    are positive and normalised by their sum; every split is in the result (names in table
    order), possibly empty. Pass a split to ``td.Component(..., episodes=split["val"])``.
    """
    if not isinstance(fractions, Mapping) or not fractions:
        raise PlanError(f"split_episodes needs a dict of split name -> fraction, got {fractions!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise PlanError(f"split_episodes seed must be an integer in 0..2**64-1, got {seed!r}")
    names, weights = [], []
    for split, f in fractions.items():
        if not isinstance(split, str) or not split:
            raise PlanError(f"split names must be non-empty strings, got {split!r}")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise PlanError(f"fraction of split {split!r} must be positive, got {f!r}")
        names.append(split)
        weights.append(float(f))
    total = sum(weights)
    bounds, acc = [], 0.0
    for w in weights:
        acc += w / total
        bounds.append(acc)
    out: dict[str, list[str]] = {n: [] for n in names}
    pinned = table.pin() if callable(getattr(table, "pin", None)) else table
    if not pinned.is_time_indexed:
        raise PlanError(
            f"table {pinned.name!r} has no episodes (no episode/frame columns) to split; "
            "split a table of plain rows with td.Component(..., where=...) instead"
        )
    episodes = pinned.episodes()
    for ep in episodes.names:
        u = _unit(ep, seed)
        k = next((i for i, b in enumerate(bounds) if u < b), len(names) - 1)
        out[names[k]].append(ep)
    return out

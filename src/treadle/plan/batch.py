"""What one step gives one rank (:class:`Batch`), and the integer check of plan arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import PlanError


@dataclass(frozen=True)
class Batch:
    """The samples of one step for one rank, in slot order (all arrays int64, length B/W)."""

    step: int
    rank: int
    world_size: int
    component: np.ndarray
    """Index into the recipe's components."""
    moment: np.ndarray
    """Row of the anchor moment in that component's pinned table."""
    position: np.ndarray
    """Global sample position ``step * batch_size + slot``."""
    draw: np.ndarray
    """Index of the draw within its component (epoch = draw // eligible)."""

    def __len__(self) -> int:
        return len(self.moment)


def as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PlanError(f"{what} must be an integer, got {value!r}")
    return int(value)


def check_rank(rank: Any, world_size: Any, batch_size: int) -> tuple[int, int]:
    """``(rank, world_size)`` as integers, or a :class:`PlanError` saying what is wrong:
    ``world_size`` must divide the batch (every rank reads as many samples)."""
    world_size = as_int(world_size, "world_size")
    rank = as_int(rank, "rank")
    if world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size}")
    if batch_size % world_size:
        raise PlanError(
            f"batch_size {batch_size} is not divisible by world_size {world_size}: "
            f"every rank must read the same number of samples"
        )
    if not 0 <= rank < world_size:
        raise PlanError(f"rank must be in 0..{world_size - 1}, got {rank}")
    return rank, world_size

"""What :meth:`treadle.plan.plan.Plan.stats` computes with.

Statistics read tables, which the pure plan never does: the package root
(``treadle/__init__.py``) wires the read layer's ``plan_stats`` here, as it wires
``Table.stats``, so ``plan/`` imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

StatsFunction = Callable[..., dict[str, Any]]
_STATS: StatsFunction  # set by ``import treadle``, which runs before any ``treadle.*`` module


def compute_stats_with(fn: StatsFunction) -> None:
    """Set what ``Plan.stats`` computes with (``treadle.stats.plan_stats.plan_stats``)."""
    global _STATS
    _STATS = fn


def compute() -> StatsFunction:
    """The wired function."""
    return _STATS

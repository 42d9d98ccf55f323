"""The next use of a chunk by **any** rank of a node: Belady's policy across the ranks that
share a cache folder.

Every process of a node shares one chunk cache (:mod:`treadle.storage.chunkstore`), so the
chunk to evict is the one the *node* needs farthest in the future. A rank's lookahead knows
its own next steps only; the plan, though, is pure: rank ``r`` of ``W`` reads slots ``r,
r+W, ...`` of every global batch, and the ranks of a node are ``node * R .. node * R + R - 1``
(``R`` ranks per node, numbered node by node as torchrun does: ``LOCAL_WORLD_SIZE``). So what
every rank of the node reads at step ``s`` is a function of (run record, ``s``), and so is
the next step after ``s`` at which any of them needs a chunk (:class:`NodeNextUse`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np

from treadle.errors import PlanError

__all__ = ["NEVER", "NodeNextUse", "node_batch", "node_ranks", "node_slots"]

NEVER = 1 << 62
"""The next use of a key no step in the horizon needs (the chunk store's ``NEVER``)."""


def node_ranks(rank: int, world_size: int, ranks_per_node: int) -> range:
    """The ranks on the node of ``rank`` (ranks numbered node by node)."""
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise PlanError(
            f"ranks per node must be at least 1 and divide the world size {world_size}, "
            f"got {ranks_per_node}"
        )
    if not 0 <= rank < world_size:
        raise PlanError(f"rank {rank} is not in 0..{world_size - 1}")
    first = rank // ranks_per_node * ranks_per_node
    return range(first, first + ranks_per_node)


def node_slots(batch_size: int, world_size: int, ranks: Iterable[int]) -> list[np.ndarray]:
    """The slots of a global batch each of ``ranks`` reads (rank ``r``: ``r, r+W, ...``)."""
    return [np.arange(r, batch_size, world_size) for r in ranks]


def node_batch(plan: Any, step: int, rank: int, world_size: int,
               ranks_per_node: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``(component, moment)`` of every sample the ranks of ``rank``'s node read at ``step``,
    rank by rank (each rank's as ``plan.batch(step, rank, world_size)`` gives them)."""
    whole = plan.batch(step)
    slots = np.concatenate(node_slots(plan.batch_size, world_size,
                                      node_ranks(rank, world_size, ranks_per_node)))  # fmt: skip
    return whole.component[slots], whole.moment[slots]


class NodeNextUse:
    """``next_use(key, step)``: the first step after ``step``, within ``horizon`` steps, at
    which any rank of ``rank``'s node reads a sample that ``keys`` maps to ``key`` (``keys``:
    ``(component, moment)`` arrays -> the keys they need, e.g. chunk ids), before ``stop``
    (the run's end); else :data:`NEVER`.
    Each step's keys are computed once and kept while in the window."""

    def __init__(self, plan: Any, rank: int, world_size: int, ranks_per_node: int,
                 keys: Callable[[np.ndarray, np.ndarray], Iterable[Hashable]],
                 horizon: int, stop: int | None = None) -> None:  # fmt: skip
        node_ranks(rank, world_size, ranks_per_node)  # validates
        if horizon < 0:
            raise PlanError(f"horizon must be >= 0 steps, got {horizon}")
        self.plan, self.rank, self.world_size = plan, rank, world_size
        self.ranks_per_node, self.keys, self.horizon = ranks_per_node, keys, horizon
        self.stop = stop  # the run's end: no step from it on is read (None: none)
        self._steps: OrderedDict[int, frozenset[Hashable]] = OrderedDict()

    def uses(self, step: int) -> frozenset[Hashable]:
        """The keys the node's ranks need at ``step``."""
        got = self._steps.get(step)
        if got is None:
            comp, moment = node_batch(self.plan, step, self.rank, self.world_size,
                                      self.ranks_per_node)  # fmt: skip
            got = self._steps[step] = frozenset(self.keys(comp, moment))
            while len(self._steps) > 2 * (self.horizon + 1):
                self._steps.popitem(last=False)
        return got

    def next_use(self, key: Hashable, step: int) -> int:
        end = step + 1 + self.horizon  # past the run: uses not read (their footers neither)
        for s in range(step + 1, end if self.stop is None else min(end, self.stop)):
            if key in self.uses(s):
                return s
        return NEVER

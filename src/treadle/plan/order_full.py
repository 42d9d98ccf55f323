"""The full permutation: a component's draws walk a fresh keyed bijection of all its eligible
moments each epoch (the default shuffle, ``treadle.plan/1`` and ``/2``).

Draw ``j`` of component ``c`` (``N`` eligible moments) is in epoch ``e = j div N`` at index
``i = j mod N``, and takes eligible index ``perm_{c,e}(i)``: a Feistel bijection of ``[0, N)``
with cycle walking (:mod:`treadle.plan.permute`) keyed by ``mix64(base_c + e * GOLDEN)``,
``base_c = derive_key(DRAW_DOMAIN, seed, c)``. Every eligible moment appears once per epoch,
anywhere in it: consecutive draws land anywhere in the table.

Every shuffle module has the same shape (:mod:`treadle.plan.order_block` is the other): a class
built from ``(seed, eligible counts, its parameters)`` whose ``eligible(comp, epoch, index)``
maps arrays of draws to eligible indices, and a pure one-draw function of
``(seed, component, epoch, index, eligible, ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from treadle.plan.permute import DRAW_DOMAIN, Domain, Domains, derive_key, epoch_keys, permute


class FullOrder:
    """Every component's draws over a full permutation per epoch (vectorised)."""

    partitions = 1

    def __init__(self, seed: int, eligible: Sequence[int]):
        self._domains = Domains([Domain.of(int(n)) for n in eligible])
        self._base = np.asarray(
            [derive_key(DRAW_DOMAIN, seed, c) for c in range(len(eligible))], dtype=np.uint64
        )

    def eligible(self, comp: np.ndarray, epoch: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Eligible index (int64) of each draw: component, epoch and index within the epoch."""
        key = epoch_keys(self._base[comp], epoch)
        return permute(index.astype(np.uint64), comp, self._domains, key).astype(np.int64)

    def partition(self, comp: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The partition of each draw: always 0 (one partition)."""
        return np.zeros(np.shape(index), dtype=np.int64)


def full_index(seed: int, component: int, epoch: int, index: int, eligible: int) -> int:
    """The eligible index of one draw (pure): ``perm_{component, epoch}(index)``."""
    counts = [1] * component + [eligible]
    order = FullOrder(seed, counts)
    one = np.asarray([component], np.int64)
    return int(order.eligible(one, np.asarray([epoch]), np.asarray([index]))[0])

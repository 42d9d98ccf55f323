"""Which item of a global batch sits in which slot.

With one partition (every run without ``BlockShuffle(partitions=P > 1)``), slot ``t`` holds
item ``pi_s(t)``, a Feistel bijection of ``[0, B)`` keyed by (seed, step): :mod:`treadle.plan.plan`.

With ``P`` partitions, slot ``t`` belongs to class ``t mod P``, and an item (a draw) to the
partition its block shuffle gives it (:meth:`~treadle.plan.order_block.BlockOrder.partition`).
:func:`arrange` puts the items of partition ``p`` into the slots of class ``p``, as many as
there are of both, each side in the order of a keyed hash (``mix64`` of the step key and the
item or slot number); the items left over (a partition with more items than its class has
slots this batch) fill the slots left over, in the same hashed orders. A batch is then the same
at any rank count (it depends on the step alone), and rank ``r`` of ``W`` reads slots
``r, r+W, ...``: when ``W`` divides ``P`` those are classes ``p = r mod W`` only, so every
rank, and so every node, reads only its own partitions, except for the leftover items.

Why the rank count and not the node count: ranks are strided over slots and numbered node by
node (``rank = node * R + local``), so a node's slots are ``{t : (t mod W) div R = node}``. No
slot-to-partition map can give every node one partition at both ``R = 1`` and ``R = 2``
ranks per node (slots 0 and 1 are on different nodes at ``R = 1`` and on one at ``R = 2``), so
locality needs the map to know ``W``; ``t mod P`` with ``W | P`` is the one that does not.

Cost: O(B log B) per step for the whole batch (a rank's slots need the whole arrangement).

:func:`slot_draws` gives the (component, draw) at a rank's slots of a step: the schedule's
canonical order (component 0's draws of the step, then component 1's, ...) arranged as above.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treadle.plan.permute import Domains, epoch_key_int, mix64, permute

_ITEMS = np.uint64(0x6A09E667F3BCC909)
_SLOTS = np.uint64(0xBB67AE8584CAA73B)


def arrange(partition: np.ndarray, partitions: int, key: int) -> np.ndarray:
    """``item_of_slot``: for each slot ``t`` of the batch, the item it holds; ``partition[u]``
    is item ``u``'s partition."""
    part = np.asarray(partition, np.int64)
    size = part.size
    u = np.arange(size, dtype=np.uint64)
    k = np.uint64(key)
    with np.errstate(over="ignore"):
        item_rank = mix64(u ^ mix64(k ^ _ITEMS))
        slot_rank = mix64(u ^ mix64(k ^ _SLOTS))
    cls = np.arange(size, dtype=np.int64) % partitions
    items = np.lexsort((item_rank, part))  # by partition, then hashed order
    slots = np.lexsort((slot_rank, cls))
    n_items = np.bincount(part, minlength=partitions)
    n_slots = np.bincount(cls, minlength=partitions)
    # each item's and slot's place within its group
    item_place = np.arange(size) - np.repeat(np.cumsum(n_items) - n_items, n_items)
    slot_place = np.arange(size) - np.repeat(np.cumsum(n_slots) - n_slots, n_slots)
    matched = np.minimum(n_items, n_slots)
    item_ok = item_place < matched[part[items]]
    slot_ok = slot_place < matched[cls[slots]]
    out = np.empty(size, np.int64)
    out[slots[slot_ok]] = items[item_ok]  # both sorted by group, then place: pairs align
    out[slots[~slot_ok]] = items[~item_ok]
    return out


def slot_draws(schedule: Any, order: Any, eligible: np.ndarray, slot_domain: Domains,
               slot_base: int, steps: list[int], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(component, draw index within it) of the items at ``slots`` of each of ``steps``'
    global batches, step after step: ``schedule``'s counts in canonical order, put into slots
    by ``order``'s partitions (:func:`arrange`) or the Feistel bijection of ``slot_domain``
    keyed by (``slot_base``, step); ``eligible``: each component's eligible moments."""
    keys = [epoch_key_int(slot_base, step) for step in steps]
    counts = np.asarray([schedule.counts(step) for step in steps], np.int64)  # (steps, comps)
    ends = np.cumsum(counts, axis=1)
    first = np.asarray([schedule.cumulative(step) for step in steps], np.int64)
    if order.partitions > 1:  # slot t reads partition t mod P where it can
        items = np.stack([_arranged(order, eligible, c, f, k)[slots]
                          for c, f, k in zip(counts, first, keys)])  # fmt: skip
    else:  # one pass for every step: each element keyed by its step
        n = len(slots)
        key = np.repeat(np.asarray(keys, np.uint64), n)
        items = permute(np.tile(slots.astype(np.uint64), len(steps)), 0, slot_domain, key)
        items = items.astype(np.int64).reshape(len(steps), n)
    comp = (items[:, :, None] >= ends[:, None, :]).sum(axis=2)  # searchsorted, side right
    row = np.arange(len(steps))[:, None]
    draw = first[row, comp] + items - (ends - counts)[row, comp]
    return comp.reshape(-1), draw.reshape(-1)


def _arranged(order: Any, eligible: np.ndarray, counts: np.ndarray, first: np.ndarray,
              key: int) -> np.ndarray:  # fmt: skip
    """:func:`arrange` of one step's global batch (``counts``, ``first``: per component)."""
    ends = np.cumsum(counts)
    every = np.arange(int(ends[-1]), dtype=np.int64)
    c_all = np.searchsorted(ends, every, side="right")
    d_all = first[c_all] + (every - (ends - counts)[c_all])
    part = order.partition(c_all, d_all % eligible[c_all])
    return arrange(part, order.partitions, key)

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
"""

from __future__ import annotations

import numpy as np

from treadle.plan.permute import mix64

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

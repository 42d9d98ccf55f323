"""Reused video batch buffers (:mod:`treadle.read.buffers`): a buffer comes back only when
nothing outside the pool can see it, and a loader's batches are the same as with fresh
buffers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import make_project, recipe
from treadle.read.buffers import BufferPool

SHAPE = (2, 3, 4, 4, 3)


def test_a_buffer_is_reused_only_when_nothing_refers_to_it():
    pool = BufferPool(max_buffers=4)
    a = pool.empty(SHAPE, np.uint8)
    ptr = a.ctypes.data
    del a
    b = pool.empty(SHAPE, np.uint8)
    assert b.ctypes.data == ptr  # dropped: reused (fails with a fresh buffer per batch)
    holders = [
        lambda x: x[1],  # a numpy view
        lambda x: x[:, 0][..., 1],  # a view of a view
        lambda x: torch.from_numpy(x),  # what the loader hands out
        lambda x: torch.from_numpy(x)[0].permute(0, 3, 1, 2),  # a tensor view
        lambda x: torch.from_numpy(x).numpy(),  # numpy of that tensor
        lambda x: memoryview(x),
    ]
    for hold in holders:
        kept = hold(b)
        del b
        c = pool.empty(SHAPE, np.uint8)
        assert c.ctypes.data != ptr, hold  # still visible through `kept`: a fresh one
        del c, kept
        b = pool.empty(SHAPE, np.uint8)
        assert b.ctypes.data == ptr
    other = pool.empty((1, *SHAPE[1:]), np.uint8)
    assert other.shape == (1, *SHAPE[1:]) and other.ctypes.data != ptr
    assert pool.empty(SHAPE, np.float32).dtype == np.float32


def test_a_full_pool_replaces_an_unused_buffer_of_another_shape():
    pool = BufferPool(max_buffers=1)
    a = pool.empty(SHAPE, np.uint8)
    held = pool.empty(SHAPE, np.uint8)  # a is held: a fresh one, not kept (no room)
    assert held.ctypes.data != a.ctypes.data
    del a
    b = pool.empty((1, 2), np.uint8)  # the unused buffer of another shape goes
    del b
    assert pool.empty((1, 2), np.uint8).shape == (1, 2)
    assert len(pool._items) == 1


def test_held_batches_keep_their_values_and_batches_equal_fresh_reads(tmp_path):
    branch = make_project(str(tmp_path), episodes=2, frames=24)
    steps = 12
    kept = list(td.TrainLoader(recipe(branch, batch_size=4), steps=steps, workers=0))
    frozen = [b["cam"].clone() for b in kept]
    # the same steps again, each batch dropped before the next: buffers are reused
    loader = td.TrainLoader(recipe(branch, batch_size=4), steps=steps, workers=0)
    for s, b in enumerate(loader):
        assert torch.equal(b["cam"], frozen[s]), s
        del b
    for s, b in enumerate(kept):  # held all along: never written again
        assert torch.equal(b["cam"], frozen[s]), s


def _thp_eligible(array: np.ndarray) -> str | None:
    """The ``THPeligible`` field (/proc/self/smaps) of the mapping at the first 2 MiB
    boundary inside ``array`` (numpy madvises the huge-page-aligned part only)."""
    huge = 2 << 20
    address = (array.ctypes.data + huge - 1) // huge * huge
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "THPeligible:":
                return line.split()[1]
    return None


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    or "[madvise]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read(),
    reason="needs Linux with transparent huge pages in madvise mode",
)
def test_large_batch_buffers_are_not_madvised_for_huge_pages():
    """numpy madvises arrays of 4 MiB and more for huge pages; on the development VM a
    loader's fresh huge pages halved the rate of 1 run in 5 (steal time), none in 24 runs
    without. Large pooled buffers are private maps of ordinary pages; small ones are
    numpy's; views still count as references."""
    pool = BufferPool()
    big = pool.empty((8, 24, 128, 128, 3), np.uint8)  # 9.4 MB
    big[...] = 1  # fault it in
    assert _thp_eligible(big) == "0"
    # what numpy's allocation gets here; 64 MiB, above glibc's largest mmap threshold, so it
    # is a fresh map numpy madvises (a smaller one may come from a heap chunk: '0' in a CI run)
    plain = np.empty(64 << 20, np.uint8)
    plain[...] = 1
    assert _thp_eligible(plain) == "1"
    small = pool.empty((4, 16), np.float32)
    assert small.base is None
    shape, addr = big.shape, big.ctypes.data
    view = big[3]
    del big
    other = pool.empty(shape, np.uint8)
    assert other.ctypes.data != addr  # the view holds the first
    del view
    assert pool.empty(shape, np.uint8).ctypes.data == addr

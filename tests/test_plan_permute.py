"""The keyed Feistel bijection: a permutation of [0, n) for every n and key, vectorised = the
slow scalar reference (``plan_helpers.ref_permute``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plan_helpers import ref_permute
from treadle.plan.permute import Domain, Domains, permute


def perm(n, key):
    x = np.arange(n, dtype=np.uint64)
    return permute(x, 0, Domains([Domain.of(n)]), np.uint64(key))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**64 - 1))
def test_every_small_domain_is_permuted(n, key):
    y = perm(n, key)
    assert y.dtype == np.uint64
    assert np.array_equal(np.sort(y), np.arange(n, dtype=np.uint64))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 2**62), min_size=1, max_size=5),
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
        min_size=1,
        max_size=40,
    ),
)
def test_vectorised_matches_the_scalar_reference_across_mixed_domains(ns, items):
    domains = Domains([Domain.of(n) for n in ns])
    which = np.asarray([i % len(ns) for i, _, _ in items])
    x = np.asarray([x % ns[i % len(ns)] for i, x, _ in items], dtype=np.uint64)
    keys = np.asarray([k for _, _, k in items], dtype=np.uint64)
    got = permute(x, which, domains, keys).tolist()
    for g, w, xi, k in zip(got, which.tolist(), x.tolist(), keys.tolist()):
        n = ns[w]
        assert g < n
        assert g == ref_permute(xi, n, k)


def test_large_domain_is_injective_on_a_sample():
    n = 10**12 + 39
    x = np.arange(0, n, n // 100_000, dtype=np.uint64)[:100_000]
    y = permute(x, 0, Domains([Domain.of(n)]), np.uint64(12345))
    assert np.all(y < n) and len(np.unique(y)) == len(x)
    # Neighbours land far apart: no visible structure.
    assert np.median(np.abs(np.diff(y.astype(np.float64)))) > n / 10


def test_keys_give_different_orders_and_positions_are_roughly_uniform():
    n, keys = 8, 4000
    firsts = np.asarray([int(perm(n, k * 0x9E3779B97F4A7C15 % 2**64)[0]) for k in range(keys)])
    counts = np.bincount(firsts, minlength=n)
    assert counts.min() > 380 and counts.max() < 620, counts  # expected 500 each
    orders = {tuple(perm(n, k).tolist()) for k in range(200)}
    assert len(orders) > 190


def test_domain_of_one_and_two():
    assert perm(1, 7).tolist() == [0]
    assert sorted(perm(2, 7).tolist()) == [0, 1]
    assert {tuple(perm(2, k).tolist()) for k in range(50)} == {(0, 1), (1, 0)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 2**40), min_size=1, max_size=4), st.integers(0, 2**64 - 1))
def test_walk_tail_on_python_ints_gives_the_numpy_walk(ns, seed):
    """The last few cycle-walking elements finish on Python ints: the same values as
    walking every element with numpy to the end (the plan's batches do not change)."""
    import treadle.plan.permute as pm

    rng = np.random.default_rng(seed % 2**32)
    domains = Domains([Domain.of(n) for n in ns])
    which = rng.integers(0, len(ns), 64)
    x = np.asarray([int(rng.integers(0, ns[w])) for w in which], dtype=np.uint64)
    keys = rng.integers(0, 2**63, 64).astype(np.uint64)
    tail = permute(x, which, domains, keys)
    old, pm._WALK_TAIL = pm._WALK_TAIL, 0
    try:
        numpy_only = permute(x, which, domains, keys)
    finally:
        pm._WALK_TAIL = old
    assert np.array_equal(tail, numpy_only)

"""Keyed bijections on ``[0, n)``: an unbalanced Feistel network with cycle walking, vectorised.

A permutation is never materialised: ``permute(x, domain, key)`` maps each index on its own.
The network works on ``bits`` bits, the smallest power of two ``>= n`` (at least 4 values), split
into a left part of ``bits // 2`` bits and a right part of the rest. Each round maps
``(L, R) -> (R, L xor F(R))``, swapping the parts' widths; after an even number of rounds the
layout is back where it started, and every round is invertible, so the whole is a bijection
of ``[0, 2**bits)``. An output ``>= n`` is fed back through the network until it lands in
``[0, n)`` (cycle walking), which keeps the map a bijection of ``[0, n)``; since
``2**bits < 2n``, that takes fewer than two passes on average.

The round function is a multiply-xorshift-multiply hash of ``R xor round_key`` whose top bits
are kept. Everything is ``uint64`` with wrap-around arithmetic. Keys are 64-bit words from a
splitmix64 mixer over (domain, seed, parts). The exact arithmetic is part of the plan
algorithm (``treadle.plan/1``): changing it changes every run's batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUNDS = 6
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
# Per-round key tweaks (fractional digits of pi); a round key is key xor tweak.
TWEAKS = (
    0x243F6A8885A308D3,
    0x13198A2E03707344,
    0xA4093822299F31D0,
    0x082EFA98EC4E6C89,
    0x452821E638D01377,
    0xBE5466CF34E90C6C,
)

# Domain tags keep the slot shuffle and the per-component draws independent of each other.
SLOT_DOMAIN = 0x736C6F74  # "slot"
DRAW_DOMAIN = 0x64726177  # "draw"

_M1, _M2, _GOLDEN = np.uint64(M1), np.uint64(M2), np.uint64(GOLDEN)
_S27, _S30, _S31, _S32 = (np.uint64(s) for s in (27, 30, 31, 32))
_TWEAKS = [np.uint64(t) for t in TWEAKS]
# Cycle walking: once this few elements are left, they finish on Python ints (a numpy pass
# costs its ~50 calls whatever the size; a Python pass a few microseconds per element).
_WALK_TAIL = 12


def mix64_int(z: int) -> int:
    """splitmix64 finaliser on a Python int (a bijection on 64-bit words)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a ``uint64`` array."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def derive_key(domain: int, seed: int, *parts: int) -> int:
    """A 64-bit key from (domain, seed, parts...), all non-negative ints below 2**64."""
    h = mix64_int((domain << 32) + GOLDEN)
    h = mix64_int(h ^ seed)
    for p in parts:
        h = mix64_int(h ^ mix64_int(p + GOLDEN))
    return h


def epoch_keys(base: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    """Keys of (component, epoch) pairs: ``mix64(base[c] + epoch * GOLDEN)`` (arrays)."""
    with np.errstate(over="ignore"):
        return mix64(base + epoch.astype(np.uint64) * _GOLDEN)


def epoch_key_int(base: int, epoch: int) -> int:
    """:func:`epoch_keys` for one pair, on Python ints."""
    return mix64_int(base + epoch * GOLDEN)


@dataclass(frozen=True)
class Domain:
    """Feistel layout for ``[0, n)``: ``n``, and the left/right widths in bits."""

    n: int
    left: int
    right: int

    @classmethod
    def of(cls, n: int) -> Domain:
        if n < 1:
            raise ValueError(f"domain size must be >= 1, got {n}")
        bits = max(2, (n - 1).bit_length())
        return cls(n, bits // 2, bits - bits // 2)


class Domains:
    """Per-element Feistel layouts as ``uint64`` arrays, gathered from a few distinct domains."""

    def __init__(self, domains: list[Domain]):
        self.n = np.asarray([d.n for d in domains], dtype=np.uint64)
        self.left = np.asarray([d.left for d in domains], dtype=np.uint64)
        self.right = np.asarray([d.right for d in domains], dtype=np.uint64)
        self.shift_left = np.uint64(64) - self.left  # F output for a left-width part
        self.shift_right = np.uint64(64) - self.right
        self.mask_right = (np.uint64(1) << self.right) - np.uint64(1)


def _encrypt(x, key, left, right, shl, shr, mask_r):
    lo = x & mask_r  # right part: `right` bits
    hi = x >> right  # left part: `left` bits
    # Round i: (hi, lo) -> (lo, hi ^ F(lo)); hi is `left` bits on even rounds, `right` on odd.
    for i in range(ROUNDS):
        t = (lo ^ (key ^ _TWEAKS[i])) * _M1
        t = (t ^ (t >> _S32)) * _M2
        hi, lo = lo, hi ^ (t >> (shl if i % 2 == 0 else shr))
    return (hi << right) | lo


def permute(
    x: np.ndarray, which: np.ndarray | int, domains: Domains, key: np.ndarray
) -> np.ndarray:
    """Apply the keyed bijection of domain ``domains[which]`` to every ``x`` (``uint64``).

    ``which`` selects each element's domain (an index array, or one index for all); ``key`` is
    one ``uint64`` per element (or one for all). ``x < n`` is assumed.
    """
    x = np.asarray(x, dtype=np.uint64)
    shape = x.shape
    which = np.broadcast_to(np.asarray(which, dtype=np.intp), shape)
    key = np.broadcast_to(np.asarray(key, dtype=np.uint64), shape)
    n = domains.n[which]
    parts = (
        domains.left[which],
        domains.right[which],
        domains.shift_left[which],
        domains.shift_right[which],
        domains.mask_right[which],
    )
    with np.errstate(over="ignore"):
        y = _encrypt(x, key, *parts)
        idx = np.flatnonzero(y >= n)
        while idx.size > _WALK_TAIL:
            z = _encrypt(y[idx], key[idx], *(p[idx] for p in parts))
            y[idx] = z
            idx = idx[z >= n[idx]]
    if idx.size:
        left, right = parts[0][idx].tolist(), parts[1][idx].tolist()
        args = zip(y[idx].tolist(), key[idx].tolist(), n[idx].tolist(), left, right)
        y[idx] = [_walk_int(*a) for a in args]
    return y


def _walk_int(y: int, key: int, n: int, left: int, right: int) -> int:
    """Cycle walking of one element on Python ints, the same arithmetic as
    :func:`_encrypt` (wrap-around at 64 bits), until it lands in ``[0, n)``."""
    mask_r = (1 << right) - 1
    while y >= n:
        lo, hi = y & mask_r, y >> right
        for i in range(ROUNDS):
            t = ((lo ^ key ^ TWEAKS[i]) * M1) & MASK64
            t = ((t ^ (t >> 32)) * M2) & MASK64
            hi, lo = lo, hi ^ (t >> (64 - (left if i % 2 == 0 else right)))
        y = (hi << right) | lo
    return y


def domains_of_sizes(n: np.ndarray) -> Domains:
    """:class:`Domains` of one Feistel layout per element of ``n`` (each ``>= 1``), built
    vectorised (a block shuffle's segments each have their own size)."""
    n = np.asarray(n, dtype=np.int64)
    # frexp's exponent of (n - 1) is its bit length (exact below 2**53), 0 for 0
    bits = np.maximum(np.frexp((n - 1).astype(np.float64))[1], 2).astype(np.uint64)
    out = Domains.__new__(Domains)
    out.n = n.astype(np.uint64)
    out.left = bits // np.uint64(2)
    out.right = bits - out.left
    out.shift_left = np.uint64(64) - out.left
    out.shift_right = np.uint64(64) - out.right
    out.mask_right = (np.uint64(1) << out.right) - np.uint64(1)
    return out

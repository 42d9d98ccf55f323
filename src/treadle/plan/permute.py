"""Keyed bijections on ``[0, n)``: a balanced Feistel network with cycle walking, vectorised.

A permutation is never materialised: ``permute(x, n, half_bits, key)`` maps each index on its
own. The network works on ``2*h`` bits (``4**h >= n``, so fewer than 4 tries per index on
average); an output ``>= n`` is fed back through the network until it lands in ``[0, n)``
(cycle walking), which keeps the map a bijection on ``[0, n)``. Everything is ``uint64`` with
wrap-around arithmetic; keys come from a splitmix64-style mixer over (domain, seed, parts).
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_ROUND_CONST = [
    np.uint64((0x9E3779B97F4A7C15 * (i + 1)) & 0xFFFFFFFFFFFFFFFF) for i in range(ROUNDS)
]

# Domain tags keep the slot shuffle and the per-component draws independent of each other.
SLOT_DOMAIN = 0x736C6F74  # "slot"
DRAW_DOMAIN = 0x64726177  # "draw"


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a ``uint64`` array (a bijection on 64-bit words)."""
    z = z ^ (z >> _S30)
    z = z * _M1
    z = z ^ (z >> _S27)
    z = z * _M2
    return z ^ (z >> _S31)


def derive_key(domain: int, seed: int, *parts: np.ndarray | int) -> np.ndarray:
    """A 64-bit key from (domain, seed, parts...); parts may be arrays (broadcast)."""
    with np.errstate(over="ignore"):
        h = mix64(np.asarray([(domain << 32) ^ 0x7472656164], dtype=np.uint64) + _GOLDEN)
        h = mix64(h ^ np.uint64(seed))
        for p in parts:
            h = mix64(h ^ mix64(np.asarray(p, dtype=np.uint64) + _GOLDEN))
    return h


def half_bits(n: int) -> int:
    """Half-width ``h`` of the Feistel network for domain size ``n`` (``4**h >= n``)."""
    if n < 1:
        raise ValueError(f"domain size must be >= 1, got {n}")
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _encrypt(x: np.ndarray, h: np.ndarray, mask: np.ndarray, rk: np.ndarray) -> np.ndarray:
    left = x >> h
    right = x & mask
    for i in range(ROUNDS):
        left, right = right, left ^ (mix64(right ^ rk[i]) & mask)
    return (left << h) | right


def permute(x: np.ndarray, n: np.ndarray, h: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Apply the keyed bijection of ``[0, n)`` to every ``x`` (all arrays broadcast, ``uint64``).

    ``h`` must be ``half_bits(n)`` for each element; ``x < n`` is assumed.
    """
    x, n, h, key = np.broadcast_arrays(
        np.asarray(x, dtype=np.uint64),
        np.asarray(n, dtype=np.uint64),
        np.asarray(h, dtype=np.uint64),
        np.asarray(key, dtype=np.uint64),
    )
    with np.errstate(over="ignore"):
        mask = (np.uint64(1) << h) - np.uint64(1)
        rk = np.stack([mix64(key + c) for c in _ROUND_CONST])
        y = _encrypt(x, h, mask, rk)
        out = y >= n
        if out.any():
            y = y.copy()
            idx = np.flatnonzero(out)
            while idx.size:
                z = _encrypt(y[idx], h[idx], mask[idx], rk[:, idx])
                y[idx] = z
                idx = idx[z >= n[idx]]
    return y

"""Fake pinned tables and slow, independent reference implementations for the plan tests.

The references use Python integers and Fractions, one sample at a time, and the textbook
definitions (PD2 group deadlines by their definition, not the closed form the planner uses).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor, gcd
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from treadle.stats.plan_stats import plan_stats

MASK64 = (1 << 64) - 1


class FakeTable:
    """Just the attributes of a pinned ``Table`` that the planner reads."""

    def __init__(
        self,
        name,
        lengths,
        *,
        version=1,
        commit="c0ffee" + "0" * 58,
        project="robotics",
        columns=("action",),
        video=(),
    ):
        self.name = name
        self.version = version
        self.commit_id = commit
        # a plan's statistics are asked of its first table's project (TableSource.plan_stats)
        self.project = SimpleNamespace(name=project, plan_stats=plan_stats)
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self.num_moments = int(self._lengths.sum())
        self.schema = pa.schema(
            [(c, pa.float32()) for c in columns]
            + [(v, pa.struct([("pts", pa.int64())])) for v in video]
        )
        self.video_columns = list(video)
        self.episode_calls = 0

    def purged(self, fresh=False):
        return {}

    def episodes(self):
        self.episode_calls += 1
        return SimpleNamespace(
            names=[f"ep{i}" for i in range(len(self._lengths))],
            starts=self._starts.copy(),
            lengths=self._lengths.copy(),
        )


class FakeRef:
    """A branch-relative table reference: ``pin()`` returns the current fake table."""

    def __init__(self, table, branch="main"):
        self.table = table
        self.name = table.name
        self.branch = SimpleNamespace(name=branch, project=table.project)
        self.pins = 0

    def pin(self):
        self.pins += 1
        return self.table


class FakeClient:
    """``client.project(p, create=False).table_at(name, version)`` over fake tables."""

    def __init__(self, tables):
        self.tables = {(t.project.name, t.name, t.version): t for t in tables}

    def project(self, name, create=True):
        client = self

        class _P:
            def table_at(self, table, version, commit_id=None):
                return client.tables[(name, table, version)]

        return _P()


# --- PD2, by the definitions ----------------------------------------------------------------


def ref_window(k, w):
    """Release and deadline of subtask k (1-based) of a task of weight w (Fraction)."""
    return floor(Fraction(k - 1) / w), ceil(Fraction(k) / w)


def ref_bbit(k, w):
    return ceil(Fraction(k) / w) - floor(Fraction(k) / w)


def ref_group_deadline(k, w):
    """Earliest t >= d(T_k) with t = d(T_j), b(T_j) = 0, or t + 1 = d(T_j), |w(T_j)| = 3, j >= k."""
    if w < Fraction(1, 2):
        return 0
    d_k = ref_window(k, w)[1]
    j = k
    while True:
        r, d = ref_window(j, w)
        if d >= d_k and ref_bbit(j, w) == 0:
            return d
        if d - 1 >= d_k and d - r == 3:
            return d - 1
        j += 1


def ref_extra(numerators, denominator, batch_size, steps):
    """Extra seats per step (list of lists), simulated step by step with Fractions."""
    w = [
        Fraction(n * batch_size, denominator) - floor(Fraction(n * batch_size, denominator))
        for n in numerators
    ]
    seats = sum(w)
    assert seats.denominator == 1
    done = [0] * len(w)
    cur = {}  # subtask parameters of each task's next subtask, computed once per subtask

    def subtask(c):
        k = done[c] + 1
        r, d = ref_window(k, w[c])
        return r, (d, -ref_bbit(k, w[c]), -ref_group_deadline(k, w[c]), c)

    for c, wc in enumerate(w):
        if wc:
            cur[c] = subtask(c)
    out = []
    for t in range(steps):
        ready = sorted(key for r, key in cur.values() if r <= t)
        row = [0] * len(w)
        for key in ready[: int(seats)]:
            c = key[3]
            row[c] = 1
            done[c] += 1
            cur[c] = subtask(c)
        out.append(row)
    return out


def ref_period(numerators, denominator, batch_size):
    p = 1
    for n in numerators:
        q = Fraction(n * batch_size % denominator, denominator).denominator
        p = p * q // gcd(p, q)
    return p


def ref_cumulative(numerators, denominator, batch_size, step, extra_period):
    """N_c(step) from the simulated period (extended periodically)."""
    period = len(extra_period)
    full, rest = divmod(step, period)
    out = []
    for c, n in enumerate(numerators):
        q = n * batch_size // denominator
        per = sum(row[c] for row in extra_period)
        out.append(q * step + full * per + sum(row[c] for row in extra_period[:rest]))
    return out


# --- Feistel, one integer at a time ---------------------------------------------------------


def ref_mix64(z):
    z &= MASK64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


GOLDEN = 0x9E3779B97F4A7C15
SLOT_DOMAIN = 0x736C6F74
DRAW_DOMAIN = 0x64726177
TWEAKS = [
    0x243F6A8885A308D3,
    0x13198A2E03707344,
    0xA4093822299F31D0,
    0x082EFA98EC4E6C89,
    0x452821E638D01377,
    0xBE5466CF34E90C6C,
]


def ref_key(domain, seed, *parts):
    h = ref_mix64((domain << 32) + GOLDEN)
    h = ref_mix64(h ^ seed)
    for p in parts:
        h = ref_mix64(h ^ ref_mix64(p + GOLDEN))
    return h


def ref_epoch_key(domain, seed, part, epoch):
    """Key of (part, epoch): the base key of (domain, seed[, part]) stepped by epoch."""
    base = ref_key(domain, seed) if part is None else ref_key(domain, seed, part)
    return ref_mix64(base + epoch * GOLDEN)


def ref_permute(x, n, key, rounds=6):
    """Unbalanced Feistel on the smallest power of two >= n (>= 4), with cycle walking."""
    bits = max(2, (n - 1).bit_length())
    widths = [bits // 2, bits - bits // 2]  # left part, right part
    while True:
        left, right = x >> widths[1], x % (1 << widths[1])
        for i in range(rounds):
            t = (((right ^ key ^ TWEAKS[i]) & MASK64) * 0xBF58476D1CE4E5B9) & MASK64
            t = ((t ^ (t >> 32)) * 0x94D049BB133111EB) & MASK64
            f = t >> (64 - widths[i % 2])  # as wide as the part it is xored into
            left, right = right, left ^ f
        x = left * (1 << widths[1]) + right
        if x < n:
            return x


def ref_moment(lengths, starts, span, eligible_index):
    """Walk the episodes to the eligible_index-th eligible moment."""
    lo, hi = span
    for length, start in zip(lengths, starts):
        count = max(0, int(length) - (hi - lo))
        if eligible_index < count:
            return int(start) + (-lo) + eligible_index
        eligible_index -= count
    raise AssertionError("eligible index out of range")


def ref_batch(record, episodes, step, extra_period, rank=0, world_size=1):
    """(component, moment, position) lists for one rank, computed one sample at a time."""
    b = record.batch_size
    nums = [c.weight_quantised for c in record.components]
    cum = ref_cumulative(nums, record.weight_denominator, b, step, extra_period)
    row = extra_period[step % len(extra_period)]
    items = []
    for c, n in enumerate(nums):
        k = n * b // record.weight_denominator + row[c]
        items.extend((c, cum[c] + i) for i in range(k))
    assert len(items) == b
    slot_key = ref_epoch_key(SLOT_DOMAIN, record.seed, None, step)
    out = []
    for slot in range(rank, b, world_size):
        c, j = items[ref_permute(slot, b, slot_key)]
        comp = record.components[c]
        n = comp.eligible
        epoch, idx = divmod(j, n)
        e = ref_permute(idx, n, ref_epoch_key(DRAW_DOMAIN, record.seed, c, epoch))
        ep = episodes[comp.table]
        span = (0, 0) if comp.windows is None else comp.windows.span()
        out.append((c, ref_moment(ep.lengths, ep.starts, span, e), step * b + slot))
    return out

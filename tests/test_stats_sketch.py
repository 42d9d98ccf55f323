"""The quantile sketch beyond its exact size (stats/moments.py): a stated rank error that
holds against numpy, at a memory bound independent of the number of values."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
import treadle.stats.plan_stats as planstats
from treadle.stats.moments import FULL_LEVELS, Sketch, capacity, rank_error_bound


def _held(sk: Sketch) -> int:
    return sum(sk.sizes)


def _true_rank_distance(col: np.ndarray, v: float, target: float) -> float:
    """How far ``target`` lies outside the ranks ``v`` occupies in the sorted ``col``."""
    lo, hi = np.searchsorted(col, v, "left"), np.searchsorted(col, v, "right")
    return 0.0 if lo <= target <= hi else min(abs(lo - target), abs(hi - target))


def test_many_levels_hold_the_stated_rank_error_and_the_memory_bound():
    """k = 512 over 300,000 values (about 9 levels, well past FULL_LEVELS, so the level
    capacity shrank): never more than 2k * FULL_LEVELS items held after an add; every
    quantile within rank_error of numpy's answer; one sketch and four merged alike."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((300_000, 2)) ** 3 * [1.0, 1e4]
    budget = 2 * 512  # k = 512 per element
    one, parts = Sketch(2, budget), [Sketch(2, budget) for _ in range(4)]
    bound = 2 * one.k * FULL_LEVELS
    for i, chunk in enumerate(np.array_split(x, 600)):
        one.add(chunk)
        parts[i % 4].add(chunk)
        assert _held(one) <= bound, (i, one.sizes)
    merged = parts[0]
    for p in parts[1:]:
        merged.merge(p)
    assert _held(merged) <= bound
    for sk in (one, merged):
        assert sk.n == len(x) and sk.compacted_levels > FULL_LEVELS
        err = sk.rank_error()
        assert err == rank_error_bound(sk.n, sk.k, sk.compacted_levels)
        assert 0 < err < 0.25 * len(x)  # a meaningful bound, not a vacuous one
        qs = np.linspace(0, 1, 41)
        worst = 0.0
        for q, got in zip(qs, sk.quantiles(qs)):
            for e in range(2):
                col = np.sort(x[:, e])
                target = q * (len(x) - 1)  # the rank numpy's np.quantile interpolates at
                d = _true_rank_distance(col, got[e], target)
                worst = max(worst, d)
                assert d <= err + 1, (q, e, d, err)
        assert worst < err  # the bound is met, and the sketch is not degenerate


def test_capacity_shrinks_only_past_full_levels():
    k = 1000
    assert [capacity(k, n) for n in range(1, FULL_LEVELS + 1)] == [2 * k] * FULL_LEVELS
    caps = [capacity(k, n) for n in range(FULL_LEVELS + 1, 40)]
    assert all(c % 2 == 0 and c * n <= 2 * k * FULL_LEVELS
               for c, n in zip(caps, range(FULL_LEVELS + 1, 40)))  # fmt: skip
    assert caps == sorted(caps, reverse=True)


def test_exact_below_the_exact_size():
    """Fewer than 2k values: nothing compacted, numpy's quantiles exactly."""
    x = np.random.default_rng(1).standard_normal((2 * 64 - 1, 3))
    sk = Sketch(3, 3 * 64)
    for part in np.array_split(x, 5):
        sk.add(part)
    assert sk.compacted_levels == 0 and sk.rank_error() == 0
    for q, got in zip((0.01, 0.5, 0.99), sk.quantiles((0.01, 0.5, 0.99))):
        np.testing.assert_array_equal(got, np.quantile(x, q, axis=0))


@pytest.mark.parametrize("per_offset", [False, True])
def test_plan_stats_past_full_levels_within_rank_error_of_numpy(tmp_path, monkeypatch, per_offset):
    """plan.stats of a 3-offset window over 40,000 rows with k = 64 (many levels): each
    quantile's true weighted rank is within ``rank_error`` of the rank numpy's weighted
    ``inverted_cdf`` answer has; count, mean and min/max exact."""
    monkeypatch.setattr(planstats, "SKETCH_VALUES", 64)
    branch = td.Client(str(tmp_path)).project("p").branch()
    x = (np.random.default_rng(4).standard_normal(40_000) ** 3).astype(np.float32)
    half = len(x) // 2
    branch.table("t").append_episode({"x": x[:half]}, episode="a")
    branch.table("t").append_episode({"x": x[half:]}, episode="b")
    w = td.Windows({"x": td.Rows([0, 1, 2], pad=True)})
    plan = td.Recipe(1, 4, [td.Component(branch.table("t"), w)]).plan()
    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    got = plan.stats(["x"], quantiles=qs, per_offset=per_offset)["x"]
    values = x.astype(np.float64)
    # window offset o takes row r when r - o is an anchor of r's episode: per episode, rows
    # 0..n-1 are taken by offsets 0..min(r, 2)
    taken = np.full(len(x), 3)
    for start in (0, half):
        taken[start], taken[start + 1] = 1, 2
    assert got.rank_error > 0
    if per_offset:  # offset o takes the rows at least o past their episode's start
        groups = []
        for o in range(3):
            t = np.ones(len(x), np.int64)
            for start in (0, half):
                t[start : start + o] = 0
            groups.append((o, t))
    else:
        groups = [(None, taken)]
    for o, t in groups:
        n = int(t.sum())
        pick = (lambda a: a) if o is None else (lambda a, o=o: a[o])  # noqa: E731
        assert int(pick(got.count)) == n
        np.testing.assert_allclose(pick(got.mean), np.average(values, weights=t), rtol=1e-12)
        assert pick(got.min) == values[t > 0].min() and pick(got.max) == values[t > 0].max()
        for q in qs:
            v = pick(got.quantile(q))
            below, upto = int(t[values < v].sum()), int(t[values <= v].sum())
            # numpy's weighted inverted_cdf answer is the least value whose weight share
            # reaches q: ours is within rank_error (in values) of that rank
            want = np.quantile(values, q, weights=t, method="inverted_cdf")
            assert int(t[values < want].sum()) < q * n <= int(t[values <= want].sum())
            assert below - got.rank_error <= q * n <= upto + got.rank_error, (o, q, below, upto)


@pytest.mark.slow
def test_plan_stats_bench_runs_on_a_tiny_table(tmp_path):
    """bench/plan_stats.py end to end on 20,000 moments: its numbers there and positive,
    the table reused by a second run (no timing asserted)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "plan_stats.py"
    out, root = tmp_path / "r.json", tmp_path / "root"
    cmd = [sys.executable, str(bench), "--moments", "20000", "--frames", "100", "--root",
           str(root), "--repeat", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    outs = []
    for extra in ([], ["--no-traced"]):  # made, then reused
        done = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(done.stdout.splitlines()[-1])
    assert "ratio" in outs[0] and "traced: table -, plan -" not in outs[0]
    assert "traced: table -, plan -" in outs[1]
    got = json.loads(out.read_text())
    assert got["moments"] == 20000 and got["ratio"] > 0 and got["cpu_ratio"] > 0
    assert len(got["table_stats_s"]) == len(got["plan_stats_10_offsets_s"]) == 1

"""table.stats at numeric edges, against numpy over the same rows read with Lance."""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from treadle.stats import table_stats as st


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    rng = np.random.default_rng(3)
    n = 400
    cols = {
        "big": 1e9 + rng.standard_normal(n) * 1e-3,  # naive E[x^2] - E[x]^2 gives garbage
        "huge": rng.standard_normal(n) * 1e30,
        "const": np.full(n, 3.3),
        "i64": np.full(n, 2**62, np.int64) + rng.integers(0, 1000, n),
        "f16": rng.standard_normal(n).astype(np.float16),
    }
    branch = td.Client(str(tmp_path_factory.mktemp("edges")), create=True).project("p").branch()
    branch.table("t").append(pa.table({k: pa.array(v) for k, v in cols.items()}))
    return branch.table("t").pin()


@pytest.mark.parametrize("column", ["big", "huge", "const", "i64", "f16"])
def test_edge_columns_match_numpy_on_the_rows_lance_reads(edges, column):
    s = edges.stats([column])[column]
    x = edges.dataset.to_table(columns=[column]).column(column).to_numpy().astype(np.float64)
    assert int(s.count) == len(x)
    np.testing.assert_allclose(s.mean, x.mean(), rtol=1e-14)
    np.testing.assert_allclose(s.std, x.std(), rtol=1e-9, atol=1e-15 * abs(x.mean()))
    assert float(s.min) == x.min() and float(s.max) == x.max()
    np.testing.assert_allclose(s.q01, np.quantile(x, 0.01), rtol=1e-14)


def test_a_nan_makes_the_quantiles_nan_also_once_the_sketch_compacts(tmp_path, monkeypatch):
    # exact quantiles of a column with a NaN are NaN (numpy's); a compacted sketch sorted
    # the NaN to its end and gave finite q01/q99 beside a NaN mean and min
    monkeypatch.setattr(st, "SKETCH_VALUES", 64)
    x = np.random.default_rng(0).standard_normal((300, 1))
    x[7, 0] = np.nan
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    branch.table("a").append_episode({"action": x}, episode="e0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = branch.table("a").pin().stats(["action"])["action"]
    assert s.rank_error > 0  # the sketch did compact
    assert np.isnan(s.min).all() and np.isnan(s.mean).all()
    assert np.isnan(s.q01).all() and np.isnan(s.q99).all()


def test_video_quantile_0_is_the_least_pixel_value_not_0(tmp_path):
    # pool_hist took the first bin whose weight share reaches q: for q = 0 that was bin 0,
    # which holds no pixel of a camera whose values are all above it
    from treadle.read.steps import host_reader

    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    frames = np.random.default_rng(0).integers(100, 150, (12, 16, 16, 3), dtype=np.uint8)
    branch.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="e0")
    w = td.Windows({"cam": td.Video([0])})
    plan = td.Recipe(seed=5, batch_size=4, components=[td.Component(branch.table("v"), w)]).plan()
    s = plan.stats(["cam"], quantiles=(0.0, 0.01, 1.0))["cam"]
    reader = host_reader(plan)
    n = plan.eligible(0)
    try:
        got = reader.read(np.zeros(n, np.int64), plan.eligible_moments(0, np.arange(n)))
    finally:
        reader.close()
    px = np.asarray(got["cam"]).reshape(-1, 3).astype(np.float64)
    ones = np.ones(len(px))
    for q in (0.0, 0.01, 1.0):
        want = [np.quantile(px[:, c], q, weights=ones, method="inverted_cdf") for c in range(3)]
        np.testing.assert_array_equal(s.quantile(q), want)
    np.testing.assert_array_equal(s.quantile(0.0), s.min)


def _exact_std(x: np.ndarray, w: np.ndarray | None = None) -> float:
    """Population std of the float64 values ``x`` (weights ``w``), exact in rationals."""
    from fractions import Fraction

    ws = [Fraction(1)] * len(x) if w is None else [Fraction(float(v)) for v in w]
    fs = [Fraction(float(v)) for v in x]
    total = sum(ws)
    m = sum(f * v for f, v in zip(fs, ws)) / total
    return float(sum(v * (f - m) ** 2 for f, v in zip(fs, ws)) / total) ** 0.5


@pytest.fixture(scope="module")
def offset(tmp_path_factory):
    """Two tables of values ``1e9 + noise`` (std 1e-5: ~80 float64 steps at 1e9)."""
    rng = np.random.default_rng(11)
    branch = td.Client(str(tmp_path_factory.mktemp("off")), create=True).project("p").branch()
    for name, n, d in (("a", 150, 0.0), ("b", 90, 2e-5)):
        x = 1e9 + d + rng.standard_normal((n, 1)) * 1e-5
        branch.table(name).append_episode({"action": x}, episode=f"{name}0")
    return branch


def test_merged_batches_of_values_far_from_0_keep_their_spread(offset, monkeypatch):
    # Chan's merge of batch means rounded at 1e9 (ulp 1.2e-7) added their rounding to the
    # spread: std off by 2e-4 relative here (3e-3 pooled), 40% for int64 near 2**62
    monkeypatch.setattr(st, "READ_VALUES", 16)  # many batches, many merges
    t = offset.table("a").pin()
    s = t.stats(["action"])["action"]
    x = np.stack(t.dataset.to_table(columns=["action"]).column("action").to_numpy(False))[:, 0]
    np.testing.assert_allclose(s.std, _exact_std(x), rtol=1e-9)


def test_pooled_components_of_values_far_from_0_keep_their_spread(offset):
    w = td.Windows({"action": td.Rows([0, 1])})  # rows taken once or twice: merged groups
    comps = [td.Component(offset.table("a"), w, 1.0), td.Component(offset.table("b"), w, 3.0)]
    plan = td.Recipe(seed=0, batch_size=4, components=comps).plan()
    s = plan.stats(["action"])["action"]
    vals, wts = [], []
    for c, name in enumerate(("a", "b")):
        ds = offset.table(name).pin().dataset
        x = np.stack(ds.to_table(columns=["action"]).column("action").to_numpy(False))[:, 0]
        v = np.concatenate([x[:-1], x[1:]])  # anchors 0..n-2, each takes rows a and a+1
        vals.append(v)
        wts.append(np.full(len(v), float(plan.weights[c]) / plan.eligible(c)))
    np.testing.assert_allclose(s.std, _exact_std(np.concatenate(vals), np.concatenate(wts)),
                               rtol=1e-9)  # fmt: skip


def _scaled(b, scale):
    return b["action"] * scale


class _Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, b):
        return b["action"] * self.k


@pytest.mark.parametrize("make", [lambda k: partial(_scaled, scale=k), _Scale])
def test_a_partial_or_callable_derive_is_keyed_by_its_arguments_and_state(offset, make):
    # a functools.partial or a callable object has no __code__: it was keyed by the
    # derive_version alone, so scale=3 silently read back the statistics of scale=2
    w = td.Windows({"action": td.Rows([0])})
    plan = td.Recipe(seed=1, batch_size=4, components=[td.Component(offset.table("a"), w)]).plan()
    two = plan.stats(derive={"s": make(2)}, derive_version="v1")["s"]
    three = plan.stats(derive={"s": make(3)}, derive_version="v1")["s"]
    np.testing.assert_allclose(three.mean, two.mean * 1.5, rtol=1e-12)

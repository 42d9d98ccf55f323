"""``plan.stats(...)``: statistics of the samples a run draws, checked against numpy over
every delivered (weighted) sample of a small plan of 4-, 7- and 14-dimensional robots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import treadle as td
import treadle.stats.plan_stats as planstats
from embodiment_helpers import make_robots
from treadle.read.steps import host_reader
from treadle.stats.window_rows import Taken

QS = (0.01, 0.10, 0.50, 0.90, 0.99)


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    return make_robots(str(tmp_path_factory.mktemp("robots")))


def _plan(branch, batch_size=12) -> td.Plan:
    pad = {"state": 14, "action": 14}
    ren = {"action": "act"}
    specs = {
        "state": td.Rows([-1, 0], pad=True),
        "action": td.Rows([0, 1, 2], pad=True),
        "cam": td.Video([-1, 0], size=(16, 16), pad=True, optional=True),
    }
    w = td.Windows(specs)
    comps = [
        td.Component(branch.table("arm4"), w, 0.5, where="frame >= 2", rename=ren, pad_to=pad),
        td.Component(branch.table("arm7"), w, 0.3, episodes=["arm7-1"], rename=ren, pad_to=pad),
        td.Component(branch.table("bi14"), w, 0.2, rename=ren, name="aloha"),
    ]
    return td.Recipe(seed=5, batch_size=batch_size, components=comps).plan()


def _delivered(plan, comps=None):
    """Every eligible anchor's batch, as the loader's reader delivers it, per component."""
    reader = host_reader(plan)
    try:
        out = []
        for c in range(plan.num_components) if comps is None else comps:
            n = plan.eligible(c)
            moments = plan.eligible_moments(c, np.arange(n))
            out.append((c, reader.read(np.full(n, c, np.int64), moments)))
        return out
    finally:
        reader.close()


def _entries(plan, batches, name, shares, fn=None):
    """Per element (time axis pooled): the values, and their plan weights, numpy-side."""
    vals: dict[int, list] = {}
    wts: dict[int, list] = {}
    for c, b in batches:
        x = np.asarray(b[name] if fn is None else fn(b), np.float64)  # [n, T, 14]
        key = "act" if fn is not None else name
        pad = np.asarray(b.get(f"{key}_is_pad", np.zeros(x.shape[:2], bool)))
        mask = np.asarray(b.get(f"{key}_dim_mask", np.ones((len(x), x.shape[-1]), bool)))
        for j in range(x.shape[-1]):
            keep = ~pad & mask[:, j : j + 1]
            v = x[..., j][keep]
            vals.setdefault(j, []).append(v)
            wts.setdefault(j, []).append(np.full(len(v), shares[c] / len(x)))
    return {j: (np.concatenate(vals[j]), np.concatenate(wts[j])) for j in vals}


def _check(stats: td.ColumnStats, entries) -> None:
    for j, (v, w) in entries.items():
        mean = np.average(v, weights=w)
        std = np.sqrt(np.average((v - mean) ** 2, weights=w))
        assert int(stats.count[j]) == len(v)
        np.testing.assert_allclose(stats.mean[j], mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(stats.std[j], std, rtol=1e-12, atol=1e-12)
        assert (stats.min[j], stats.max[j]) == (v.min(), v.max())
        for q in QS:
            want = np.quantile(v, q, weights=w, method="inverted_cdf")
            assert stats.quantile(q)[j] == want, (j, q)
    assert stats.rank_error == 0


def test_brute_force_equals_numpy_over_every_weighted_sample(robots):
    plan = _plan(robots)
    stats = plan.stats(["act", "state"])
    assert set(stats) == {"act", "state"} and stats["act"].mean.shape == (14,)
    batches = _delivered(plan)
    shares = [float(w) for w in plan.weights]
    for name in ("act", "state"):
        _check(stats[name], _entries(plan, batches, name, shares))
    # dims 7..13 come from the 14-D robot only, dims 4..6 from two robots: padding never enters
    assert stats["act"].count[13] < stats["act"].count[5] < stats["act"].count[0]


def test_by_component_and_per_offset(robots):
    plan = _plan(robots)
    per = plan.stats(["act"], by_component=True)
    assert list(per) == ["arm4", "arm7", "aloha"]
    for c, name in enumerate(per):
        got = per[name]["act"]
        [(cc, b)] = _delivered(plan, [c])
        entries = _entries(plan, [(cc, b)], "act", {c: 1.0})
        real = {j: e for j, e in entries.items() if len(e[0])}
        assert got.mean.shape == (len(real),) == ((4, 7, 14)[c],)  # its own dimensions
        _check(got, real)
    po = plan.stats(["act"], per_offset=True)["act"]
    assert po.mean.shape == (3, 14)
    batches = _delivered(plan)
    shares = [float(w) for w in plan.weights]
    for t in range(3):
        one = [(c, {**b, "act": b["act"][:, t : t + 1],
                    "act_is_pad": b["act_is_pad"][:, t : t + 1]}) for c, b in batches]  # fmt: skip
        entries = _entries(plan, one, "act", shares)
        for j, (v, w) in entries.items():
            assert int(po.count[t, j]) == len(v)
            np.testing.assert_allclose(po.mean[t, j], np.average(v, weights=w), rtol=1e-12)
            want = np.quantile(v, 0.5, weights=w, method="inverted_cdf")
            assert po.quantile(0.5)[t, j] == want


def test_derived_relative_actions(robots):
    plan = _plan(robots)

    def rel(b):
        return b["act"] - b["state"][:, -1:]

    stats = plan.stats(derive={"rel": rel})
    assert list(stats) == ["rel"]
    shares = [float(w) for w in plan.weights]
    _check(stats["rel"], _entries(plan, _delivered(plan), "rel", shares, fn=rel))


def test_video_per_channel_over_sampled_frames(robots):
    plan = _plan(robots)
    cam = plan.stats(["cam"], frames=10_000)["cam"]  # more than every window: all of them
    assert cam.video and cam.mean.shape == (3,)
    shares = [float(w) for w in plan.weights]
    vals, wts = [], []
    for c, b in _delivered(plan, [0, 1]):  # the 14-D robot has no camera: never counted
        px = np.asarray(b["cam"])[~np.asarray(b["cam_is_pad"])].reshape(-1, 3)
        vals.append(px.astype(np.float64))
        wts.append(np.full(len(px), shares[c] / plan.eligible(c)))
    v, w = np.concatenate(vals), np.concatenate(wts)
    for ch in range(3):
        mean = np.average(v[:, ch], weights=w)
        np.testing.assert_allclose(cam.mean[ch], mean, rtol=1e-12)
        std = np.sqrt(np.average((v[:, ch] - mean) ** 2, weights=w))
        np.testing.assert_allclose(cam.std[ch], std, rtol=1e-12)
        assert cam.q01[ch] == np.quantile(v[:, ch], 0.01, weights=w, method="inverted_cdf")
    lr = cam.to_lerobot()
    assert lr["mean"].shape == (3, 1, 1) and 0 <= lr["min"].min() <= lr["max"].max() <= 1
    np.testing.assert_allclose(lr["mean"].reshape(3), cam.mean / 255)
    assert lr["count"].tolist() == [cam.samples] and set(lr) >= {"q01", "q10", "q50", "q99"}


def test_lerobot_3804_pooled_q99_is_the_true_one(tmp_path):
    """900 frames with q99 = 10 and 100 frames with q99 = 50 at equal anchor weight: the
    pooled q99 is numpy's over all 1000 values, not 0.9 * 10 + 0.1 * 50 = 14."""
    branch = td.Client(str(tmp_path)).project("p").branch()
    big = np.linspace(0, 10.1, 900).astype(np.float32)
    small = np.linspace(0, 50.5, 100).astype(np.float32)
    with branch.transaction("two") as tx:
        tx.table("big").append_episode({"x": big}, episode="b")
        tx.table("small").append_episode({"x": small}, episode="s")
    w = td.Windows({"x": td.Rows([0])})
    comps = [td.Component(branch.table("big"), w, 900), td.Component(branch.table("small"), w, 100)]
    plan = td.Recipe(1, 10, comps).plan()
    got = plan.stats(["x"])["x"]
    allv = np.concatenate([big, small]).astype(np.float64)
    assert got.q99 == np.quantile(allv, 0.99, method="inverted_cdf") and got.q99 > 40
    per = plan.stats(["x"], by_component=True)
    merged = 0.9 * per["big"]["x"].q99 + 0.1 * per["small"]["x"].q99  # LeRobot's merge
    assert merged < 15 < got.q99


def test_kept_under_the_run_id_and_read_back_without_reading_tables(robots, monkeypatch):
    plan = _plan(robots)
    first = plan.stats(["act", "state"], quantiles=(0.25, 0.5))
    again = td.Plan.from_record(plan.record.to_json(), robots.project.client)  # a restart

    def no_reads(*a, **k):
        raise AssertionError("a kept result was read from the tables again")

    monkeypatch.setattr(planstats, "scan_batches", no_reads)
    monkeypatch.setattr(planstats, "_batches", no_reads)
    back = again.stats(["act", "state"], quantiles=(0.25, 0.5))
    for name in first:
        assert json.dumps(first[name].to_dict()) == json.dumps(back[name].to_dict())
    assert back["act"].quantile(0.25).shape == (14,)
    with pytest.raises(td.PlanError, match=r"quantile 0.3 was not computed"):
        back["act"].quantile(0.3)
    monkeypatch.undo()
    # another plan of the same tables (another run id) computes afresh
    other = _plan(robots, batch_size=24)
    assert other.run_id != plan.run_id
    got = other.stats(["act"], quantiles=(0.25, 0.5))["act"]
    np.testing.assert_array_equal(got.mean, first["act"].mean)  # same distribution


@pytest.mark.slow
def test_a_second_process_reads_the_kept_result(robots):
    plan = _plan(robots)
    here = plan.stats(["act"])["act"].to_dict()
    script = (
        "import json, sys, treadle as td, treadle.stats.plan_stats as ps\n"
        "def boom(*a, **k): raise SystemExit('table read on a cache hit')\n"
        "ps.scan_batches = ps._batches = boom\n"
        "plan = td.Plan.from_record(sys.stdin.read(), td.Client(sys.argv[1]))\n"
        "print(json.dumps(plan.stats(['act'])['act'].to_dict()))\n"
    )
    root = robots.project.client.root
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, root], input=plan.record.to_json(),
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(here))


def test_flat_and_empty_dimensions_warn_naming_them(robots):
    plan = _plan(robots)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        plan.stats(derive={"still": lambda b: b["state"][:, :, :2] * 0.0})
    msgs = [str(w.message) for w in got]
    assert any("'still'" in m and "[0, 1]" in m and "std 0" in m for m in msgs), msgs
    w = td.Windows({"state": td.Rows([0])})
    padded = td.Recipe(1, 4, [td.Component(robots.table("arm4"), w, pad_to={"state": 6})])
    with pytest.warns(UserWarning, match=r"'state' of the plan .* dimension\(s\) \[4, 5\]"):
        s = padded.plan().stats(["state"])["state"]
    assert s.count[4] == 0 and np.isnan(s.mean[4])


def test_bad_arguments(robots):
    plan = _plan(robots)
    with pytest.raises(td.NotFound, match="no column"):
        plan.stats(["nope"])
    with pytest.raises(td.PlanError, match=r"quantiles must be in \[0, 1\]"):
        plan.stats(["act"], quantiles=(1.5,))
    with pytest.raises(td.PlanError, match="derive names"):
        plan.stats(derive={"act": lambda b: b["act"]})
    with pytest.raises(td.PlanError, match="frames"):
        plan.stats(["cam"], frames=0)


def test_beyond_the_exact_size_quantiles_hold_their_stated_rank_error(tmp_path, monkeypatch):
    """A sketch of 64 items per level (SKETCH_VALUES patched down): the quantiles of a
    5-offset window over 6000 rows are within ``rank_error`` values of numpy's."""
    monkeypatch.setattr(planstats, "SKETCH_VALUES", 64)
    branch = td.Client(str(tmp_path)).project("p").branch()
    x = np.random.default_rng(3).standard_normal(6000).astype(np.float32)
    branch.table("t").append_episode({"x": x}, episode="e")
    w = td.Windows({"x": td.Rows(range(-2, 3), pad=True)})
    plan = td.Recipe(1, 4, [td.Component(branch.table("t"), w)]).plan()
    got = plan.stats(["x"], quantiles=QS)["x"]
    # every row enters once per window that takes it unpadded: 5 times, fewer at the ends
    taken = np.full(6000, 5)
    taken[[0, -1]], taken[[1, -2]] = 3, 4
    values, n = x.astype(np.float64), int(taken.sum())
    assert int(got.count) == n and got.rank_error > 0
    for q in QS:
        v = got.quantile(q)
        below = int(taken[values < v].sum())
        upto = int(taken[values <= v].sum())
        # the true rank of the answer is within the bound of the rank numpy's answer has
        assert below - got.rank_error <= q * n <= upto + got.rank_error, (q, below, upto)
    np.testing.assert_allclose(got.mean, np.average(values, weights=taken), rtol=1e-12)


def test_recomputed_from_scratch_the_result_is_the_same(robots):
    """Nothing but the plan decides the result: recomputed after the kept object is gone
    (a fresh project copy would do the same), every field is identical, bit for bit."""
    plan = _plan(robots)
    first = plan.stats(["act", "state", "cam"], per_offset=True)
    store = robots.project.client.store
    prefix = f"{robots.project.prefix}/runstats/{plan.run_id}/"
    for key in store.list(prefix):
        store.delete(key)
    assert not list(store.list(prefix))
    again = td.Plan.from_record(plan.record.to_json(), robots.project.client)
    second = again.stats(["act", "state", "cam"], per_offset=True)
    for name in first:
        assert json.dumps(first[name].to_dict()) == json.dumps(second[name].to_dict())


def test_absent_optional_columns_leave_only_what_reads_them(tmp_path):
    """A table without the optional column ``g``: its samples never enter ``g``'s
    statistics, nor those of a derived value that reads ``g``; a derived value that reads
    only ``x`` counts them."""
    branch = td.Client(str(tmp_path)).project("p").branch()
    with branch.transaction("two") as tx:
        tx.table("a").append_episode(
            {"x": np.arange(9, dtype=np.float32), "g": np.full(9, 5, np.float32)}, episode="a"
        )
        tx.table("b").append_episode({"x": np.arange(4, dtype=np.float32)}, episode="b")
    w = td.Windows({"x": td.Rows([0]), "g": td.Rows([0], optional=True)})
    comps = [td.Component(branch.table("a"), w, 9), td.Component(branch.table("b"), w, 4)]
    plan = td.Recipe(1, 13, comps).plan()
    with pytest.warns(UserWarning, match="'g'"):  # g is 5 everywhere it exists: std 0
        got = plan.stats(["x", "g"], derive={"x2": lambda b: b["x"] * 2, "g2": lambda b: b["g"]})
    assert (int(got["x"].count), int(got["g"].count)) == (13, 9)
    # a Rows([0]) window is [b, 1]: a derived [b, 1] value of it is scalars over that window
    assert (got["x2"].count.tolist(), got["g2"].count.tolist()) == (13, 9)
    assert float(got["g"].max) == 5.0 == float(got["g2"].min)  # the zeros never counted
    np.testing.assert_allclose(got["x2"].mean, 2 * got["x"].mean, rtol=1e-12)
    batch = next(iter(td.TrainLoader(plan, steps=1)))
    present = batch["g_is_present"].numpy()
    assert present.tolist() == (batch["_component"].numpy() == 0).tolist()
    assert not batch["g"].numpy()[~present].any()


def test_a_derive_function_is_keyed_by_what_it_computes(robots):
    """Two derive functions of the same code over different closed-over arrays (whose
    reprs agree) are two results, never one read back for the other."""
    plan = _plan(robots)
    outs = []
    for shift in (0.0, 1.0):
        offset = np.zeros(2000)
        offset[1000] = shift  # repr(offset) elides the middle: only the bytes differ
        outs.append(plan.stats(derive={"s": lambda b, o=offset: b["act"] + o[1000]})["s"])
    np.testing.assert_allclose(outs[1].mean - outs[0].mean, np.ones(14))


def _forget(branch, plan) -> None:
    store = branch.project.client.store
    for key in store.list(f"{branch.project.prefix}/runstats/{plan.run_id}/"):
        store.delete(key)


@pytest.mark.slow
def test_every_rank_and_worker_count_computes_the_same(robots):
    """Each rank of W = 1, 2, 4 (workers 0 and 2), rebuilding the plan from its loader's
    state after some steps and computing afresh (nothing kept), gets the same statistics,
    video samples included: they depend on the run record alone."""
    plan = _plan(robots)
    cols = ["act", "state", "cam"]
    want = {k: json.dumps(v.to_dict()) for k, v in plan.stats(cols).items()}
    for world, workers in ((1, 0), (2, 0), (4, 2)):
        loader = td.TrainLoader(plan, rank=world - 1, world_size=world, steps=2, workers=workers)
        assert len(list(loader)) == 2
        rebuilt = td.Plan.from_record(loader.state_dict()["record"], robots.project.client)
        _forget(robots, plan)
        got = {k: json.dumps(v.to_dict()) for k, v in rebuilt.stats(cols).items()}
        assert got == want, (world, workers)


def test_rows_taken_by_each_offset_match_a_row_by_row_lookup():
    """The scan's per-batch lookup (anchor runs and episodes from the boundaries among the
    rows) against a lookup of every row on its own, for random runs, episodes and reaches."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n_rows = int(rng.integers(50, 300))
        starts = np.concatenate([[0], np.cumsum(rng.integers(1, 30, size=100))])
        starts = starts[starts < n_rows].astype(np.int64)
        cuts = np.sort(rng.choice(n_rows + 1, size=2 * int(rng.integers(0, 10)), replace=False))
        first, stop = cuts[0::2].astype(np.int64), cuts[1::2].astype(np.int64)
        lo = int(rng.integers(0, n_rows - 5))
        n = int(rng.integers(1, n_rows - lo + 1))
        a, b = sorted(rng.integers(-9, 10, size=2).tolist())
        taken = Taken(lo, n, (a, b), first, stop, starts)
        rows = np.arange(lo, lo + n)
        for o in range(a, b + 1):
            anchor = rows - o
            run = np.searchsorted(first, anchor, side="right") - 1
            is_anchor = (run >= 0) & (anchor < stop[np.maximum(run, 0)]) if len(first) else 0
            same = np.searchsorted(starts, anchor, "right") == np.searchsorted(
                starts, rows, "right"
            )
            np.testing.assert_array_equal(taken.by(o), is_anchor & same)


def test_lerobot_count_is_the_number_of_samples_not_of_window_values(robots):
    # LeRobot's count is its frames, each the anchor of one sample's window; a row that
    # three windows take is one sample, not three (it was anchors x window length)
    plan = _plan(robots)
    anchors = sum(plan.eligible(c) for c in range(plan.num_components))
    act = plan.stats(["act"])["act"]
    assert int(act.count.max()) > anchors  # values: each row once per window taking it
    assert act.to_lerobot()["count"].tolist() == [anchors]
    per = plan.stats(["act", "state"], by_component=True)
    for c, name in enumerate(per):
        assert per[name]["act"].to_lerobot()["count"].tolist() == [plan.eligible(c)]
        assert per[name]["state"].to_lerobot()["count"].tolist() == [plan.eligible(c)]
    rel = plan.stats(["act"], derive={"d": lambda b: b["act"][:, :, :4] - b["state"][:, -1:, :4]})
    assert rel["d"].to_lerobot()["count"].tolist() == [anchors]
    po = plan.stats(["act"], per_offset=True)["act"]
    assert po.to_lerobot()["count"].tolist() == [anchors]


@pytest.fixture(scope="module")
def ramp_plan(tmp_path_factory):
    """One 10-frame episode of x = 0..9 and windows of offsets 0, 1, 2 padded at its end."""
    branch = td.Client(str(tmp_path_factory.mktemp("ramp"))).project("p").branch()
    branch.table("t").append_episode({"x": np.arange(10, dtype=np.float32)}, episode="e")
    w = td.Windows({"x": td.Rows([0, 1, 2], pad=True)})
    return td.Recipe(3, 5, [td.Component(branch.table("t"), w, 1.0)]).plan()


def test_a_derived_value_that_slices_the_window_leaves_its_padded_samples_out(ramp_plan):
    # the last offset of anchors 8 and 9 is padded (it repeats 9): 2..9, not 2..9, 9, 9
    got = ramp_plan.stats(["x"], derive={"last": lambda b: b["x"][:, -1]})["last"]
    want = np.arange(2, 10, dtype=np.float64)
    assert int(got.count) == 8 and got.to_lerobot()["count"].tolist() == [8]
    assert got.mean == want.mean() and got.max == 9 and got.min == 2
    assert got.quantile(0.99) == np.quantile(want, 0.99, method="inverted_cdf")
    first = ramp_plan.stats(["x"], derive={"first": lambda b: b["x"][:, 0]})["first"]
    assert int(first.count) == 10 and first.mean == 4.5  # offset 0 is never padded


def test_a_derived_value_of_padded_values_is_left_out_and_a_mixed_sample_refused(ramp_plan):
    # a window's sum reads its padded values: anchors 8 and 9 are left out
    total = ramp_plan.stats(["x"], derive={"total": lambda b: b["x"].sum(axis=1)})["total"]
    assert int(total.count) == 8 and total.max == 7 + 8 + 9 and total.min == 0 + 1 + 2
    # [b, 2] is two dimensions of a sample: anchor 8's first is real, its second padded
    with pytest.raises(td.PlanError, match="'two' mixes padded and real values of \\['x'\\]"):
        ramp_plan.stats(["x"], derive={"two": lambda b: b["x"][:, 1:]})  # [b, 2]: two dims

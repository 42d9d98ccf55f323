"""Adversarial checks of issues 27 and 28 (plan.stats, schedules, plan.exclude): each test
failed before the fix committed with it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import treadle as td


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Tables ``a`` (3 episodes) and ``b`` (2), a 3-D ``s`` and a scalar ``sp`` each."""
    branch = td.Client(str(tmp_path_factory.mktemp("two"))).project("p").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("two") as tx:
        for name, lens in (("a", [5, 9, 2]), ("b", [12, 6])):
            for e, n in enumerate(lens):
                cols = {
                    "s": rng.standard_normal((n, 3)).astype(np.float32),
                    "sp": rng.standard_normal(n).astype(np.float32),
                }
                tx.table(name).append_episode(cols, episode=f"{name}{e}")
    return branch


def _plan(branch, windows=None, batch_size=4) -> td.Plan:
    w = windows or td.Windows({"s": td.Rows([0, 1], pad=True), "sp": td.Rows([0, 1], pad=True)})
    comps = [td.Component(branch.table("a"), w, 1), td.Component(branch.table("b"), w, 1)]
    return td.Recipe(seed=3, batch_size=batch_size, components=comps).plan()


# -- a kept result is never read back for a derive function that computes something else --
def test_a_derive_function_is_keyed_by_the_functions_it_calls(two):
    """A notebook cell re-run after its helper was edited: same lambda code, same line, but
    the global function it calls now computes another value."""
    plan = _plan(two)
    scope: dict = {}
    outs = []
    for factor in (2, 3):
        exec(f"def helper(x):\n    return x * {factor}\n", scope)
        fn = eval('lambda b: helper(b["s"])', scope)
        outs.append(plan.stats(derive={"d": fn})["d"].mean)
    np.testing.assert_allclose(outs[1], outs[0] * 1.5, rtol=1e-6)


@pytest.mark.parametrize("kind", ["tensor", "list", "object"])
def test_a_derive_function_is_keyed_by_the_state_of_what_it_closes_over(two, kind):
    """Closed-over values whose repr does not show their state (a long tensor's repr elides
    its middle, a list of such arrays, an object with a fixed repr such as a torch module)."""

    class Scale:
        def __init__(self, k: float):
            self.k = k

        def __repr__(self) -> str:
            return "Scale()"

    plan = _plan(two)
    outs = []
    for shift in (0.0, 1.0):
        if kind == "tensor":
            t = torch.zeros(2000, dtype=torch.float64)
            t[1000] = shift
            fn = lambda b, o=t: b["s"] + float(o[1000])  # noqa: E731
        elif kind == "list":
            arrs = [np.zeros(2000)]
            arrs[0][1000] = shift
            fn = lambda b, o=arrs: b["s"] + o[0][1000]  # noqa: E731
        else:
            fn = lambda b, o=Scale(shift): b["s"] + o.k  # noqa: E731
        outs.append(plan.stats(derive={"d": fn})["d"].mean)
    np.testing.assert_allclose(outs[1] - outs[0], np.ones(3), rtol=1e-6)


# -- a kept object that cannot be what was asked is never returned -------------------------
@pytest.mark.parametrize(
    "data", [b"\x00garbage", b"", b'{"pooled": {}, "components": {}}', b'{"pooled": {"s": 1}}']
)
def test_a_corrupt_kept_result_is_computed_afresh_and_replaced(two, data):
    plan = _plan(two, batch_size=6)
    want = plan.stats(["s"])["s"]
    store = two.project.client.store
    [key] = list(store.list(f"{two.project.prefix}/runstats/{plan.run_id}/"))
    good = store.get(key)
    store.put(key, data)
    with pytest.warns(UserWarning, match="kept plan.stats result .* cannot be read"):
        got = plan.stats(["s"])
    assert list(got) == ["s"] and got["s"].to_dict() == want.to_dict()
    assert store.get(key) == good  # replaced by the result computed afresh


# -- padded entries never enter a derived value's statistics ------------------------------
@pytest.mark.parametrize("pad", [True, False])
def test_a_derived_value_of_a_windowed_scalar_leaves_its_padding_out(two, pad):
    """``b["sp"]`` of ``Rows([0, 1, 2], pad=True)`` is ``[b, T]``: a derived ``[b, T]`` value
    of it has a time axis, so its padded entries are left out as ``sp``'s own are."""
    w = td.Windows({"sp": td.Rows([0, 1, 2], pad=pad)})
    plan = _plan(two, w)
    got = plan.stats(["sp"], derive={"sp2": lambda b: b["sp"] * 2})
    sp, sp2 = got["sp"], got["sp2"]
    assert sp2.mean.shape == sp.mean.shape == ()
    assert int(sp2.count) == int(sp.count)
    np.testing.assert_allclose(sp2.mean, 2 * sp.mean, rtol=1e-6)
    np.testing.assert_allclose(sp2.quantile(0.5), 2 * sp.quantile(0.5), rtol=1e-6)
    po = plan.stats(["sp"], derive={"sp2": lambda b: b["sp"] * 2}, per_offset=True)
    assert po["sp2"].count.tolist() == po["sp"].count.tolist()


def test_nan_in_the_data_makes_every_statistic_of_its_dimension_nan(tmp_path):
    """As numpy's: a dimension holding a NaN has NaN quantiles, not those of the other
    values (q01..q90 were finite and silently left the NaN out); the other dimension is
    untouched, and a warning names the dimension."""
    branch = td.Client(str(tmp_path)).project("p").branch()
    x = np.random.default_rng(1).standard_normal((40, 2)).astype(np.float32)
    x[7, 0] = np.nan
    branch.table("t").append_episode({"x": x}, episode="e")
    w = td.Windows({"x": td.Rows([0])})
    plan = td.Recipe(1, 4, [td.Component(branch.table("t"), w)]).plan()
    with pytest.warns(UserWarning, match=r"'x' .* NaN .* dimension\(s\) \[0\]"):
        got = plan.stats(["x"])["x"]
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        assert np.isnan(got.quantile(q)[0]), q
        assert got.quantile(q)[1] == np.quantile(
            x[:, 1].astype(np.float64), q, method="inverted_cdf"
        )
    assert np.isnan([got.mean[0], got.std[0], got.min[0], got.max[0]]).all()


# -- plan.exclude -------------------------------------------------------------------------
def test_an_episode_named_twice_is_excluded_once(two):
    """``["a1", "a1"]`` is the exclusion of ``["a1"]``: same record, same run id, and the
    card counts its 9 moments once (they were counted twice: "(18 moments)")."""
    from treadle.plan.card import render_card

    plan = _plan(two)
    once = plan.exclude(episodes={"a": ["a1"]}, from_step=2)
    twice = plan.exclude(episodes={"a": ["a1", "a1"]}, from_step=2)
    assert twice.record.derived.moments == 9 == once.record.derived.moments
    assert twice.run_id == once.run_id
    assert "excluding 1 episode (9 moments)" in render_card(twice.record)


# -- schedules ----------------------------------------------------------------------------
def test_the_card_says_when_a_ramp_is_cut_short_and_what_it_reached(two):
    """A ramp to b=1 over 40 steps from step 3, cut by a stage at step 11: 2 of its 10
    pieces are planned and the mix reaches 4/5, 1/5 (the card said it ramps to 0, 1/1).
    Stages name components as the rest of the card does (they named tables)."""
    from treadle.plan.card import render_card

    sched = td.Schedule([(0, [1, 0]), (3, td.Ramp([0, 1], steps=40)), (11, [0.5, 0.5])])
    comps = [td.Component(two.table("a"), name="arm"), td.Component(two.table("b"))]
    plan = td.Recipe(seed=1, batch_size=10, components=comps, schedule=sched).plan()
    assert [plan.counts(s).tolist() for s in (3, 7, 10, 11)] == [[9, 1], [8, 2], [8, 2], [5, 5]]
    card = render_card(plan.record)
    assert (
        "stage 1 from step 3: ramp over 40 steps, cut short at step 11 after 2 of its 10 "
        "pieces, reaching [0] arm 4/5, [1] b 1/5 (of [0] arm 0, [1] b 1/1)"
    ) in card, card


def test_a_derived_value_left_out_everywhere_is_a_named_error(two):
    """Every entry padded (an offset past every episode's end): a PlanError naming the
    derive, not an IndexError from pooling nothing."""
    w = td.Windows({"s": td.Rows([50], pad=True)})
    plan = _plan(two, w)
    with pytest.raises(td.PlanError, match="derive 'far' has no values"):
        plan.stats(derive={"far": lambda b: b["s"] * 2})


def test_the_statistics_of_a_derived_run_leave_its_excluded_episodes_out(two):
    """plan.exclude drops bad episodes: the derived run's statistics are those of what it
    draws from ``from_step`` on, without them (they were the parent's, excluded episodes
    and all): equal to a plan that selects the other episodes with ``episodes=``."""
    w = td.Windows({"s": td.Rows([-1, 0, 2], pad=True), "sp": td.Rows([0, 1], pad=True)})
    plan = _plan(two, w)
    derived = plan.exclude(episodes={"a": ["a1"], "b": ["b0"]}, from_step=0)
    comps = [
        td.Component(two.table("a"), w, 1, episodes=["a0", "a2"]),
        td.Component(two.table("b"), w, 1, episodes=["b1"]),
    ]
    want = td.Recipe(seed=3, batch_size=4, components=comps).plan()
    kw = {"derive": {"r": lambda b: b["s"] - b["sp"][:, :1, None]}, "per_offset": True}
    got, expect = derived.stats(["s", "sp"], **kw), want.stats(["s", "sp"], **kw)
    for name in ("s", "sp", "r"):
        assert got[name].to_dict() == expect[name].to_dict(), name
    per = derived.stats(["s"], by_component=True)
    assert per["b"]["s"].to_dict() == want.stats(["s"], by_component=True)["b"]["s"].to_dict()
    assert int(plan.stats(["sp"])["sp"].count) > int(got["sp"].count.sum())
    # what the derived run draws from step 0 on: none of the excluded episodes' anchors
    for step in range(30):
        b = derived.batch(step)
        for c, lo, hi in ((0, 5, 14), (1, 0, 12)):
            m = b.moment[b.component == c]
            assert not ((m >= lo) & (m < hi)).any()


def test_the_rank_error_bound_counts_every_component_values(tmp_path, monkeypatch):
    """Beyond the exact size: the pooled rank error bound, in values of the pooled count,
    is the worst part's error fraction of all values. Two identical components draw the
    one component's distribution at twice the count, so the bound doubles with the count
    (it stayed that of one component: half the stated error fraction)."""
    import treadle.stats.plan_stats as planstats

    monkeypatch.setattr(planstats, "SKETCH_VALUES", 64)
    branch = td.Client(str(tmp_path)).project("p").branch()
    x = np.random.default_rng(3).standard_normal(6000).astype(np.float32)
    branch.table("t").append_episode({"x": x}, episode="e")
    w = td.Windows({"x": td.Rows([0])})
    one = td.Recipe(1, 4, [td.Component(branch.table("t"), w)]).plan().stats(["x"])["x"]
    comps = [td.Component(branch.table("t"), w), td.Component(branch.table("t"), w)]
    two = td.Recipe(1, 4, comps).plan().stats(["x"])["x"]
    assert int(two.count) == 2 * int(one.count) and one.rank_error > 0
    assert two.rank_error / int(two.count) >= one.rank_error / int(one.count) - 1e-9
    assert two.quantile(0.5) == one.quantile(0.5)


# -- to_lerobot ---------------------------------------------------------------------------
def test_to_lerobot_keeps_padded_zeros_zero_in_dimensions_without_values(two):
    """Dimensions no component has (every robot padded to 5 here, pi0-style) have NaN
    statistics; LeRobot's normaliser turned their padded zeros into NaN ((0 - NaN) / NaN)
    and the model input with them. to_lerobot gives them statistics under which 0 maps to
    0 in every LeRobot mode (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10)."""
    w = td.Windows({"s": td.Rows([0, 1], pad=True)})
    comps = [
        td.Component(two.table(t), w, 1, pad_to={"s": 5}) for t in ("a", "b")
    ]  # fmt: skip
    plan = td.Recipe(seed=3, batch_size=4, components=comps).plan()
    with pytest.warns(UserWarning, match=r"dimension\(s\) \[3, 4\]"):
        s = plan.stats(["s"])["s"]
    assert np.isnan(s.mean[3:]).all() and (s.count[3:] == 0).all()
    lr = s.to_lerobot()
    assert all(np.isfinite(v).all() for v in lr.values())
    zero = np.zeros(2)
    mean, std = lr["mean"][3:], lr["std"][3:]
    assert ((zero - mean) / std == 0).all()
    for lo, hi in (("min", "max"), ("q01", "q99"), ("q10", "q90")):
        assert (2 * (zero - lr[lo][3:]) / (lr[hi][3:] - lr[lo][3:]) - 1 == 0).all(), lo
    real = {"mean": s.mean, "std": s.std, "min": s.min, "max": s.max, "q50": s.quantile(0.5)}
    for k, v in real.items():  # the real dimensions as computed
        np.testing.assert_array_equal(lr[k][:3], v[:3])


def test_to_lerobot_passes_dimension_masks_and_presence_under_feature_names(tmp_path):
    """A cross-embodiment batch through tl.to_lerobot: ``<col>_dim_mask`` ([b, size]) and
    ``<col>_is_present`` ([b]) are flags of their column, renamed with it and kept as they
    are (they were taken for columns read at the moment: a PlanError, or for a mask of
    size 1 its axis silently dropped)."""
    from treadle import lerobot as tl

    branch = td.Client(str(tmp_path)).project("p").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("two") as tx:
        for name, d in (("a", 3), ("b", 6)):
            cols = {"observation_state": rng.standard_normal((8, d)).astype(np.float32)}
            if name == "a":
                cols["observation_effort"] = np.ones((8, 1), np.float32)
            tx.table(name).append_episode(cols, episode=f"{name}0")
    w = td.Windows({
        "observation_state": td.Rows([0]),
        "observation_effort": td.Rows([0], optional=True),
    })  # fmt: skip
    comps = [
        td.Component(branch.table("a"), w, pad_to={"observation_state": 6}),
        td.Component(branch.table("b"), w),
    ]
    plan = td.Recipe(1, 4, comps).plan()
    raw = next(iter(td.TrainLoader(plan, steps=1)))
    names = {"observation_state": "observation.state", "observation_effort": "observation.effort"}
    b = tl.to_lerobot(raw, names=names)
    assert torch.equal(b["observation.state_dim_mask"], raw["observation_state_dim_mask"])
    assert torch.equal(b["observation.effort_is_present"], raw["observation_effort_is_present"])
    assert tuple(b["observation.state"].shape) == (4, 6)
    assert tuple(b["observation.effort"].shape) == (4, 1)


def test_a_derive_function_over_a_value_that_holds_itself_is_computed_not_kept():
    from treadle.stats.run_cache import code_key

    loop: list = []
    loop.append(loop)
    assert code_key(lambda b, o=loop: b["s"]) == "unkeyed"  # a RecursionError before
    assert code_key(lambda b, o=[1, 2]: b["s"]) != code_key(lambda b, o=[1, 3]: b["s"])


def test_an_eval_pass_of_a_derived_run_leaves_its_excluded_episodes_out(two):
    """EvalLoader over a derived run (one component): every moment it still draws exactly
    once, none of the excluded episode's (they were all evaluated), at any rank count and
    after a restart."""
    comp = td.Component(two.table("b"), td.Windows({"sp": td.Rows([0])}))
    plan = td.Recipe(seed=1, batch_size=4, components=[comp]).plan()
    derived = plan.exclude(episodes={"b": ["b0"]}, from_step=0)  # rows 0..11
    for world in (1, 2):
        seen = []
        for r in range(world):
            for b in td.EvalLoader(derived, rank=r, world_size=world):
                seen += np.asarray(b["_moment"])[np.asarray(b["_valid"])].tolist()
        assert sorted(seen) == list(range(12, 18)), world
    loader = td.EvalLoader(derived)
    first = next(iter(loader))
    again = td.EvalLoader.from_state(loader.state_dict(), two.project.client)
    assert np.asarray(next(iter(again))["_moment"]).min() >= 12 <= first["_moment"].min()


def test_a_derived_value_of_two_padded_columns_keeps_the_dimensions_both_have(tmp_path):
    """A robot whose state has 4 dimensions and action 7, both padded to 14: ``action -
    state`` is real where both are (0..3); it was a ValueError (cut at one column's 7,
    kept as the other's 4)."""
    branch = td.Client(str(tmp_path)).project("p").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("two") as tx:
        for name, ds, da in (("a", 4, 7), ("b", 14, 14)):
            cols = {
                "state": rng.standard_normal((9, ds)).astype(np.float32),
                "action": rng.standard_normal((9, da)).astype(np.float32),
            }
            tx.table(name).append_episode(cols, episode=f"{name}0")
    w = td.Windows({"action": td.Rows([0, 1], pad=True), "state": td.Rows([0])})
    pad = {"state": 14, "action": 14}
    comps = [td.Component(branch.table("a"), w, pad_to=pad), td.Component(branch.table("b"), w)]
    plan = td.Recipe(1, 4, comps).plan()
    got = plan.stats(derive={"rel": lambda b: b["action"] - b["state"]})["rel"]
    # a: 9 anchors x 2 offsets, one padded; b: the same, over 14 dimensions
    assert got.count.tolist() == [34] * 4 + [17] * 10
    per = plan.stats(derive={"rel": lambda b: b["action"] - b["state"]}, by_component=True)
    assert per["a"]["rel"].mean.shape == (4,) and per["b"]["rel"].mean.shape == (14,)


def test_a_derived_value_of_an_unwindowed_tensor_keeps_its_dimensions(two):
    """Without windows a tensor column is ``[b, D]``: a derived ``[b, D]`` value of it is
    per dimension, not scalars over a window (only windowed scalars make ``[b, T]``)."""
    plan = td.Recipe(1, 4, [td.Component(two.table("a"))]).plan()
    got = plan.stats(["s"], derive={"s2": lambda b: b["s"] * 2})
    assert got["s2"].mean.shape == got["s"].mean.shape == (3,)
    np.testing.assert_allclose(got["s2"].mean, 2 * got["s"].mean, rtol=1e-6)


def test_a_derived_value_whose_axis_could_be_time_or_dimension_is_refused(two):
    """``s[:, 0] * sp[:, :1]`` is ``[b, 3]`` where 3 is both the window length of ``sp`` and
    the dimension of ``s``: which entries are padded cannot be said, so it is an error."""
    w = td.Windows({"s": td.Rows([0, 1, 2], pad=True), "sp": td.Rows([0, 1, 2], pad=True)})
    plan = _plan(two, w)
    with pytest.raises(td.PlanError, match=r"derive 'amb' gave \(\d+, 3\): 3 is a window length"):
        plan.stats(derive={"amb": lambda b: b["s"][:, 0] * b["sp"][:, :1]})
    got = plan.stats(derive={"ok": lambda b: (b["s"][:, 0] * b["sp"][:, :1])[:, None]})
    assert got["ok"].mean.shape == (3,)


def test_loaders_resume_a_scheduled_derived_run_across_a_stage_boundary(two):
    """TrainLoader.from_state at the step before a stage starts (and before the exclusion
    starts), at world sizes 1, 2 (2 workers) and 4: each rank's batches are its slice of
    the uninterrupted run's, values included."""
    w = td.Windows({"s": td.Rows([0, 1], pad=True)})
    comps = [td.Component(two.table("a"), w), td.Component(two.table("b"), w)]
    sched = td.Schedule([(0, [1, 0]), (3, td.Ramp([0.25, 0.75], steps=3)), (6, [0.5, 0.5])])
    plan = td.Recipe(seed=4, batch_size=8, components=comps, schedule=sched).plan()
    derived = plan.exclude(episodes={"b": ["b0"]}, from_step=4)
    whole = list(td.TrainLoader(derived, steps=9))
    for stop, world, workers in ((2, 1, 0), (3, 2, 2), (5, 4, 0)):
        first = td.TrainLoader(derived, steps=stop)
        assert len(list(first)) == stop
        state = first.state_dict()
        for r in range(world):
            again = td.TrainLoader.from_state(state, two.project.client, rank=r,
                                              world_size=world, steps=9, workers=workers)  # fmt: skip
            for k, b in enumerate(again):
                for key in ("_moment", "_component", "s", "s_is_pad"):
                    want = np.asarray(whole[stop + k][key])[r::world]
                    assert np.array_equal(np.asarray(b[key]), want), (stop, world, r, key)


# -- held: numpy over every delivered value, on plans test_plan_stats does not build -------
@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two tables at 10 and 15 fps, 3- and 5-D tensors, [2, D] tensors, int/bool/f16."""
    branch = td.Client(str(tmp_path_factory.mktemp("mixed"))).project("p").branch()
    rng = np.random.default_rng(0)
    with branch.transaction("mixed") as tx:
        for name, dims, fps, lens in (("a", 3, 10, [5, 9, 2]), ("c", 5, 15, [12, 6])):
            for e, n in enumerate(lens):
                cols = {
                    "s": rng.standard_normal((n, dims)).astype(np.float32),
                    "m": rng.standard_normal((n, 2, dims)).astype(np.float32),
                    "i": rng.integers(-50, 50, n).astype(np.int32),
                    "h": rng.standard_normal(n).astype(np.float16),
                    "k": rng.integers(0, 2, n).astype(bool),
                }
                tx.table(name).append_episode(cols, episode=f"{name}{e}", fps=fps)
    return branch


def _numpy_stats(plan, name, per_offset):
    """Per element: every delivered, unpadded, real value and its plan weight."""
    from treadle.read.steps import host_reader

    reader, vals = host_reader(plan), {}
    shares = [float(w) for w in plan.weights]
    try:
        for c in range(plan.num_components):
            n = plan.eligible(c)
            b = reader.read(np.full(n, c, np.int64), plan.eligible_moments(c, np.arange(n)))
            x = np.asarray(b[name], np.float64)
            x = x if plan.layout[name].placed[c].spec is not None else x[:, None]
            pad = np.asarray(b.get(f"{name}_is_pad", np.zeros(x.shape[:2], bool)))
            mask = np.asarray(b.get(f"{name}_dim_mask", np.ones((n, *x.shape[-1:]), bool)))
            for t in range(x.shape[1]):
                for j in np.ndindex(*x.shape[2:]):
                    keep = ~pad[:, t] & (mask[:, j[-1]] if j else True)
                    key = ((t,) if per_offset else ()) + j
                    got = vals.setdefault(key, ([], []))
                    got[0].append(x[(slice(None), t, *j)][keep])
                    got[1].append(np.full(int(keep.sum()), shares[c] / n))
    finally:
        reader.close()
    return {k: (np.concatenate(v), np.concatenate(w)) for k, (v, w) in vals.items()}


@pytest.mark.parametrize(
    ("col", "spec", "pad_to", "per_offset"),
    [
        ("s", td.Rows(seconds=[-0.2, 0, 0.4], pad=True), None, False),  # 10 and 15 fps
        ("s", td.Rows(seconds=[-0.2, 0, 0.4], pad=True), 5, True),
        ("m", td.Rows([0, 1], pad=True), 5, False),  # [2, D] padded to [2, 5]
        ("m", td.Rows([0, 1], pad=True), 5, True),
        ("i", td.Rows([0, 1], pad=True), None, False),
        ("h", td.Rows([-1, 0], pad=True), None, True),
        ("k", td.Rows([0]), None, False),
        ("i", None, None, False),  # no window: [b]
    ],
)
def test_plan_stats_equal_numpy_over_every_weighted_value(mixed, col, spec, pad_to, per_offset):
    w = td.Windows({col: spec}) if spec is not None else None
    pads = {col: pad_to} if pad_to else None
    if (col in ("s", "m") and not pad_to) or w is None:  # 3- and 5-D stack only padded
        comps = [td.Component(mixed.table("a"), w, 1), td.Component(mixed.table("a"), w, 2,
                                                                     where="frame >= 3")]  # fmt: skip
    else:
        comps = [td.Component(mixed.table("a"), w, 1, pad_to=pads),
                 td.Component(mixed.table("c"), w, 2)]  # fmt: skip
    plan = td.Recipe(seed=3, batch_size=12, components=comps).plan()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = plan.stats([col], per_offset=per_offset)[col]
    for key, (v, wt) in _numpy_stats(plan, col, per_offset).items():
        assert int(got.count[key]) == len(v), key
        if not len(v):
            continue
        mean = np.average(v, weights=wt)
        np.testing.assert_allclose(got.mean[key], mean, rtol=1e-10, atol=1e-12)
        std = np.sqrt(np.average((v - mean) ** 2, weights=wt))
        np.testing.assert_allclose(got.std[key], std, rtol=1e-8, atol=1e-12)
        assert (got.min[key], got.max[key]) == (v.min(), v.max())
        for q in (0.01, 0.5, 0.99):
            g = got.quantile(q)[key]  # numpy's, or a tie numpy's float sum rounds past
            below, upto = wt[v < g].sum() / wt.sum(), wt[v <= g].sum() / wt.sum()
            want = np.quantile(v, q, weights=wt, method="inverted_cdf")
            assert g == want or below - 1e-12 <= q <= upto + 1e-12, (key, q, g, want)


def test_per_offset_keeps_the_offset_axis_of_a_one_offset_window(two):
    """``per_offset=True`` gives fields ``[T, *D]``; with ``T = 1`` they were ``[D]``, so
    ``mean[0]`` was dimension 0's mean where it is offset 0's vector for ``T > 1``."""
    for offsets in ([0], [0, 1]):
        w = td.Windows({"s": td.Rows(offsets, pad=True), "sp": td.Rows(offsets, pad=True)})
        got = _plan(two, w).stats(["s", "sp"], derive={"d": lambda b: b["s"] * 2},
                                  per_offset=True)  # fmt: skip
        t = len(offsets)
        assert got["s"].mean.shape == got["d"].mean.shape == (t, 3), offsets
        assert got["sp"].mean.shape == got["sp"].quantile(0.5).shape == (t,), offsets
        assert got["s"].count.shape == got["s"].q99.shape == (t, 3)


def test_a_derived_runs_view_copies(two):
    import copy

    from treadle.plan.exclude import drawn_from

    derived = _plan(two).exclude(episodes={"a": ["a1"]}, from_step=0)
    view = drawn_from(derived)
    assert drawn_from(derived) is view and drawn_from(_plan(two)) is not view
    assert copy.copy(view).eligible(0) == view.eligible(0) == 5 + 2  # a RecursionError

"""Adversarial checks of issue 49, section 4 (silent values and raw errors in plan.stats,
schedules, plan.exclude, EvalLoader and weights): each test failed before the fix committed
with it (the issue's closing note says what each saw)."""

from __future__ import annotations

import importlib
import shutil
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest

import treadle as td
from treadle.errors import PlanError, PlanWarning
from treadle.plan.exclude import drawn_from


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Table ``a``: episodes ``a0`` (x = 0..6) and ``a1`` (x = 10..14); table ``b``: ``b0``
    (x = 7..9). Scalar float32 ``x`` and a 2-D ``s``."""
    branch = td.Client(str(tmp_path_factory.mktemp("mix"))).project("p").branch()
    with branch.transaction("mix") as tx:
        for table, name, xs in (("a", "a0", range(7)), ("a", "a1", range(10, 15)),
                                ("b", "b0", range(7, 10))):  # fmt: skip
            x = np.asarray(list(xs), np.float32)
            tx.table(table).append_episode({"x": x, "s": np.stack([x, -x], 1)}, episode=name)
    return branch


def _one(branch, windows=None, **kw) -> td.Component:
    return td.Component(branch.table("a"), windows or td.Windows({"x": td.Rows([0])}), **kw)


# -- derive statistics are never read back for code that changed -------------------------
def _write(path, body: str) -> None:
    path.write_text(body)
    shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)
    importlib.invalidate_caches()


def test_a_derive_over_a_users_module_is_recomputed_after_the_module_changes(mix, tmp_path):
    """``feats.feature`` edited from ``return x`` to ``return 100 * x``, and then a module
    attribute it reads changed: each call without ``derive_version=`` computes afresh (the
    kept first result, mean 3.0, was served every time)."""
    mod = tmp_path / "feats_issue49.py"
    _write(mod, "SCALE = 1\n\ndef feature(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        feats = importlib.import_module("feats_issue49")
        plan = td.Recipe(seed=0, batch_size=4, components=[
            _one(mix, episodes=["a0"])]).plan()  # fmt: skip
        derive = {"f": lambda b: feats.feature(b["x"])}
        assert float(plan.stats(derive=derive)["f"].mean) == 3.0
        _write(mod, "SCALE = 1\n\ndef feature(x):\n    return 100 * x * SCALE\n")
        importlib.reload(feats)
        assert float(plan.stats(derive=derive)["f"].mean) == 300.0
        feats.SCALE = 2
        assert float(plan.stats(derive=derive)["f"].mean) == 600.0
        # a version is the caller's word that the code is the same: kept under it
        assert float(plan.stats(derive=derive, derive_version="v1")["f"].mean) == 600.0
        feats.SCALE = 3
        assert float(plan.stats(derive=derive, derive_version="v1")["f"].mean) == 600.0
        assert float(plan.stats(derive=derive, derive_version="v2")["f"].mean) == 900.0
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("feats_issue49", None)


def test_a_derive_version_is_checked(mix):
    plan = td.Recipe(seed=0, batch_size=4, components=[_one(mix)]).plan()
    with pytest.raises(PlanError, match="derive_version"):
        plan.stats(["x"], derive_version="v1")  # no derive to version
    for bad in ("", 3.5, ["v"]):
        with pytest.raises(PlanError, match="derive_version"):
            plan.stats(derive={"f": lambda b: b["x"]}, derive_version=bad)


# -- EvalLoader honours its batch size for a plan -----------------------------------------
def test_an_eval_loader_of_a_one_component_plan_takes_its_batch_size(mix):
    """``EvalLoader(plan, 10)`` over a plan of batch 4: batches of 10, ``len`` 2 (it gave
    batches of 4, ``len`` 3); ``EvalLoader(plan, 9, world_size=3)`` works (it was refused:
    "batch_size 4 is not divisible by world_size 3")."""
    plan = td.Recipe(seed=0, batch_size=4, components=[_one(mix)]).plan()  # 12 moments
    loader = td.EvalLoader(plan, 10)
    assert len(loader) == 2
    assert [len(b["_moment"]) for b in loader] == [10, 10]
    seen = []
    for r in range(3):
        ranked = td.EvalLoader(plan, 9, rank=r, world_size=3)
        got = list(ranked)
        assert [len(b["_moment"]) for b in got] == [3, 3]
        seen += [m for b in got for m, v in zip(b["_moment"].tolist(), b["_valid"].tolist()) if v]
    assert sorted(seen) == list(range(12))
    again = td.EvalLoader.from_state(td.EvalLoader(plan, 10).state_dict(), mix.project.client)
    assert again.batch_size == 10 and len(again) == 2


# -- pooled quantiles at exact ties --------------------------------------------------------
def test_pooled_quantiles_at_exact_ties_equal_numpys_weighted_inverted_cdf(mix):
    """A 0.7/0.3 mix of 7 and 3 values, each weighing exactly 1/10: q0.5 is 4.0 (it was
    5.0: float weights summed to just under 0.5)."""
    w = td.Windows({"x": td.Rows([0])})
    plan = td.Recipe(seed=0, batch_size=10, components=[
        td.Component(mix.table("a"), w, 0.7, episodes=["a0"]),
        td.Component(mix.table("b"), w, 0.3)]).plan()  # fmt: skip
    qs = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    got = plan.stats(["x"], quantiles=qs)["x"]
    values = np.arange(10, dtype=np.float64)
    for q in qs:
        want = np.quantile(values, q, weights=np.ones(10), method="inverted_cdf")
        assert float(got.quantile(q)) == float(want), q
    assert float(got.quantile(0.5)) == 4.0


# -- plan.exclude of episodes the run never draws -----------------------------------------
def test_excluding_an_episode_the_run_never_draws_is_refused(mix):
    """Outside ``episodes=`` or without a row matching ``where=``: refused (it was accepted,
    with a new run id and the parent's batches)."""
    only = td.Recipe(seed=0, batch_size=4, components=[_one(mix, episodes=["a0"])]).plan()
    with pytest.raises(PlanError, match="'a1'.*never draws"):
        only.exclude(episodes={"a": ["a1"]}, from_step=0)
    where = td.Recipe(seed=0, batch_size=4, components=[_one(mix, where="x < 5")]).plan()
    with pytest.raises(PlanError, match="'a1'.*never draws"):
        where.exclude(episodes={"a": ["a1"]}, from_step=0)
    some = td.Recipe(seed=0, batch_size=4, components=[_one(mix, where="x < 5 OR x > 12")])
    assert some.plan().exclude(episodes={"a": ["a0"]}, from_step=0).record.derived.moments == 5


def test_an_exclusion_counts_the_anchors_it_removes(mix):
    """A 3-offset window: ``a0``'s 7 rows hold 5 anchors, and the record says 5 (it said 7)."""
    w = td.Windows({"x": td.Rows([0, 1, 2])})
    plan = td.Recipe(seed=0, batch_size=4, components=[_one(mix, w)]).plan()
    derived = plan.exclude(episodes={"a": ["a0"]}, from_step=1)
    assert derived.record.derived.moments == 5 == plan.kept(0)[0] - drawn_from(derived).eligible(0)


# -- video statistics say their units ------------------------------------------------------
def test_the_repr_of_video_statistics_names_pixel_units():
    """A video ColumnStats says its values are pixels 0..255 before the spec's dtype,
    mean and std (its repr was the bare dataclass's)."""
    one = np.ones(3)
    video = td.ColumnStats(np.full(3, 10), one * 113.8, one, one * 0, one * 255, one, one,
                           video=True)  # fmt: skip
    assert "pixel" in repr(video) and "0..255" in repr(video)
    rows = td.ColumnStats(np.full(3, 10), one, one, one, one, one, one)
    assert "pixel" not in repr(rows) and "mean=" in repr(rows)


# -- bad inputs are named, not raw or silently read ----------------------------------------
def test_plan_stats_refuses_bad_arguments_by_name(mix):
    plan = td.Recipe(seed=0, batch_size=4, components=[_one(mix)]).plan()
    with pytest.raises(PlanError, match="columns"):
        plan.stats(5)  # a raw TypeError ('int' object is not iterable)
    with pytest.raises(PlanError, match="columns"):
        plan.stats([5])
    with pytest.raises(PlanError, match="per_offset"):
        plan.stats(["x"], per_offset="no")  # read as True
    with pytest.raises(PlanError, match="by_component"):
        plan.stats(["x"], by_component="no")
    with pytest.raises(PlanError, match="derive 'f'.*numbers"):
        plan.stats(derive={"f": lambda b: np.full(len(b["x"]), "a")})  # a raw ValueError
    with pytest.raises(PlanError, match="derive 'f'.*complex"):
        plan.stats(derive={"f": lambda b: b["x"] * 1j})  # imaginary part dropped


def test_a_component_never_drawn_by_its_schedule_warns(mix):
    """Weight 0 in every stage: a PlanWarning naming it (it was accepted silently)."""
    comps = [_one(mix), td.Component(mix.table("b"), td.Windows({"x": td.Rows([0])}))]
    schedule = td.Schedule([(0, [1, 0]), (5, td.Ramp([2, 0], steps=4))])
    with pytest.warns(PlanWarning, match="component 1 .*'b'.* never drawn"):
        td.Recipe(seed=0, batch_size=4, components=comps, schedule=schedule).plan()
    drawn = td.Schedule([(0, [1, 0]), (5, [1, 1])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        td.Recipe(seed=0, batch_size=4, components=comps, schedule=drawn).plan()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_numpy_float_weight_is_the_decimal_it_prints_as(mix, dtype):
    """``np.float32(0.3)`` prints as 0.3 and is planned as 3/10, exactly and without a
    warning (it was 300001/1000000 with a PlanWarning)."""
    comps = [_one(mix, weight=dtype(0.3)),
             td.Component(mix.table("b"), td.Windows({"x": td.Rows([0])}), weight=0.7)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        plan = td.Recipe(seed=0, batch_size=10, components=comps).plan()
    assert plan.weights == (Fraction(3, 10), Fraction(7, 10)) == plan.asked_weights
    staged = td.Schedule([(0, [dtype(0.3), 0.7]), (3, [0.5, dtype(0.5)])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        td.Recipe(seed=0, batch_size=10, components=comps, schedule=staged).plan()

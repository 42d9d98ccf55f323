"""plan.exclude on a derived run composes: the run it derives from, with the slots of the
newly excluded episodes redrawn from its step on, whatever the order of the steps."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.card import render_card
from treadle.plan.exclude import drawn_from
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord

# grasps: ep0 rows 0..11, ep1 12..31, ep2 32..40, ep3 41..55; pushes: ep0 0..29, ep1 30..37
GRASPS = {"ep0": (0, 12), "ep1": (12, 32), "ep2": (32, 41), "ep3": (41, 56)}
PUSHES = {"ep0": (0, 30), "ep1": (30, 38)}
S1 = 30


@pytest.fixture(scope="module")
def runs():
    a = FakeTable("grasps", [12, 20, 9, 15])
    b = FakeTable("pushes", [30, 8])
    comps = [
        td.Component(FakeRef(a), weight=0.5),
        td.Component(FakeRef(b), weight=0.3),
        td.Component(FakeRef(a), weight=0.2, episodes=["ep1", "ep2", "ep3"]),
    ]
    parent = td.Recipe(5, 20, comps).plan()
    first = parent.exclude(episodes={"grasps": ["ep1"]}, from_step=S1)
    return parent, first, [a, b]


def _in(batch, grasps=(), pushes=()):
    """Slots whose moment lies in the named episodes (components 0, 2: grasps; 1: pushes)."""
    m, c = batch.moment, batch.component
    out = np.zeros(len(m), bool)
    for eps, comps in ((GRASPS, (0, 2)), (PUSHES, (1,))):
        names = grasps if eps is GRASPS else pushes
        for n in names:
            lo, hi = eps[n]
            out |= np.isin(c, comps) & (m >= lo) & (m < hi)
    return out


@pytest.mark.parametrize("s2", [50, 10, S1])
def test_a_second_exclusion_changes_only_its_slots(runs, s2):
    parent, first, _ = runs
    second = first.exclude(episodes={"grasps": ["ep3"], "pushes": ["ep0"]}, from_step=s2)
    changed = 0
    for step in [*range(0, 90), 10**12]:
        f, s = first.batch(step), second.batch(step)
        assert np.array_equal(f.component, s.component) and np.array_equal(f.draw, s.draw)
        bad = _in(f, grasps=["ep3"], pushes=["ep0"])
        if step < s2:
            assert np.array_equal(f.moment, s.moment)
            continue
        assert np.array_equal(f.moment[~bad], s.moment[~bad])
        assert not _in(s, grasps=["ep3"], pushes=["ep0"]).any()  # redrawn elsewhere
        if step >= S1:
            assert not _in(s, grasps=["ep1"]).any()  # and never into the first exclusion
        changed += int(bad.sum())
        two = s.moment[s.component == 2]  # component 2 keeps to its episodes left
        assert (((two >= 32) & (two < 41)) | ((two >= 12) & (two < 32)) * (step < S1)).all()
    assert changed > 0


def test_the_record_chains_resumes_and_says_so(runs):
    parent, first, tables = runs
    second = first.exclude(episodes={"grasps": ["ep3", "ep1"]}, from_step=50)  # ep1: already
    d = second.record.to_dict()["derived"]
    assert d["parent"] == first.run_id and d["episodes"] == {"grasps": ["ep3"]}
    assert d["moments"] == 15 and d["earlier"] == [first.record.to_dict()["derived"]]
    assert "earlier" not in first.record.to_dict()["derived"]  # a first derivation as before
    assert len({parent.run_id, first.run_id, second.run_id}) == 3
    again = Plan.from_record(RunRecord.from_json(second.record.to_json()), FakeClient(tables))
    assert again.run_id == second.run_id
    for step in (0, S1, 49, 50, 77, 10**12):
        whole = second.batch(step)
        assert np.array_equal(again.batch(step).moment, whole.moment)
        for w in (2, 4, 5):
            for r in range(w):
                assert np.array_equal(second.batch(step, r, w).moment, whole.moment[r::w])
    card = render_card(second.record)
    assert f"derived from {parent.run_id} at step 30, excluding 1 episode (20 moments)" in card
    assert f"derived from {first.run_id} at step 50, excluding 1 episode (15 moments)" in card
    # what it draws from its last step on: neither exclusion's moments
    kept = drawn_from(second)
    assert [kept.eligible(c) for c in range(3)] == [56 - 35, 38, 9]
    third = second.exclude(episodes={"pushes": ["ep1"]}, from_step=60)
    assert len(third.record.derived.stages) == 3
    assert not _in(third.batch(61), grasps=["ep1", "ep3"]).any()
    assert (third.batch(61).moment[third.batch(61).component == 1] < 30).all()


def test_a_thrice_derived_run_resumes_from_its_record(runs):
    """The record lists every stage once, flat: a third derivation wrote the second stage
    with its own earlier stages inside, a chain its own record refused to read back, so a
    run derived three times could not resume (nor checkpoint, nor feed workers)."""
    _, first, tables = runs
    second = first.exclude(episodes={"grasps": ["ep3"]}, from_step=50)
    third = second.exclude(episodes={"pushes": ["ep1"]}, from_step=60)
    fourth = third.exclude(episodes={"grasps": ["ep0"]}, from_step=40)
    for run in (third, fourth):
        d = run.record.to_dict()["derived"]
        assert all("earlier" not in e for e in d["earlier"])
        assert [e["from_step"] for e in d["earlier"]] == [S1, 50, 60][: len(d["earlier"])]
        again = Plan.from_record(RunRecord.from_json(run.record.to_json()), FakeClient(tables))
        assert again.run_id == run.run_id
        for step in (0, 45, 55, 61, 10**12):
            assert np.array_equal(again.batch(step).moment, run.batch(step).moment)
    assert not _in(fourth.batch(61), grasps=["ep0", "ep1", "ep3"], pushes=["ep1"]).any()


def test_naming_only_excluded_episodes_or_too_many_is_refused(runs):
    _, first, _ = runs
    with pytest.raises(PlanError, match="already excludes every episode named"):
        first.exclude(episodes={"grasps": ["ep1"]}, from_step=40)
    with pytest.raises(PlanError, match="component 2 .* no moments left"):
        first.exclude(episodes={"grasps": ["ep2", "ep3"]}, from_step=40)


def test_an_excluded_episode_named_again_from_an_earlier_step_goes_from_that_step(runs):
    """first excludes grasps' ep1 from step 30; naming it again from step 10 excludes it from
    step 10. It was taken as already excluded and left out, so steps 10..29 still drew it
    (and naming only it was refused as changing nothing)."""
    parent, first, _ = runs
    again = first.exclude(episodes={"grasps": ["ep1"]}, from_step=10)
    assert again.record.to_dict()["derived"]["episodes"] == {"grasps": ["ep1"]}
    both = first.exclude(episodes={"grasps": ["ep1", "ep3"]}, from_step=10)
    assert both.record.to_dict()["derived"]["episodes"] == {"grasps": ["ep1", "ep3"]}
    changed = 0
    for step in [*range(0, 40), 10**12]:
        f, a = first.batch(step), again.batch(step)
        if step < 10:
            assert np.array_equal(f.moment, a.moment)
            continue
        assert not _in(a, grasps=["ep1"]).any() and not _in(both.batch(step), grasps=["ep1"]).any()
        bad = _in(f, grasps=["ep1"])
        assert np.array_equal(f.moment[~bad], a.moment[~bad])  # only ep1's slots change
        changed += int(bad.sum())
    assert changed > 0
    with pytest.raises(PlanError, match="already excludes every episode named"):
        first.exclude(episodes={"grasps": ["ep1"]}, from_step=S1)  # from the same step: nothing


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    from embodiment_helpers import make_robots

    return make_robots(str(tmp_path_factory.mktemp("robots")), video=False)


def test_a_twice_derived_run_resumes_evaluates_and_has_its_statistics(robots):
    w = td.Windows({"state": td.Rows([0, 1], pad=True)})
    arm = robots.table("arm4")
    plan = td.Recipe(3, 4, [td.Component(arm, w)]).plan()
    twice = plan.exclude(episodes={"arm4": ["arm4-0"]}, from_step=2).exclude(
        episodes={"arm4": ["arm4-2"]}, from_step=4
    )
    steps = [b["_moment"].tolist() for b in td.TrainLoader(twice, steps=9)]
    loader = td.TrainLoader(twice, steps=9)
    for _, _ in zip(range(5), loader):
        pass
    state = loader.state_dict()
    again = td.TrainLoader.from_state(state, robots.project.client, steps=9)
    assert [b["_moment"].tolist() for b in again] == steps[5:9]
    lo, hi = 9, 9 + 6  # arm4-1: rows 9..14, the one episode left after step 4
    assert all(lo <= m < hi for s in steps[4:] for m in s)
    evaluated = [m for b in td.EvalLoader(twice) for m, v in zip(b["_moment"], b["_valid"]) if v]
    assert sorted(int(m) for m in evaluated) == list(range(lo, hi))
    only = td.Recipe(3, 4, [td.Component(arm, w, episodes=["arm4-1"])]).plan()
    got, want = twice.stats(["state"])["state"], only.stats(["state"])["state"]
    for f in ("count", "mean", "std", "min", "max", "q01", "q99"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)

"""plan.exclude: a derived run that redraws only the slots of excluded episodes."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.card import render_card
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord

FROM = 30


@pytest.fixture(scope="module")
def runs():
    a = FakeTable("grasps", [12, 20, 9, 15])
    b = FakeTable("pushes", [30, 8])
    comps = [
        td.Component(FakeRef(a), weight=0.5),
        td.Component(FakeRef(b), weight=0.3),
        td.Component(FakeRef(a), weight=0.2, episodes=["ep1", "ep2"]),
    ]
    parent = td.Recipe(5, 20, comps).plan()
    derived = parent.exclude(episodes={"grasps": ["ep1", "ep3"]}, from_step=FROM)
    return parent, derived, [a, b]


def excluded(plan, batch):
    """Slots of a batch whose moment lies in grasps' ep1 (rows 12..31) or ep3 (41..55)."""
    on_a = np.isin(batch.component, [0, 2])
    m = batch.moment
    return on_a & (((m >= 12) & (m < 32)) | ((m >= 41) & (m < 56)))


def test_only_the_slots_of_excluded_episodes_change(runs):
    parent, derived, _ = runs
    changed = 0
    for step in [*range(0, 80), 10**12]:
        p, d = parent.batch(step), derived.batch(step)
        assert np.array_equal(p.component, d.component) and np.array_equal(p.draw, d.draw)
        assert np.array_equal(parent.counts(step), derived.counts(step))
        if step < FROM:
            assert np.array_equal(p.moment, d.moment)
            continue
        bad = excluded(parent, p)
        assert np.array_equal(p.moment[~bad], d.moment[~bad])
        assert not excluded(derived, d).any()  # every redraw is a moment not excluded
        changed += int(bad.sum())
        # component 2 (episodes ep1, ep2) keeps to ep2 (rows 32..40)
        two = d.moment[d.component == 2]
        assert ((two >= 32) & (two < 41)).all()
    assert changed > 0


def test_the_derived_record_names_its_parent_and_resumes_at_any_rank_count(runs):
    parent, derived, tables = runs
    assert derived.run_id != parent.run_id
    d = derived.record.to_dict()["derived"]
    assert d == {
        "parent": parent.run_id,
        "from_step": FROM,
        "episodes": {"grasps": ["ep1", "ep3"]},
        "moments": 35,
    }
    again = Plan.from_record(RunRecord.from_json(derived.record.to_json()), FakeClient(tables))
    assert again.run_id == derived.run_id
    for step in (0, FROM, FROM + 7, 10**12):
        whole = derived.batch(step)
        assert np.array_equal(again.batch(step).moment, whole.moment)
        for w in (2, 4, 5, 10):
            for r in range(w):
                assert np.array_equal(derived.batch(step, r, w).moment, whole.moment[r::w])


def test_the_card_says_what_was_derived(runs):
    parent, derived, _ = runs
    card = render_card(derived.record)
    assert f"derived from {parent.run_id} at step 30, excluding 2 episodes (35 moments)" in card


@pytest.mark.parametrize(
    ("episodes", "match"),
    [
        ({"nope": ["ep1"]}, "table 'nope' is not read"),
        ({"grasps": ["ep9"]}, "has no episode 'ep9'"),
        ({"grasps": ["ep1", "ep2"]}, "component 2 .* no moments left"),
        ({}, "episodes must be"),
    ],
)
def test_bad_exclusions(runs, episodes, match):
    with pytest.raises(PlanError, match=match):
        runs[0].exclude(episodes=episodes, from_step=3)


def test_a_derived_run_derives_again(runs):
    """Composes (tests/test_plan_exclude_again.py has the rest): it was refused."""
    again = runs[1].exclude(episodes={"pushes": ["ep0"]}, from_step=40)
    assert again.record.derived.parent == runs[1].run_id

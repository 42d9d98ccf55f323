"""plan.exclude: a derived run that redraws only the slots of excluded episodes."""

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


@pytest.mark.parametrize("shuffle", [None, td.BlockShuffle(block_rows=4, window_blocks=2)])
def test_a_name_read_on_two_branches_excludes_its_episodes_from_each(shuffle):
    """Two pinned tables of one name (main's and a branch's, another version): each component
    drops the named episodes' rows of its own table. It took every table's rows from the last
    one's episode index, so main's ep1 (rows 10..19) stayed and rows 3..5 went instead."""
    main = FakeTable("grasps", [10, 10, 10], version=1)
    exp = FakeTable("grasps", [3] * 10, version=2, commit="beef" + "0" * 60)
    comps = [td.Component(FakeRef(main), weight=1), td.Component(FakeRef(exp, "exp"), weight=1)]
    parent = td.Recipe(5, 8, comps, shuffle=shuffle).plan()
    assert [t.name for t in parent.record.tables] == ["grasps", "grasps"]
    gone = {0: {"ep1": (10, 20)}, 1: {"ep1": (3, 6), "ep7": (21, 24)}}  # ep7: only exp's
    derived = parent.exclude(episodes={"grasps": ["ep1", "ep7"]}, from_step=2)
    assert derived.record.to_dict()["derived"]["moments"] == 10 + 3 + 3
    again = Plan.from_record(RunRecord.from_json(derived.record.to_json()), FakeClient([main, exp]))
    changed = 0
    for step in range(2, 60):
        p, d = parent.batch(step), derived.batch(step)
        assert np.array_equal(again.batch(step).moment, d.moment)
        for c, ranges in gone.items():
            bad_p = np.zeros(len(p.moment), bool)
            for lo, hi in ranges.values():
                bad_p |= (p.component == c) & (p.moment >= lo) & (p.moment < hi)
                assert not ((d.component == c) & (d.moment >= lo) & (d.moment < hi)).any()
            keep = (p.component == c) & ~bad_p
            assert np.array_equal(p.moment[keep], d.moment[keep])
            changed += int(bad_p.sum())
    assert changed > 0
    stats_view = drawn_from(derived)
    assert [stats_view.eligible(c) for c in range(2)] == [20, 24]


def test_the_loader_drops_an_episode_of_a_name_read_on_two_branches(tmp_path):
    """The same through the loader, on real tables: main's and exp's `a` (other episodes)."""
    project = td.Client(str(tmp_path), create=True).project("p")
    main = project.branch()
    main.table("other").append({"x": np.zeros(1, np.float32)})
    exp = project.create_branch("exp", from_="main")
    for tag, branch, lengths in ((0, main, [3, 5, 2]), (1, exp, [6, 1, 4, 2])):
        for e, n in enumerate(lengths):
            value = np.stack([np.full(n, tag), np.full(n, e), np.arange(n)], 1)
            branch.table("a").append_episode({"v": value.astype(np.float32)}, episode=f"e{e}")
    w = td.Windows({"v": td.Rows([0])})
    comps = [td.Component(main.table("a"), w), td.Component(exp.table("a"), w)]
    plan = td.Recipe(seed=1, batch_size=6, components=comps).plan()
    derived = plan.exclude(episodes={"a": ["e1"]}, from_step=2)
    for step, batch in enumerate(td.TrainLoader(derived, steps=8)):
        v = batch["v"][:, 0].numpy()
        assert np.array_equal(v[:, 0], batch["_component"].numpy())  # each its own table
        assert step < 2 or not (v[:, 1] == 1).any()

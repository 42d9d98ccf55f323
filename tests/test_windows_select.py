"""Selection without an export: ``where=``/``episodes=`` on a component, episode splits."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from treadle.errors import PlanError
from treadle.plan.select import intersect_runs

LENGTHS = (6, 11, 4, 9, 7)


def _branch(root, lengths=LENGTHS, name="demo"):
    branch = td.Client(root).project("robotics").branch()
    with branch.transaction("episodes") as tx:
        for e, n in enumerate(lengths):
            tx.table(name).append_episode(
                {
                    "success": np.arange(n) % 3 == 0,
                    "value": np.arange(n, dtype=np.int64) + 100 * e,
                },
                episode=f"ep-{e}",
            )
    return branch


def _rows(branch, name="demo"):
    t = branch.table(name).to_arrow(["episode", "frame", "success", "value"])
    return {k: np.asarray(t.column(k).to_pylist()) for k in t.column_names}


def _drawn(plan, component, n):
    return plan.moments(component, np.arange(n))


def test_where_and_episodes_draw_only_selected_anchors_and_cover_them(tmp_path):
    branch = _branch(str(tmp_path))
    rows = _rows(branch)
    windows = td.Windows({"value": td.Rows(range(-1, 2))})  # unpadded: drops each episode's ends
    comp = td.Component(
        branch.table("demo"), windows, where="success", episodes=["ep-1", "ep-3", "ep-4"]
    )
    plan = td.Recipe(seed=5, batch_size=4, components=[comp]).plan()
    starts = np.cumsum((0, *LENGTHS))[:-1]
    want = {int(starts[e] + f) for e in (1, 3, 4) for f in range(1, LENGTHS[e] - 1) if f % 3 == 0}
    assert plan.eligible(0) == len(want)
    epoch = _drawn(plan, 0, len(want))
    assert set(epoch.tolist()) == want and len(set(epoch.tolist())) == len(want)  # once each
    assert set(_drawn(plan, 0, 3 * len(want)).tolist()) == want
    # window rows around an anchor still come from the whole episode
    batch = next(iter(td.TrainLoader(plan, steps=1)))
    m = batch["_moment"].numpy()
    np.testing.assert_array_equal(batch["value"].numpy(), rows["value"][m[:, None] + [-1, 0, 1]])
    assert rows["success"][m].all()
    record = plan.record.to_dict()["components"][0]
    assert record["where"] == "success" and record["episodes"] == ["ep-1", "ep-3", "ep-4"]
    assert record["eligible"] == len(want)
    # rebuilt from its record: same draws
    again = td.Plan.from_record(plan.record.to_json(), branch.project.client)
    np.testing.assert_array_equal(_drawn(again, 0, 40), _drawn(plan, 0, 40))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_a_selected_component_mixed_with_a_full_one_keeps_exact_shares(tmp_path, world):
    branch = _branch(str(tmp_path))
    table = branch.table("demo")
    plan = td.Recipe(
        seed=9,
        batch_size=8,
        components=[
            td.Component(table, None, weight=0.25, where="value >= 300"),
            td.Component(table, None, weight=0.75),
        ],
    ).plan()
    rows = _rows(branch)
    total = Counter()
    for step in range(20):
        counts = Counter()
        for rank in range(world):
            b = plan.batch(step, rank, world)
            counts.update(b.component.tolist())
            assert (rows["value"][b.moment[b.component == 0]] >= 300).all()
        assert counts == {0: 2, 1: 6}
        total.update(counts)
    assert total == {0: 40, 1: 120}


def test_run_id_changes_with_where_and_episodes_not_with_ranks(tmp_path):
    branch = _branch(str(tmp_path))
    table = branch.table("demo")

    def run_id(**kw):
        return td.Recipe(1, 4, [td.Component(table, None, **kw)]).plan().run_id

    ids = {
        run_id(),
        run_id(where="success"),
        run_id(where="value > 3"),
        run_id(episodes=["ep-0"]),
        run_id(episodes=["ep-0", "ep-1"]),
    }
    assert len(ids) == 5
    assert run_id(episodes=["ep-1", "ep-0"]) == run_id(episodes=["ep-0", "ep-1"])
    # the rank count never enters the run
    plan = td.Recipe(1, 4, [td.Component(table, None, where="success")]).plan()
    states = [
        td.TrainLoader(plan, rank=0, world_size=w).state_dict()["record"]["run_id"]
        for w in (1, 2, 4)
    ]
    assert states == [plan.run_id] * 3


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"where": "nope > 3"}, r"component 0 \(table 'demo'\).*nope"),
        ({"where": "value >>> 3"}, r"component 0 \(table 'demo'\).*value >>> 3"),
        ({"where": "value"}, r"not a predicate"),
        ({"where": "value > 10000"}, r"component 0 \(table 'demo'\) selects no anchors.*10000"),
        ({"episodes": ["ep-9", "x"]}, r"component 0 .*'ep-9', 'x'.*not episodes"),
        ({"episodes": "ep-0"}, r"episodes must be a list"),
        ({"episodes": []}, r"selects nothing"),
    ],
)
def test_bad_selection_is_a_plan_error_naming_it(tmp_path, kw, match):
    branch = _branch(str(tmp_path))
    with pytest.raises(PlanError, match=match):
        td.Recipe(1, 4, [td.Component(branch.table("demo"), None, **kw)]).plan()


def test_unknown_episodes_list_at_most_five(tmp_path):
    branch = _branch(str(tmp_path))
    bad = [f"nope-{i}" for i in range(8)]
    with pytest.raises(PlanError, match=r"and 3 more") as e:
        td.Recipe(1, 4, [td.Component(branch.table("demo"), None, episodes=bad)]).plan()
    assert "nope-5" not in str(e.value)


def test_splits_are_disjoint_cover_and_stay_put(tmp_path):
    branch = _branch(str(tmp_path), lengths=(3,) * 40)
    before = td.split_episodes(branch.table("demo"), {"train": 0.8, "val": 0.2}, seed=3)
    names = branch.table("demo").pin().episodes().names
    assert sorted(before["train"] + before["val"]) == sorted(names)
    assert not set(before["train"]) & set(before["val"])
    assert 0 < len(before["val"]) < 40
    with branch.transaction("more") as tx:
        for e in range(40, 80):
            tx.table("demo").append_episode(
                {"success": np.ones(3, bool), "value": np.arange(3)}, episode=f"ep-{e}"
            )
    after = td.split_episodes(branch.table("demo"), {"train": 0.8, "val": 0.2}, seed=3)
    for split in ("train", "val"):
        assert set(before[split]) <= set(after[split])
    assert td.split_episodes(branch.table("demo"), {"train": 0.8, "val": 0.2}, seed=4) != after
    plan = td.Recipe(1, 2, [td.Component(branch.table("demo"), None, episodes=after["val"])]).plan()
    assert plan.eligible(0) == 3 * len(after["val"])
    with pytest.raises(PlanError, match="positive"):
        td.split_episodes(branch.table("demo"), {"train": 0})


def test_split_of_a_table_without_episodes_is_an_error(tmp_path):
    branch = td.Client(str(tmp_path)).project("robotics").branch()
    with branch.transaction("rows") as tx:
        tx.table("flat").append({"x": np.arange(10)})
    with pytest.raises(PlanError, match=r"'flat' has no episodes.*where="):
        td.split_episodes(branch.table("flat"), {"train": 0.8, "val": 0.2})


def _runs(draw, n):
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=12)))
    pairs = list(zip(cuts[::2], cuts[1::2]))
    return [(a, b) for a, b in pairs if a < b]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_intersect_runs_matches_a_set_reference(data):
    a = _runs(data.draw, 60)
    b = _runs(data.draw, 60)

    def arr(r):
        return np.asarray([x for x, _ in r], np.int64), np.asarray([y for _, y in r], np.int64)

    begin, end = intersect_runs(arr(a), arr(b))
    got = {i for x, y in zip(begin, end) for i in range(x, y)}
    want = {i for x, y in a for i in range(x, y)} & {i for x, y in b for i in range(x, y)}
    assert got == want
    assert (begin < end).all() and (begin[1:] >= end[:-1]).all()


def test_select_runs_join_across_scan_batches(tmp_path):
    branch = td.Client(str(tmp_path)).project("p").branch()
    branch.table("flat").append({"x": np.arange(20_000, dtype=np.int64)})
    begin, end = branch.table("flat").pin().select_runs("(x >= 8000 AND x < 9000) OR x % 5000 = 1")
    assert list(zip(begin.tolist(), end.tolist())) == [
        (1, 2),
        (5001, 5002),
        (8000, 9000),
        (10001, 10002),
        (15001, 15002),
    ]

"""Run records: JSON round trip, strict parsing, and what does and does not change run_id."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import ALGORITHM, LEGACY_ALGORITHM, RunRecord
from treadle.plan.windows import Rows, Video, Windows

W = Windows({"cam": Video(range(8)), "action": Rows(range(8))})


def make(
    seed=2048,
    batch_size=64,
    weights=(0.3, 0.7),
    versions=(3, 4),
    commits=("a" * 64, "b" * 64),
    windows=(W, W),
    names=("fails", "nominal"),
    project="robotics",
    branch="main",
):
    comps = []
    for i, w in enumerate(weights):
        t = FakeTable(
            names[i],
            [20, 30, 12],
            version=versions[i],
            commit=commits[i],
            project=project,
            video=("cam",),
        )
        comps.append(Component(FakeRef(t, branch=branch), windows[i], weight=w))
    return Recipe(seed, batch_size, comps).plan().record


def test_record_has_the_documented_fields():
    r = make()
    d = json.loads(r.to_json())
    assert d["algorithm"] == ALGORITHM == "treadle.plan/2"
    assert (d["project"], d["seed"], d["batch_size"], d["weight_denominator"]) == (
        "robotics",
        2048,
        64,
        10,
    )
    assert d["tables"][0] == {
        "name": "fails",
        "branch": "main",
        "commit": "a" * 64,
        "version": 3,
        "num_moments": 62,
        "num_episodes": 3,
    }
    assert d["components"][1] == {
        "table": 1,
        "windows": W.to_json(),
        "weight": 0.7,
        "weight_quantised": 7,
        "eligible": 13 + 23 + 5,
    }
    assert d["run_id"] == r.run_id and len(r.run_id) == 16
    int(r.run_id, 16)
    assert json.loads(r.to_json(indent=2)) == d


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.integers(1, 512),
    # Ratios up to 100: shares of 1% or more, never moved by more than 1e-4 of themselves.
    st.lists(st.floats(0.1, 10, allow_nan=False), min_size=2, max_size=2),
)
def test_json_round_trip(seed, batch_size, weights):
    r = make(seed=seed, batch_size=batch_size, weights=tuple(weights))
    again = RunRecord.from_json(r.to_json())
    assert again == r and again.run_id == r.run_id
    assert RunRecord.from_json(json.loads(r.to_json(indent=1))) == r
    assert RunRecord.from_json(r.to_json().encode()) == r


def test_run_id_changes_with_everything_that_determines_batches():
    base = make().run_id
    changed = {
        "seed": make(seed=2049),
        "batch size": make(batch_size=32),
        "weights": make(weights=(0.31, 0.69)),
        "weight order": make(weights=(0.7, 0.3)),
        "table version": make(versions=(3, 5)),
        "windows": make(windows=(W, Windows({"cam": Video(range(9)), "action": Rows(range(8))}))),
        "window transform": make(
            windows=(W, Windows({"cam": Video(range(8), size=(64, 64)), "action": Rows(range(8))}))
        ),
        "no windows": make(windows=(None, None)),  # (W, None) cannot stack: refused
        "table name": make(names=("fails", "other")),
        "project": make(project="other"),
    }
    ids = {k: r.run_id for k, r in changed.items()}
    assert base not in ids.values(), ids
    assert len(set(ids.values())) == len(ids)


def test_run_id_ignores_commit_ids_branches_and_equivalent_weights():
    base = make().run_id
    # A checkpoint commit that leaves the table versions alone does not start a new run.
    assert make(commits=("c" * 64, "d" * 64)).run_id == base
    assert make(branch="exp").run_id == base
    # Weights that normalise to the same shares are the same run; another exact share is not
    # (weights used to be rounded to 1/1000, so 0.3001 planned as 0.3).
    assert make(weights=(3, 7)).run_id == base
    assert make(weights=(30, 70)).run_id == base
    assert make(weights=(0.3001, 0.7)).run_id != base


def test_rank_count_never_enters_the_record():
    r = make()
    text = r.to_json()
    assert "world" not in text and "rank" not in text
    assert set(json.loads(text)) == {
        "algorithm",
        "project",
        "seed",
        "batch_size",
        "weight_denominator",
        "tables",
        "components",
        "run_id",
    }


def _scale_numerators(d, k):
    """Numerators and denominator times k: the same shares, but not how they are planned."""
    for c in d["components"]:
        c["weight_quantised"] *= k
    d["weight_denominator"] *= k


def _bad(mutate):
    d = json.loads(make().to_json())
    mutate(d)
    return d


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("seed"), "'seed'"),
        (lambda d: d.update(seed=-1), "'seed'"),
        (lambda d: d.update(seed=2**64), "'seed'"),
        (lambda d: d.update(seed="1"), "'seed'"),
        (lambda d: d.update(seed=True), "'seed'"),
        (lambda d: d.update(batch_size=0), "'batch_size'"),
        (lambda d: d.update(batch_size=1.5), "'batch_size'"),
        (lambda d: d.update(algorithm="treadle.plan/0"), "'algorithm'"),
        (lambda d: d.update(project=""), "'project'"),
        (lambda d: d.update(extra=1), "'extra'"),
        (lambda d: d.update(tables=[]), "'tables'"),
        (lambda d: d.update(components=[]), "'components'"),
        (lambda d: d["tables"][0].pop("version"), "'version'"),
        (lambda d: d["tables"][0].update(version="3"), "'version'"),
        (lambda d: d["tables"][0].update(branch=3), "'branch'"),
        (lambda d: d["components"][0].update(table=7), "'table'"),
        (lambda d: d["components"][0].update(weight_quantised=301), "weight_denominator"),
        (lambda d: d["components"][0].update(weight_quantised=0), "'weight_quantised'"),
        (lambda d: d["components"][0].update(weight=0.31), "do not match its weights"),
        (lambda d: _scale_numerators(d, 2), "do not match its weights"),
        (lambda d: d["components"][0].update(weight="0.3"), "'weight'"),
        (lambda d: d["components"][0].update(weight=-1.0), "'weight'"),
        (lambda d: d["components"][0].update(windows=[1]), "'windows'"),
        (lambda d: d["components"][0].update(windows={"cam": {"kind": "pixels"}}), "'windows'"),
        (lambda d: d["components"][0].update(eligible=0), "'eligible'"),
        (lambda d: d["components"][0].update(eligible=10**9), "'eligible'"),
        (lambda d: d["components"][0].update(colour=1), "'colour'"),
        (lambda d: d.update(seed=d["seed"] + 1), "'run_id'"),
        (lambda d: d.update(run_id="0" * 16), "'run_id'"),
    ],
)
def test_from_json_rejects_bad_fields_by_name(mutate, field):
    with pytest.raises(PlanError) as e:
        RunRecord.from_json(_bad(mutate))
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("text", ["", "{", "[]", "3", "null", b"\xff"])
def test_from_json_rejects_non_objects(text):
    with pytest.raises(PlanError, match="run record"):
        RunRecord.from_json(text)


# Written by treadle before shares were exact (weights rounded to k/1000): 0.0004 became 1/1000.
LEGACY = (
    '{"algorithm":"treadle.plan/1","batch_size":12,"components":[{"eligible":53,"table":0,'
    '"weight":0.3,"weight_quantised":300,"windows":{"action":{"kind":"rows","offsets":{"range":'
    '[0,4]}}}},{"eligible":49,"table":1,"weight":0.6996,"weight_quantised":699,"windows":null},'
    '{"eligible":12,"table":2,"weight":0.0004,"weight_quantised":1,"windows":{"action":{"kind":'
    '"rows","offsets":{"range":[0,4]}}}}],"project":"robotics","run_id":"00f00edb5e926d16",'
    '"seed":2048,"tables":[{"branch":"main","commit":"' + "a" * 64 + '","name":"fails",'
    '"num_episodes":3,"num_moments":62,"version":3},{"branch":"main","commit":"' + "b" * 64 + '",'
    '"name":"nominal","num_episodes":2,"num_moments":49,"version":4},{"branch":"main","commit":"'
    + "c" * 64
    + '","name":"rare","num_episodes":1,"num_moments":15,"version":1}],"weight_denominator":1000}'
)
LEGACY_BATCHES = {  # step: (components, moments), as that treadle planned them
    0: ([0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0], [46, 16, 40, 32, 18, 19, 25, 26, 28, 22, 38, 52]),
    999: ([0, 2, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1], [58, 4, 30, 10, 29, 33, 19, 28, 29, 23, 17, 27]),
    10**12: ([0, 1, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1], [20, 23, 8, 46, 14, 44, 24, 17, 18, 12, 45, 30]),
}


def _legacy_tables():
    return [
        FakeTable("fails", [20, 30, 12], version=3, commit="a" * 64),
        FakeTable("nominal", [40, 9], version=4, commit="b" * 64),
        FakeTable("rare", [15], version=1, commit="c" * 64),
    ]


def test_a_legacy_record_resumes_with_its_rounded_weights_and_the_same_batches():
    record = RunRecord.from_json(LEGACY)
    assert record.algorithm == LEGACY_ALGORITHM and record.run_id == "00f00edb5e926d16"
    assert record.weights[2] == Fraction(1, 1000)  # as it was planned
    assert record.asked_weights[2] == Fraction(1, 2500)  # as it was asked
    assert json.loads(record.to_json()) == json.loads(LEGACY)
    plan = Plan.from_record(record, FakeClient(_legacy_tables()))
    for step, (components, moments) in LEGACY_BATCHES.items():
        batch = plan.batch(step)
        assert (batch.component.tolist(), batch.moment.tolist()) == (components, moments)
    assert plan.cumulative(10**12) == [3600000000000, 8388000000000, 12000000000]
    # The same recipe planned now is a new run with the share asked for.
    w = Windows({"action": Rows(range(4))})
    tables = _legacy_tables()
    comps = [
        Component(FakeRef(t), win, c.weight)
        for t, win, c in zip(tables, [w, None, w], record.components)
    ]
    now = Recipe(2048, 12, comps).plan()
    assert now.record.algorithm == ALGORITHM and now.run_id != record.run_id
    assert now.record.weights == now.record.asked_weights
    assert now.record.weights[2] == Fraction(1, 2500)


def test_a_legacy_record_must_keep_its_thousandths():
    d = json.loads(LEGACY)
    del d["run_id"]
    _scale_numerators(d, 2)
    with pytest.raises(PlanError, match="'weight_denominator' of a 'treadle.plan/1' record"):
        RunRecord.from_json(d)

"""``Recipe(..., weigh_by="moments")``: each share ∝ weight × eligible moments (issue 45 §2)."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction
from math import ceil, floor

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError, PlanWarning
from treadle.plan.card import render_card
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.plan.shares import ALWAYS_PLANNED, check_planned, realise_shares
from treadle.plan.windows import Rows, Windows

# (weight, transitions) of 26 Open X-Embodiment-sized datasets: 3,970 to 27 million moments
OXE = [
    (0.54087122203, 3_786_400), (0.8341046294, 2_455_879), (1.0, 2_135_463), (2.0, 237_798),
    (1.0, 77_965), (1.0, 42_328), (2.0, 187_507), (2.0, 76_324), (2.0, 97_939), (1.0, 325_699),
    (0.1, 7_045_476), (2.0, 358_234), (1.0, 34_112), (3.0, 44_875), (0.1, 3_948_057),
    (2.0, 3_970), (1.0, 353_094), (1.0, 279_939), (1.0, 8_928), (1.0, 146_241), (1.0, 361_883),
    (2.0, 62_613), (1.0, 25_016), (0.2, 5_471_693), (1.0, 1_137_459), (0.06, 27_044_326),
]  # fmt: skip


def sized(name, moments, episode_length=500):
    """A fake table of exactly ``moments`` moments (counts only, no rows)."""
    full, rest = divmod(moments, episode_length)
    return FakeTable(name, [episode_length] * full + ([rest] if rest else []))


def eligible_by_definition(lengths, span):
    """Anchors of unpadded windows spanning ``span`` moments: per episode, length - span + 1."""
    return sum(max(n - span + 1, 0) for n in lengths)


def asked_by_definition(weights, sizes):
    exact = [Fraction(repr(float(w))) * n for w, n in zip(weights, sizes)]
    return [x / sum(exact) for x in exact]


def global_counts(plan, steps, world_size):
    """Samples of each component per step, from the union of every rank's batch."""
    counts = np.zeros((steps, plan.num_components), dtype=np.int64)
    for s in range(steps):
        for r in range(world_size):
            np.add.at(counts[s], plan.batch(s, r, world_size).component, 1)
    return counts


def assert_within_one_sample(plan, steps, world_size):
    """Every batch holds floor or ceil of share*B, and every running count stays within one
    sample of the asked share (plus the planned share's move, at most 1e-6*B per step)."""
    b = plan.batch_size
    counts = global_counts(plan, steps, world_size)
    cum = np.cumsum(counts, axis=0)
    for c, (asked, planned) in enumerate(zip(plan.asked_weights, plan.weights)):
        assert set(counts[:, c].tolist()) <= {floor(planned * b), ceil(planned * b)}
        for s in range(steps):
            drift = abs(cum[s, c] - asked * b * (s + 1))
            assert drift < 1 + abs(planned - asked) * b * (s + 1), (c, s)
    assert (counts.sum(axis=1) == b).all()


@st.composite
def mixes(draw):
    m = draw(st.integers(min_value=2, max_value=4))
    span = draw(st.integers(min_value=1, max_value=5))
    world = draw(st.sampled_from([1, 2, 4]))
    batch_size = world * draw(st.integers(min_value=1, max_value=16))
    weights, tables = [], []
    for i in range(m):
        lengths = draw(st.lists(st.integers(0, 60), min_size=1, max_size=5))
        if draw(st.integers(0, 3)) == 0:  # huge counts: shares with no small denominator
            lengths.append(draw(st.integers(10**6, 10**10)))
        assume(eligible_by_definition(lengths, span) > 0)
        tables.append(FakeTable(f"t{i}", lengths))
        weights.append(draw(st.sampled_from([0.1, 0.25, 1.0, 2.0, 0.54087122203, 3])))
    seed = draw(st.integers(0, 2**64 - 1))
    return tables, weights, span, batch_size, world, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixes())
def test_shares_are_weight_times_eligible_moments_within_one_sample(mix):
    tables, weights, span, batch_size, world, seed = mix
    windows = Windows({"action": Rows(range(span))})
    comps = [Component(FakeRef(t), windows, weight=w) for t, w in zip(tables, weights)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        try:
            plan = Recipe(seed, batch_size, comps, weigh_by="moments").plan()
        except PlanError as e:  # a tiny share moved more than 1%: refused, never rounded
            assert "cannot" in str(e) and "weight" in str(e)
            assume(False)
    sizes = [eligible_by_definition(t.episodes().lengths, span) for t in tables]
    assert [plan.eligible(c) for c in range(len(tables))] == sizes
    assert list(plan.asked_weights) == asked_by_definition(weights, sizes)
    assert all(abs(p - a) <= Fraction(1, 10**6) for p, a in zip(plan.weights, plan.asked_weights))
    assert_within_one_sample(plan, steps=40, world_size=world)
    # purity: the sample at position p is a function of (run record, p)
    again = Plan.from_record(plan.record.to_json(), FakeClient(tables))
    for step in (0, 7, 10**9 + 3):
        for r in range(world):
            a, b = plan.batch(step, r, world), again.batch(step, r, world)
            assert a.component.tolist() == b.component.tolist()
            assert a.moment.tolist() == b.moment.tolist()
            p = int(a.position[-1])
            assert again.at(p) == (int(a.component[-1]), int(a.moment[-1]))


@pytest.fixture(scope="module")
def oxe_tables():
    return [sized(f"oxe{i:02d}", n) for i, (_, n) in enumerate(OXE)]


@pytest.fixture(scope="module")
def oxe_plan(oxe_tables):
    windows = Windows({"action": Rows(range(8))})  # an unpadded action chunk of 8 steps
    comps = [Component(t, windows, weight=w) for t, (w, _) in zip(oxe_tables, OXE)]
    with pytest.warns(PlanWarning) as caught:
        plan = Recipe(7, 256, comps, weigh_by="moments").plan()
    return plan, [str(w.message) for w in caught]


def test_oxe_sized_mix_warns_in_one_line(oxe_plan):
    plan, caught = oxe_plan
    assert len(caught) == 1
    text = caught[0]
    assert "\n" not in text and len(text) < 600  # was one sentence per component (4 KB)
    rel = [abs(p - a) / a for a, p in zip(plan.asked_weights, plan.weights)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    assert f"Largest relative move {float(rel[worst]):.2g}, component {worst} " in text
    assert "26 of 26 moved" in text and "one more sample every" in text
    assert all(r <= 0.01 for r in rel)


def test_oxe_sized_mix_counts_eligible_moments_not_transitions(oxe_plan):
    plan, _ = oxe_plan
    for c, (_, n) in enumerate(OXE):
        episodes = -(-n // 500)
        assert plan.eligible(c) == n - 7 * episodes  # 7 moments per episode lack a chunk
    for world in (1, 2, 4):
        assert_within_one_sample(plan, steps=30, world_size=world)
    whole = plan.batch(12, 0, 1)
    for world in (2, 4):  # the ranks' slots r, r+W, ... make up the global batch
        for r in range(world):
            part = plan.batch(12, r, world)
            assert part.component.tolist() == whole.component[r::world].tolist()
            assert part.moment.tolist() == whole.moment[r::world].tolist()


@pytest.mark.filterwarnings("ignore::treadle.errors.PlanWarning")
def test_record_round_trips_and_old_records_keep_their_run_ids(oxe_tables):
    comps = [Component(FakeRef(t), weight=w) for t, w in zip(oxe_tables[:3], [0.5, 0.25, 1])]
    by_size = Recipe(3, 8, comps, weigh_by="moments").plan()
    plain = Recipe(3, 8, comps).plan()
    text = by_size.record.to_json()
    assert json.loads(text)["weigh_by"] == "moments"
    again = RunRecord.from_json(text)
    assert again == by_size.record and again.run_id == by_size.run_id
    assert again.asked_weights == by_size.asked_weights != plain.asked_weights
    assert "weigh_by" not in plain.record.to_json() and "weigh_by" not in plain.record.identity()
    assert by_size.run_id != plain.run_id
    edited = json.loads(text)
    del edited["weigh_by"], edited["run_id"]  # the numerators no longer match the weights
    with pytest.raises(PlanError, match="do not match its weights"):
        RunRecord.from_json(edited)
    edited = {**json.loads(text), "weigh_by": "episodes"}
    with pytest.raises(PlanError, match="field 'weigh_by' must be 'moments' or absent"):
        RunRecord.from_json(edited)


def test_card_shows_weight_times_moments_and_the_share(oxe_tables):
    a, b = sized("a", 1_000, 100), sized("b", 3_000, 100)
    windows = Windows({"action": Rows(range(4))})
    plan = Recipe(1, 8, [Component(a, windows, 1), Component(b, windows, 0.5)],
                  weigh_by="moments").plan()  # fmt: skip
    card = render_card(plan.record)
    assert 'by size (weigh_by="moments": share ∝ weight × eligible moments)' in card
    assert "weight 1 × 970 moments → share 2/5 = 0.4, exact" in card
    assert "weight 0.5 × 2,910 moments → share 3/5 = 0.6, exact" in card


@pytest.mark.parametrize("bad", ["episodes", "Moments", 1, True, ["moments"]])
def test_bad_weigh_by_is_a_plan_error_naming_the_option(bad):
    t = FakeTable("t", [5])
    with pytest.raises(PlanError, match="weigh_by must be None or 'moments'"):
        Recipe(0, 4, [Component(t)], weigh_by=bad)


def test_schedule_stages_are_weighed_by_moments_too():
    a, b = FakeTable("a", [10] * 30), FakeTable("b", [7] * 10)  # 270 and 60 eligible
    windows = Windows({"action": Rows(range(2))})
    schedule = td.Schedule([(0, [1.0, 1.0]), (10, [1.0, 0.0]), (20, td.Ramp([1.0, 2.0], steps=4))])
    comps = [Component(FakeRef(a), windows), Component(FakeRef(b), windows)]
    plan = Recipe(5, 8, comps, schedule=schedule, weigh_by="moments").plan()
    seats = plan.schedule
    assert seats.shares[0] == (Fraction(270, 330), Fraction(60, 330))
    assert seats.shares[1] == (1, 0)
    ramp_end = (Fraction(270, 390), Fraction(120, 390))  # 1.0 x 270 : 2.0 x 60
    assert seats.shares[-1] == ramp_end and len(seats.shares) == 2 + 4
    cum = np.zeros(2, dtype=np.int64)
    for step in range(40):
        counts = plan.counts(step)
        shares = seats.planned[seats.piece(step)]
        for c in range(2):
            assert floor(shares[c] * 8) <= counts[c] <= ceil(shares[c] * 8)
        assert plan.cumulative(step) == cum.tolist()  # draws go on across stages
        cum += counts
    again = RunRecord.from_json(plan.record.to_json())
    assert again == plan.record and again.weigh_by == "moments"
    rebuilt = Plan.from_record(again, FakeClient([a, b]))
    assert rebuilt.batch(23).moment.tolist() == plan.batch(23).moment.tolist()
    assert "stage 0 from step 0: [0] a 9/11, [1] b 2/11" in render_card(plan.record)


def test_refusal_names_the_factor_that_fixes_it():
    small, big = FakeTable("small", [7]), sized("big", 1_234_567, 1000)
    comps = [Component(FakeRef(small), weight=1.0), Component(FakeRef(big), weight=1.0)]
    with pytest.raises(PlanError) as e:
        Recipe(0, 64, comps, weigh_by="moments").plan()
    text = str(e.value)
    asked = f"{float(Fraction(7, 7 + 1_234_567)):.6g}"
    assert f"component 0 (table 'small'): share asked {asked} cannot be planned" in text
    assert f"A share of at least {float(ALWAYS_PLANNED):g} always plans" in text
    factor = float(text.split("weight by at least ")[1].split(",")[0])
    fixed = [Component(FakeRef(small), weight=factor), Component(FakeRef(big), weight=1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        plan = Recipe(0, 64, fixed, weigh_by="moments").plan()  # the fix plans
    assert plan.asked_weights[0] >= ALWAYS_PLANNED


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 10**12), min_size=2, max_size=30),
    st.integers(1, 4096),
)
def test_a_share_of_at_least_1e_4_always_plans(sizes, batch_size):
    """The documented floor: at any batch size, a share >= 1e-4 is never refused."""
    total = sum(sizes)
    shares = [Fraction(n, total) for n in sizes]
    nums, den = realise_shares(shares, batch_size)
    planned = [Fraction(n, den) for n in nums]
    assert all(abs(p - a) <= Fraction(1, 10**6) for p, a in zip(planned, shares))
    kept = [i for i, a in enumerate(shares) if a >= ALWAYS_PLANNED]
    labels = [f"component {i}" for i in range(len(shares))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        check_planned([shares[i] for i in kept], [planned[i] for i in kept], batch_size,
                      [labels[i] for i in kept])  # fmt: skip


# A run record written before weigh_by existed (by main at 42b4419): it loads and plans as then.
OLD_RECORD = (
    '{"algorithm":"treadle.plan/2","batch_size":8,"components":[{"eligible":12,"table":0,'
    '"weight":0.3,"weight_quantised":3,"windows":{"action":{"kind":"rows","offsets":{"range":'
    '[0,3]}}}},{"eligible":9,"table":1,"weight":0.7,"weight_quantised":7,"windows":{"action":'
    '{"kind":"rows","offsets":{"range":[0,3]}}}}],"project":"robotics","run_id":'
    '"e977a17d0f6474a2","seed":3,"tables":[{"branch":"main","commit":"c0ffee' + "0" * 58 + '",'
    '"name":"a","num_episodes":3,"num_moments":18,"version":1},{"branch":"main","commit":'
    '"c0ffee' + "0" * 58 + '","name":"b","num_episodes":2,"num_moments":13,"version":1}],'
    '"weight_denominator":10}'
)


def test_a_record_from_before_weigh_by_keeps_its_run_id():
    a, b = FakeTable("a", [5, 6, 7]), FakeTable("b", [9, 4])
    w = Windows({"action": Rows(range(3))})
    comps = [Component(FakeRef(a), w, weight=0.3), Component(FakeRef(b), w, weight=0.7)]
    plan = Recipe(3, 8, comps).plan()
    old = RunRecord.from_json(OLD_RECORD)
    assert old.weigh_by is None and old == plan.record
    assert plan.run_id == old.run_id == "e977a17d0f6474a2"
    assert plan.record.to_json() == OLD_RECORD
    assert Recipe(3, 8, comps, weigh_by="moments").plan().run_id != old.run_id

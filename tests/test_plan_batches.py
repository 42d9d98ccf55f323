"""Plan.batch: exact shares, epochs as permutations, rank division, far steps vs a slow reference."""

from __future__ import annotations

import warnings
from math import ceil, floor

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from plan_helpers import FakeClient, FakeRef, FakeTable, ref_batch, ref_extra
from treadle.errors import PlanError, PlanWarning
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.plan.windows import Rows, Video, Windows

MAX_SEED = 2**64 - 1
# Shares over small denominators (short periods, so the textbook reference can simulate one).
small_weight = st.sampled_from([0.001, 0.002, 0.3, 0.7, 1.0, 0.5, 2, 3])
# Any weight: shares within 1e-6, periods up to ceil(10**6 / B) (kept short by B >= 64 here).
weight = st.one_of(
    small_weight,
    st.sampled_from([0.0004, 0.0012, 1 / 3]),
    st.integers(min_value=1, max_value=10**6),
    st.floats(min_value=1e-4, max_value=100, allow_nan=False),
)


@st.composite
def recipes(draw, max_len=40, big=True, small=False):
    m = draw(st.integers(min_value=2, max_value=6))
    batch_size = draw(st.integers(min_value=1, max_value=256))
    weights = small_weight if small or batch_size < 64 else weight
    seed = draw(st.integers(min_value=0, max_value=MAX_SEED))
    comps = []
    for i in range(m):
        lo = draw(st.integers(min_value=-4, max_value=0))
        hi = draw(st.integers(min_value=0, max_value=6))
        top = 10**12 if big and draw(st.integers(0, 4)) == 0 else max_len
        lengths = draw(st.lists(st.integers(min_value=0, max_value=top), min_size=0, max_size=6))
        # At least one episode long enough for the windows, somewhere among the others.
        lengths.insert(
            draw(st.integers(0, len(lengths))), hi - lo + 1 + draw(st.integers(0, max_len))
        )
        if lo == hi == 0 and draw(st.booleans()):
            windows = None
        elif draw(st.booleans()):
            windows = Windows({"action": Rows(range(lo, hi + 1))})
        else:
            windows = Windows({"action": Rows(sorted({lo, hi})), "cam": Video(sorted({0, hi}))})
        table = FakeTable(f"t{i}", lengths, version=draw(st.integers(1, 9)), video=("cam",))
        comps.append(Component(FakeRef(table), windows, weight=draw(weights)))
    return Recipe(seed, batch_size, comps)


def plan_of(recipe):
    """The recipe's plan; a mix refused for a share moved more than 1% is not one to test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        try:
            return recipe.plan()
        except PlanError as e:
            assert "cannot be planned exactly" in str(e)
            assume(False)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def episode_of(plan, c, moments):
    """(episode length, frame) of each moment, from the fake table's episodes."""
    ep = plan.table(c).episodes()
    e = np.searchsorted(ep.starts, moments, side="right") - 1
    return ep.lengths[e], moments - ep.starts[e]


steps = st.one_of(
    st.integers(min_value=0, max_value=500),
    st.integers(min_value=0, max_value=10**12),
    st.just(10**12),
    st.integers(min_value=10**12, max_value=10**15),
)


@settings(max_examples=25, deadline=None)
@given(recipes(small=True), steps, st.data())
def test_batch_at_any_step_equals_the_slow_reference(recipe, step, data):
    plan = plan_of(recipe)
    record = plan.record
    b = record.batch_size
    world = data.draw(st.sampled_from(divisors(b)))
    rank = data.draw(st.integers(0, world - 1))
    period = ref_extra(
        [c.weight_quantised for c in record.components],
        record.weight_denominator,
        b,
        plan.schedule.period,
    )
    episodes = [t.episodes() for t in plan.tables]
    ref = ref_batch(record, episodes, step, period, rank, world)
    got = plan.batch(step, rank, world)
    assert got.component.dtype == got.moment.dtype == got.position.dtype == np.int64
    assert list(zip(got.component.tolist(), got.moment.tolist(), got.position.tolist())) == ref


@settings(max_examples=40, deadline=None)
@given(recipes(), steps, st.data())
def test_global_batch_shares_and_rank_interleaving(recipe, step, data):
    plan = plan_of(recipe)
    b = plan.batch_size
    full = plan.batch(step)
    assert full.position.tolist() == list(range(step * b, step * b + b))
    counts = np.bincount(full.component, minlength=plan.num_components)
    assert counts.tolist() == plan.counts(step).tolist()
    for c, asked in enumerate(plan.record.asked_weights):
        # floor(w_c*B) <= count <= ceil(w_c*B), exactly, for the share asked for.
        assert floor(asked * b) <= counts[c] <= ceil(asked * b)
    for world in data.draw(st.lists(st.sampled_from(divisors(b)), min_size=1, max_size=3)):
        parts = [plan.batch(step, r, world) for r in range(world)]
        assert all(len(p) == b // world for p in parts)
        for name in ("component", "moment", "position", "draw"):
            merged = np.empty(b, dtype=np.int64)
            for r, p in enumerate(parts):
                merged[r::world] = getattr(p, name)
            assert np.array_equal(merged, getattr(full, name)), name
    # Every moment is eligible: all its window offsets stay inside its episode.
    for c in range(plan.num_components):
        sel = full.component == c
        lo, hi = (0, 0) if plan.windows(c) is None else plan.windows(c).span()
        length, frame = episode_of(plan, c, full.moment[sel])
        assert np.all(frame + lo >= 0) and np.all(frame + hi < length)
    # Any position alone gives the same sample.
    slot = data.draw(st.integers(0, b - 1))
    assert plan.at(step * b + slot) == (int(full.component[slot]), int(full.moment[slot]))


@settings(max_examples=25, deadline=None)
@given(recipes(max_len=12, big=False))
def test_each_epoch_walks_a_fresh_permutation_of_eligible_moments(recipe):
    plan = plan_of(recipe)
    seen = {c: {} for c in range(plan.num_components)}
    last = 60
    for step in range(last):
        batch = plan.batch(step)
        for c, m, d in zip(batch.component.tolist(), batch.moment.tolist(), batch.draw.tolist()):
            assert d not in seen[c]
            seen[c][d] = m
    totals = plan.cumulative(last)
    for c in range(plan.num_components):
        # Draws of a component are 0, 1, 2, ... with no gap and no repeat.
        assert sorted(seen[c]) == list(range(totals[c]))
        n = plan.eligible(c)
        ep = plan.table(c).episodes()
        lo, hi = (0, 0) if plan.windows(c) is None else plan.windows(c).span()
        eligible = sorted(
            int(s) + f
            for s, length in zip(ep.starts, ep.lengths)
            for f in range(-lo, int(length) - hi)
        )
        assert len(eligible) == n
        for e in range(totals[c] // n):
            epoch = [seen[c][d] for d in range(e * n, (e + 1) * n)]
            assert sorted(epoch) == eligible
        # plan.moments gives the same draws, and later epochs are new orders.
        draws = np.arange(4 * n)
        moments = plan.moments(c, draws)
        assert [seen[c][d] for d in range(min(totals[c], 4 * n))] == moments[: totals[c]].tolist()
        if n >= 6:
            orders = {tuple(moments[e * n : (e + 1) * n].tolist()) for e in range(4)}
            assert len(orders) >= 3


def test_small_components_cycle_and_nothing_is_truncated():
    tiny = FakeTable("tiny", [3])
    big = FakeTable("big", [1000, 1000])
    plan = Recipe(
        7, 10, [Component(FakeRef(tiny), weight=0.5), Component(FakeRef(big), weight=0.5)]
    ).plan()
    assert (plan.eligible(0), plan.eligible(1)) == (3, 2000)
    steps = 600  # big needs 400 steps for one epoch; tiny cycles 1000 times meanwhile
    comp = np.concatenate([plan.batch(s).component for s in range(steps)])
    moment = np.concatenate([plan.batch(s).moment for s in range(steps)])
    assert np.sum(comp == 0) == np.sum(comp == 1) == 3000
    assert sorted(set(moment[comp == 1].tolist())) == list(range(2000))
    assert np.bincount(moment[comp == 0], minlength=3).tolist() == [1000, 1000, 1000]


def test_plan_from_record_rebuilds_the_same_batches_without_pinning_heads():
    a = FakeTable("a", [40, 0, 25], version=3, video=("cam",))
    b = FakeTable("b", [9] * 7, version=5)
    w = Windows({"cam": Video(range(4)), "action": Rows([-1, 0])})
    ref_a, ref_b = FakeRef(a), FakeRef(b)
    plan = Recipe(2048, 64, [Component(ref_a, w, 0.3), Component(ref_b, None, 0.7)]).plan()
    text = plan.record.to_json()
    again = Plan.from_record(RunRecord.from_json(text), FakeClient([a, b]))
    assert again.record == plan.record and again.run_id == plan.run_id
    assert (ref_a.pins, ref_b.pins) == (1, 1)
    for step in (0, 1, 999, 10**12):
        x, y = plan.batch(step, 1, 4), again.batch(step, 1, 4)
        assert np.array_equal(x.component, y.component)
        assert np.array_equal(x.moment, y.moment)
    # A dict or text record works too.
    assert Plan.from_record(text, FakeClient([a, b])).run_id == plan.run_id


def test_a_shared_table_ref_is_pinned_once_and_listed_once():
    t = FakeTable("t", [30, 30])
    ref = FakeRef(t)
    recipe = Recipe(
        1,
        8,
        [
            Component(ref, Windows({"action": Rows(range(5))}), 1),
            Component(ref, Windows({"action": Rows(range(-20, 1))}), 3),
        ],
    )
    plan = plan_of(recipe)
    assert ref.pins == 1 and t.episode_calls == 1
    assert len(plan.record.tables) == 1
    assert [c.table for c in plan.record.components] == [0, 0]
    assert (plan.eligible(0), plan.eligible(1)) == (52, 20)
    assert plan.batch(3).moment.size == 8


def test_step_cost_does_not_depend_on_step():
    t = FakeTable("t", [10**9] * 1000)
    plan = Recipe(3, 64, [Component(FakeRef(t), weight=1)]).plan()
    far = plan.batch(9 * 10**15)
    assert far.position[0] == 9 * 10**15 * 64
    assert len(set(far.moment.tolist())) == 64
    assert plan.cumulative(9 * 10**15) == [9 * 10**15 * 64]


@settings(max_examples=20, deadline=None)
@given(recipes(), st.lists(steps, min_size=1, max_size=9), st.data())
def test_batches_of_several_steps_are_each_step_s_batch(recipe, many, data):
    plan = plan_of(recipe)
    world = data.draw(st.sampled_from(divisors(plan.batch_size)))
    rank = data.draw(st.integers(0, world - 1))
    for step, got in zip(many, plan.batches(many, rank, world), strict=True):
        one = plan.batch(step, rank, world)
        assert got.step == step and (got.rank, got.world_size) == (rank, world)
        for name in ("component", "moment", "position", "draw"):
            assert np.array_equal(getattr(got, name), getattr(one, name)), name

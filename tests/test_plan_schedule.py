"""Shares and the PD2 Pfair schedule: exact shares per batch and per run, at any step."""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor, lcm

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle.plan.pd2_serial as serial_module
import treadle.plan.schedule as schedule_module
from plan_helpers import ref_cumulative, ref_extra, ref_period
from treadle.errors import PlanError
from treadle.plan.schedule import Schedule
from treadle.plan.shares import MAX_DENOMINATOR, asked_shares, realise_weights

TOL = Fraction(1, 10**6)
batch_sizes = st.integers(min_value=1, max_value=256)
far_steps = st.one_of(
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=10**12, max_value=10**15),
    st.just(10**12),
)


@st.composite
def exact_weights(draw, max_denominator=MAX_DENOMINATOR):
    """Weights whose shares have a common denominator <= max_denominator: integer counts, or
    decimals with up to 6 digits (0.0012), as a user would write them."""
    m = draw(st.integers(min_value=2, max_value=6))
    if draw(st.booleans()):
        total = draw(st.integers(min_value=m, max_value=max_denominator))
        cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=m - 1, max_size=m - 1)))
        counts = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
        if min(counts) == 0:
            counts = [c + 1 for c in counts]
        return counts
    digits = draw(st.integers(min_value=1, max_value=6))
    scale = 10**digits
    nums = draw(st.lists(st.integers(1, scale), min_size=m, max_size=m))
    ws = [n / scale for n in nums]
    if lcm(*(s.denominator for s in asked_shares(ws))) > max_denominator:
        ws = [float(n) for n in nums]  # the sum does not divide out: use the counts
        if sum(nums) > max_denominator:
            ws = [1.0] * m
    return ws


any_weight = st.one_of(
    st.sampled_from([0.001, 0.002, 0.0004, 1e-9, 0.3, 0.7, 0.5, 1.0, 3.0, 1 / 3]),
    st.floats(min_value=1e-9, max_value=1e3, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=10**7),
)
any_weights = st.lists(any_weight, min_size=2, max_size=6)


def _check_prefix(asked, planned, batch_size, schedule, start, steps):
    """Per batch floor/ceil of the asked share; cumulative within one sample of the planned
    share (the asked one when exact) at every prefix, integer arithmetic."""
    cum = schedule.cumulative(start)
    for c, w in enumerate(planned):
        assert abs(cum[c] - w * batch_size * start) < 1
    for s in range(start, start + steps):
        counts = schedule.counts(s)
        assert int(counts.sum()) == batch_size
        for c, (a, w) in enumerate(zip(asked, planned)):
            k = int(counts[c])
            assert floor(a * batch_size) <= k <= ceil(a * batch_size), (s, c, k)
            cum[c] += k
            assert abs(cum[c] - w * batch_size * (s + 1)) < 1, (s, c)
        assert schedule.cumulative(s + 1) == cum


def _schedule(ws, batch_size):
    nums, den = realise_weights(ws, batch_size)
    return Schedule(nums, den, batch_size), [Fraction(n, den) for n in nums]


def test_weights_are_read_as_the_decimals_they_print_as():
    assert asked_shares([0.0012, 0.9988]) == (Fraction(3, 2500), Fraction(2497, 2500))
    assert asked_shares([3, 7]) == asked_shares([0.3, 0.7]) == (Fraction(3, 10), Fraction(7, 10))
    assert realise_weights([0.3, 0.7], 64) == ((3, 7), 10)
    assert realise_weights([1, 1, 1], 5) == ((1, 1, 1), 3)
    assert realise_weights([123457, 876543 - 1], 7) == ((123457, 876542), 999999)


def test_a_weight_of_0_0004_is_not_rounded_to_0_001():
    # Before: quantised to 1/1000 (2.5 times the share asked for).
    nums, den = realise_weights([0.0004, 0.9996], 1)
    assert Fraction(nums[0], den) == Fraction(1, 2500)
    schedule = Schedule(nums, den, 1)
    assert schedule.cumulative(2500 * 10**9) == [10**9, 2499 * 10**9]
    hits = [s for s in range(7500) if schedule.counts(s)[0] == 1]
    assert len(hits) == 3 and [b - a for a, b in zip(hits, hits[1:])] == [2500, 2500]


def test_a_small_table_keeps_its_share_over_1500_steps():
    # Before: 0.01/8.01 was quantised to 1/1000 and fell 36 samples behind by step 1500.
    ws = [1, 1, 1, 5, 0.01]
    schedule, planned = _schedule(ws, 96)
    asked = asked_shares(ws)
    assert planned == list(asked) and asked[4] == Fraction(1, 801)
    _check_prefix(asked, planned, 96, schedule, 0, 1500)
    assert schedule.cumulative(1500)[4] in (179, 180)  # 1500*96/801 = 179.78


@settings(max_examples=150, deadline=None)
@given(exact_weights(max_denominator=20_000), batch_sizes, far_steps)
def test_exact_shares_keep_both_invariants_against_the_asked_share(ws, batch_size, far):
    schedule, planned = _schedule(ws, batch_size)
    asked = asked_shares(ws)
    assert planned == list(asked)
    _check_prefix(asked, planned, batch_size, schedule, 0, 120)
    _check_prefix(asked, planned, batch_size, schedule, far, 60)


@settings(max_examples=6, deadline=None)
@given(exact_weights(), batch_sizes, far_steps)
def test_exact_shares_with_denominators_up_to_a_million(ws, batch_size, far):
    schedule, planned = _schedule(ws, batch_size)
    asked = asked_shares(ws)
    assert planned == list(asked)
    assert schedule.period <= MAX_DENOMINATOR
    _check_prefix(asked, planned, batch_size, schedule, 0, 50)
    _check_prefix(asked, planned, batch_size, schedule, far, 50)
    _check_prefix(asked, planned, batch_size, schedule, schedule.period - 25, 50)


def test_a_period_of_a_million_steps_keeps_both_invariants():
    ws = [0.123457, 0.2, 0.000001, 0.676542]  # shares over 10**6, B coprime: period 10**6
    schedule, planned = _schedule(ws, 7)
    assert planned == list(asked_shares(ws)) and schedule.period == 10**6
    for start in (0, 499_990, 10**6 - 20, 10**12 + 3, 7 * 10**14):
        _check_prefix(planned, planned, 7, schedule, start, 40)
    assert schedule._masks.nbytes == 8 * 10**6  # one 64-bit word per step


def _check_other_shares(ws, batch_size, far):
    schedule, planned = _schedule(ws, batch_size)
    asked = asked_shares(ws)
    for a, w in zip(asked, planned):
        assert abs(a - w) <= TOL
        assert w > 0
    if lcm(*(a.denominator for a in asked)) <= MAX_DENOMINATOR:
        assert planned == list(asked)
    else:
        assert schedule.period <= 8 * ceil(10**6 / batch_size)
    _check_prefix(asked, planned, batch_size, schedule, 0, 60)
    _check_prefix(asked, planned, batch_size, schedule, far, 30)


@settings(max_examples=100, deadline=None)
@given(any_weights, st.integers(min_value=48, max_value=1024), far_steps)
def test_other_shares_are_within_a_millionth_and_keep_floor_or_ceil(ws, batch_size, far):
    _check_other_shares(ws, batch_size, far)


@settings(max_examples=4, deadline=None)
@given(any_weights, st.integers(min_value=1, max_value=47), far_steps)
def test_other_shares_at_small_batch_sizes(ws, batch_size, far):
    _check_other_shares(ws, batch_size, far)


def test_many_shares_below_a_millionth_are_each_planned_above_zero():
    ws = [0.001] * 5 + [35051]  # shares of 2.9e-8: each gets one seat in ~L steps
    for batch_size in (64, 1000):
        _check_other_shares(ws, batch_size, 10**12)


@st.composite
def small_plans(draw):
    """Numerators over a small denominator, so the textbook reference can simulate periods."""
    m = draw(st.integers(min_value=1, max_value=6))
    nums = draw(st.lists(st.integers(1, 300), min_size=m, max_size=m))
    return nums, sum(nums), draw(batch_sizes)


@settings(max_examples=60, deadline=None)
@given(small_plans())
def test_schedule_matches_reference_pd2_step_for_step(plan):
    numerators, d, batch_size = plan
    schedule = Schedule(numerators, d, batch_size)
    assert schedule.period == ref_period(numerators, d, batch_size)
    steps = min(2 * schedule.period, 400)
    ref = ref_extra(numerators, d, batch_size, steps)
    got = np.stack([schedule.counts(s) for s in range(steps)])
    base = np.asarray([n * batch_size // d for n in numerators])
    assert np.array_equal(got - base, np.asarray(ref))


@settings(max_examples=30, deadline=None)
@given(small_plans(), far_steps)
def test_cumulative_counts_at_far_steps_are_exact(plan, step):
    numerators, d, batch_size = plan
    schedule = Schedule(numerators, d, batch_size)
    ref = ref_extra(numerators, d, batch_size, schedule.period)
    for s in (step, step + 1):
        assert schedule.cumulative(s) == ref_cumulative(numerators, d, batch_size, s, ref)
    nxt = [b - a for a, b in zip(schedule.cumulative(step), schedule.cumulative(step + 1))]
    assert nxt == schedule.counts(step).tolist()


def test_whole_shares_have_no_extra_seats():
    schedule = Schedule((1, 3), 4, 64)  # 16 and 48 per batch, exactly
    assert schedule.period == 1
    assert schedule.counts(12345).tolist() == [16, 48]
    assert schedule.cumulative(10**12) == [16 * 10**12, 48 * 10**12]


def test_bad_numerators_and_too_long_periods_are_rejected():
    with pytest.raises(PlanError, match="sum to 1000"):
        Schedule((300, 600), 1000, 64)
    with pytest.raises(PlanError, match=">= 0"):
        Schedule((-1, 1001), 1000, 64)
    absent = Schedule((0, 1000), 1000, 64)  # a schedule's stage may leave a component out
    assert absent.counts(10**12).tolist() == [0, 64] and absent.cumulative(9) == [0, 576]
    with pytest.raises(PlanError, match="repeat only every 1000000007 steps"):
        Schedule((1, 10**9 + 6), 10**9 + 7, 1)
    with pytest.raises(PlanError, match="at most 1000"):
        realise_weights([1.0] * 1001, 8)


@pytest.fixture
def fresh_cache():
    schedule_module.pd2_masks.cache_clear()
    yield
    schedule_module.pd2_masks.cache_clear()


def test_group_deadlines_matter_and_setup_verification_refuses_a_bad_schedule(
    monkeypatch, fresh_cache
):
    numerators, d, batch_size = (858, 36, 51, 24, 31), 1000, 155  # 4 extra seats a batch
    good = Schedule(numerators, d, batch_size)
    shares = [Fraction(n, d) for n in numerators]
    _check_prefix(shares, shares, batch_size, good, 0, 2 * good.period)
    schedule_module.pd2_masks.cache_clear()

    def by_index(rates, p, t0, t1):
        heavy = np.flatnonzero((rates > 0) & (2 * rates >= p))
        rows = np.tile(heavy, (t1 - t0, 1))
        return serial_module.encode(rows, serial_module.bit_width(len(rates)))

    # Earliest deadline (with b-bits) but heavy ties by index, not group deadline: a seat goes
    # unfilled, and setup refuses the schedule instead of planning a run with wrong shares.
    monkeypatch.setattr(serial_module, "group_orders", by_index)
    with pytest.raises(PlanError, match="internal"):
        Schedule(numerators, d, batch_size)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda m: m.__setitem__((slice(None), 0), 0), "does not fill"),
        (lambda m: m.__setitem__((5, 0), m[5, 0] ^ 1), "outside its Pfair window|does not fill"),
        (lambda m: m.__setitem__((-1, 0), 1), "not periodic|outside|does not fill"),
    ],
)
def test_setup_verification_catches_a_corrupt_schedule(monkeypatch, fresh_cache, corrupt, message):
    real = schedule_module._simulate

    def bad(rates, period):
        masks = real(rates, period)
        corrupt(masks)
        return masks

    monkeypatch.setattr(schedule_module, "_simulate", bad)
    with pytest.raises(PlanError, match=message):
        Schedule((1, 2, 4), 7, 3)


@pytest.mark.parametrize("m", [64, 65, 130])
def test_more_than_64_components_use_several_mask_words(m):
    rng = np.random.default_rng(m)
    numerators = rng.integers(1, 10, size=m).tolist()
    d, batch_size = sum(numerators), 37
    schedule = Schedule(numerators, d, batch_size)
    assert schedule._masks.shape == (schedule.period, (m + 63) // 64)
    steps = min(schedule.period, 200)
    ref = ref_extra(numerators, d, batch_size, steps)
    got = np.stack([schedule.counts(s) for s in range(steps)])
    base = np.asarray([n * batch_size // d for n in numerators])
    assert np.array_equal(got - base, np.asarray(ref))

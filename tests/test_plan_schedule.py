"""Weight quantisation and the PD2 Pfair schedule: exact shares per batch and per run."""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plan_helpers import ref_cumulative, ref_extra, ref_period
from treadle.errors import PlanError
from treadle.plan.schedule import WEIGHT_DENOMINATOR, Schedule, quantise_weights

D = WEIGHT_DENOMINATOR

weight = st.one_of(
    st.sampled_from([0.001, 0.002, 0.0004, 1e-9, 0.3, 0.7, 0.5, 1.0, 3.0]),
    st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=10_000),
)
weights = st.lists(weight, min_size=2, max_size=6)
batch_sizes = st.integers(min_value=1, max_value=256)


@settings(max_examples=200, deadline=None)
@given(weights)
def test_quantised_weights_sum_to_denominator_and_round_by_largest_remainder(ws):
    n = quantise_weights(ws)
    assert sum(n) == D
    assert min(n) >= 1
    total = sum(Fraction(w) for w in ws)
    ideal = [Fraction(w) * D / total for w in ws]
    if all(x >= 1 for x in ideal):
        # Plain largest remainder: each numerator is the floor or the ceil of its exact share.
        for ni, x in zip(n, ideal):
            assert floor(x) <= ni <= ceil(x)
    else:
        # Bumped to 1; nobody moves by more than the number of bumped components + 1.
        bumped = sum(1 for x in ideal if x < 1)
        for ni, x in zip(n, ideal):
            assert abs(ni - x) < bumped + 1


def test_quantise_examples():
    assert quantise_weights([0.3, 0.7]) == (300, 700)
    assert quantise_weights([1, 1, 1]) == (334, 333, 333)
    assert quantise_weights([1e-9, 1.0]) == (1, 999)
    assert quantise_weights([3, 7]) == quantise_weights([0.3, 0.7])


def _check_invariants(numerators, batch_size, schedule, steps):
    """Per-batch floor/ceil and cumulative drift < 1 at every prefix (integer arithmetic)."""
    cum = [0] * len(numerators)
    for s in range(steps):
        counts = schedule.counts(s)
        assert int(counts.sum()) == batch_size
        assert schedule.cumulative(s) == cum
        for c, n in enumerate(numerators):
            k = int(counts[c])
            assert n * batch_size // D <= k <= -(-n * batch_size // D)
            cum[c] += k
            assert abs(cum[c] * D - n * batch_size * (s + 1)) < D


@settings(max_examples=25, deadline=None)
@given(weights, batch_sizes)
def test_schedule_matches_reference_pd2_and_keeps_both_invariants(ws, batch_size):
    numerators = quantise_weights(ws)
    schedule = Schedule(numerators, D, batch_size)
    period = ref_period(numerators, D, batch_size)
    assert schedule.period % period == 0
    # The reference simulates two periods step by step with Fractions and definition-based
    # group deadlines; the planner's table must agree exactly and repeat.
    ref = ref_extra(numerators, D, batch_size, 2 * schedule.period)
    got = np.stack([schedule.counts(s) for s in range(2 * schedule.period)])
    base = np.asarray([n * batch_size // D for n in numerators])
    assert np.array_equal(got - base, np.asarray(ref))
    _check_invariants(numerators, batch_size, schedule, min(2 * schedule.period + 5, 300))


@settings(max_examples=150, deadline=None)
@given(weights, batch_sizes)
def test_every_prefix_keeps_both_invariants(ws, batch_size):
    numerators = quantise_weights(ws)
    schedule = Schedule(numerators, D, batch_size)
    _check_invariants(numerators, batch_size, schedule, 300)


@settings(max_examples=30, deadline=None)
@given(
    weights,
    batch_sizes,
    st.one_of(
        st.integers(min_value=0, max_value=10**12),
        st.integers(min_value=10**12, max_value=10**15),
        st.just(10**12),
    ),
)
def test_cumulative_counts_at_far_steps_are_exact(ws, batch_size, step):
    numerators = quantise_weights(ws)
    schedule = Schedule(numerators, D, batch_size)
    ref = ref_extra(numerators, D, batch_size, schedule.period)
    for s in (step, step + 1):
        got = schedule.cumulative(s)
        assert got == ref_cumulative(numerators, D, batch_size, s, ref)
        for c, n in enumerate(numerators):
            assert abs(got[c] - Fraction(n * batch_size * s, D)) < 1
    assert sum(schedule.cumulative(step)) == batch_size * step
    nxt = [b - a for a, b in zip(schedule.cumulative(step), schedule.cumulative(step + 1))]
    assert nxt == schedule.counts(step).tolist()


def test_tiny_weight_gets_a_seat_every_thousand_samples():
    # 0.001 at B=1: exactly one sample of component 0 in every 1000 steps, never two in a row.
    schedule = Schedule((1, 999), D, 1)
    assert schedule.period == 1000
    zero = [s for s in range(3000) if schedule.counts(s)[0] == 1]
    assert len(zero) == 3
    assert [b - a for a, b in zip(zero, zero[1:])] == [1000, 1000]


def test_period_divides_denominator_and_whole_shares_have_no_extra_seats():
    schedule = Schedule((250, 750), D, 64)  # 16 and 48 per batch, exactly
    assert schedule.period == 1
    assert schedule.counts(12345).tolist() == [16, 48]
    assert schedule.cumulative(10**12) == [16 * 10**12, 48 * 10**12]


def test_bad_numerators_are_rejected():
    with pytest.raises(PlanError, match="sum to 1000"):
        Schedule((300, 600), D, 64)
    with pytest.raises(PlanError, match=">= 1"):
        Schedule((0, 1000), D, 64)


def test_group_deadlines_matter_and_setup_verification_catches_a_bad_schedule(monkeypatch):
    import treadle.plan.schedule as schedule_module

    numerators, batch_size = (858, 36, 51, 24, 31), 155  # 4 extra seats a batch
    good = Schedule(numerators, D, batch_size)
    _check_invariants(numerators, batch_size, good, 2 * good.period)
    real = schedule_module._pd2_key

    def without_group_deadline(k, a, d, index):
        deadline, bbit, _, index = real(k, a, d, index)
        return (deadline, bbit, 0, index)

    # Earliest deadline (with b-bits) but no group deadlines: a seat goes unfilled, and the
    # setup check refuses the schedule instead of planning a run with wrong shares.
    monkeypatch.setattr(schedule_module, "_pd2_key", without_group_deadline)
    with pytest.raises(PlanError, match="internal"):
        Schedule(numerators, D, batch_size)


def test_setup_verification_catches_drift(monkeypatch):
    import treadle.plan.schedule as schedule_module

    def greedy(rates, denominator, period):
        out = np.zeros((period, len(rates)), dtype=np.int64)
        out[:, 0] = 1  # every extra seat to component 0: full batches, but the shares drift
        return out

    monkeypatch.setattr(schedule_module, "pd2_period", greedy)
    with pytest.raises(PlanError, match="drifts"):
        Schedule((500, 500), D, 1)

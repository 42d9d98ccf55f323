"""Weight schedules: stages and ramps, exact per step and per piece, draws consecutive."""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.card import render_card
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord
from treadle.plan.stages import RAMP_PIECES, StagedSeats


@st.composite
def schedules(draw):
    """2-5 stages over 2-8 components: small integer weights (zeros too), some ramps."""
    m = draw(st.integers(2, 8))
    n = draw(st.integers(2, 5))
    starts = sorted(draw(st.sets(st.integers(1, 400), min_size=n - 1, max_size=n - 1)))
    stages = []
    for i, start in enumerate([0, *starts]):
        w = draw(st.lists(st.integers(0, 9), min_size=m, max_size=m))
        if not any(w):
            w[draw(st.integers(0, m - 1))] = 1
        if i and draw(st.booleans()):
            stages.append((start, td.Ramp(w, steps=draw(st.integers(1, 300)))))
        else:
            stages.append((start, w))
    return td.Schedule(stages), draw(st.integers(7, 256))


def _check_pieces(seats: StagedSeats, steps_per_piece: int):
    b = seats.batch_size
    for k, (start, share) in enumerate(zip(seats.starts, seats.planned)):
        end = seats.starts[k + 1] if k + 1 < len(seats.starts) else start + steps_per_piece
        end = min(end, start + steps_per_piece)
        first = seats.cumulative(start)
        run = list(first)
        for s in range(start, end):
            counts = seats.counts(s)
            assert int(counts.sum()) == b
            for c, w in enumerate(share):
                got = int(counts[c])
                assert floor(w * b) <= got <= ceil(w * b), (k, s, c)
                run[c] += got
                # within the piece, the running count stays within one sample
                assert abs(run[c] - first[c] - w * b * (s + 1 - start)) < 1, (k, s, c)
            assert seats.cumulative(s + 1) == run


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_every_step_is_floor_or_ceil_and_every_piece_within_one_sample(sched_b):
    schedule, b = sched_b
    seats = StagedSeats(schedule.pieces(), b)
    # the asked shares are exact (integer weights): nothing is moved
    assert seats.planned == seats.shares
    _check_pieces(seats, 120)
    far = 10**15
    counts = seats.counts(far)
    assert int(counts.sum()) == b
    nxt = seats.cumulative(far + 1)
    assert [x - y for x, y in zip(nxt, seats.cumulative(far))] == counts.tolist()
    assert sum(nxt) == b * (far + 1)


def test_a_ramp_is_ten_pieces_of_linear_shares():
    schedule = td.Schedule([(0, [1, 0]), (100, td.Ramp([0, 1], steps=1000))])
    pieces = schedule.pieces()
    assert [p[0] for p in pieces] == [0, *range(100, 1100, 100)]
    assert [p[1][1] for p in pieces] == [Fraction(k, RAMP_PIECES) for k in range(11)]
    cut = td.Schedule([(0, [1, 0]), (100, td.Ramp([0, 1], steps=1000)), (350, [1, 1])])
    assert [p[0] for p in cut.pieces()] == [0, 100, 200, 300, 350]


def table(name, lengths=(40, 60, 25)):
    return FakeTable(name, list(lengths))


STAGES = [(0, [0.9, 0.1, 0.0]), (40, [0.6, 0.3, 0.1]), (90, td.Ramp([0.3, 0.3, 0.4], steps=30))]


@pytest.fixture(scope="module")
def staged():
    tables = [table(f"t{i}") for i in range(3)]
    comps = [td.Component(FakeRef(t)) for t in tables]
    plan = td.Recipe(7, 24, comps, schedule=td.Schedule(STAGES)).plan()
    return plan, tables


def test_pooled_stats_of_a_scheduled_run_are_refused(staged):
    # the pooled statistics weighted the components by their recipe weights, which a
    # schedule overrides at every step: a distribution no step of the run draws
    plan, _ = staged
    with pytest.raises(td.PlanError, match="by_component=True"):
        plan.stats(["x"])


def test_draws_continue_across_stages_none_repeated_or_skipped(staged):
    plan, _ = staged
    draws: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for s in range(200):
        b = plan.batch(s)
        assert b.component.tolist().count(2) == (0 if s < 40 else int(plan.counts(s)[2]))
        for c in draws:
            draws[c] += sorted(b.draw[b.component == c].tolist())
    for c, d in draws.items():
        assert d == list(range(len(d))) and len(d) == plan.cumulative(200)[c]
        assert plan.moments(c, np.asarray(d)).tolist() == [
            m for s in range(200) for m in sorted_moments(plan, s, c)
        ]


def sorted_moments(plan, step, c):
    b = plan.batch(step)
    order = np.argsort(b.draw[b.component == c])
    return b.moment[b.component == c][order].tolist()


def test_ranks_and_resume_give_the_uninterrupted_batches(staged):
    plan, tables = staged
    again = Plan.from_record(RunRecord.from_json(plan.record.to_json()), FakeClient(tables))
    assert again.run_id == plan.run_id
    for step in (0, 39, 40, 89, 90, 95, 119, 120, 10**12, 10**15):
        whole = plan.batch(step)
        assert np.array_equal(again.batch(step).moment, whole.moment)
        for w in (2, 3, 4, 6, 8):
            parts = [plan.batch(step, r, w) for r in range(w)]
            for r, part in enumerate(parts):
                assert np.array_equal(part.moment, whole.moment[r::w])
                assert np.array_equal(part.draw, whole.draw[r::w])


def test_the_schedule_is_in_the_record_and_its_run_id(staged):
    plan, tables = staged
    d = plan.record.to_dict()
    assert d["schedule"][2] == {"start": 90, "weights": [0.3, 0.3, 0.4], "ramp": 30}
    comps = [td.Component(FakeRef(t)) for t in tables]
    other = td.Schedule([*STAGES[:2], (90, td.Ramp([0.3, 0.3, 0.4], steps=31))])
    assert td.Recipe(7, 24, comps, schedule=other).plan().run_id != plan.run_id
    assert td.Recipe(7, 24, comps).plan().run_id != plan.run_id


def test_the_card_shows_each_stage_and_its_shares(staged):
    card = render_card(staged[0].record)
    assert "schedule: 3 stages" in card
    assert "stage 0 from step 0: [0] t0 9/10, [1] t1 1/10, [2] t2 0" in card
    assert "stage 2 from step 90: ramp over 30 steps (10 pieces) to [0] t0 3/10" in card


def test_far_steps_with_three_stages_and_six_components():
    tables = [table(f"t{i}") for i in range(6)]
    stages = td.Schedule(
        [(0, [1, 2, 3, 4, 5, 6]), (10**6, [6, 0, 4, 0, 2, 1]), (10**9, td.Ramp([1] * 6, 10**6))]
    )
    plan = td.Recipe(3, 63, [td.Component(FakeRef(t)) for t in tables], schedule=stages).plan()
    for step in (10**12, 10**15):
        b = plan.batch(step)
        counts = np.bincount(b.component, minlength=6)
        assert counts.tolist() == plan.counts(step).tolist() and counts.sum() == 63
        assert sorted(counts.tolist()) in ([10, 10, 10, 11, 11, 11],)
        first = plan.cumulative(step)
        for c in range(6):
            assert sorted(b.draw[b.component == c].tolist()) == list(
                range(first[c], first[c] + int(counts[c]))
            )


@pytest.mark.parametrize(
    ("stages", "match"),
    [
        ([(1, [1, 1])], "first stage starts at 0"),
        ([(0, [1, 1]), (5, [1, 2]), (5, [2, 1])], "stage 2 starts at step 5"),
        ([(0, [0, 0])], "every weight is 0"),
        ([(0, td.Ramp([1, 1], steps=3))], "nothing to ramp from"),
        ([(0, [1, 1]), (4, [1, 1, 1])], "one weight per component"),
        ([(0, [1, -1])], "finite and >= 0"),
        ([], "non-empty"),
    ],
)
def test_bad_schedules(stages, match):
    with pytest.raises(PlanError, match=match):
        td.Schedule(stages)


def test_a_schedule_for_another_number_of_components():
    comps = [td.Component(FakeRef(table("a"))), td.Component(FakeRef(table("b")))]
    with pytest.raises(PlanError, match="3 weights per stage for 2 components"):
        td.Recipe(1, 8, comps, schedule=td.Schedule([(0, [1, 1, 1])]))
    with pytest.raises(PlanError, match="Ramp steps"):
        td.Ramp([1, 1], steps=0)


@settings(max_examples=15, deadline=None)
@given(schedules(), st.integers(0, 2**64 - 1))
def test_random_schedules_keep_draws_consecutive_and_equal_across_ranks_and_restarts(sb, seed):
    schedule, b = sb
    m = schedule.num_components
    tables = [table(f"t{i}", (13, 7, 29)) for i in range(m)]
    comps = [td.Component(FakeRef(t)) for t in tables]
    plan = td.Recipe(seed, b, comps, schedule=schedule).plan()
    again = Plan.from_record(RunRecord.from_json(plan.record.to_json()), FakeClient(tables))
    draws: list[list[int]] = [[] for _ in range(m)]
    ws = [w for w in range(1, b + 1) if b % w == 0][-3:]
    steps = sorted({*range(0, 420, 7), *schedule_starts(schedule), 10**15})
    for step in steps:
        whole = plan.batch(step)
        assert np.array_equal(again.batch(step).moment, whole.moment)
        for w in ws:
            r = step % w
            assert np.array_equal(plan.batch(step, r, w).moment, whole.moment[r::w])
        if step < 420:
            first = plan.cumulative(step)
            for c in range(m):
                got = sorted(whole.draw[whole.component == c].tolist())
                assert got == list(range(first[c], first[c] + len(got)))
    for s in range(60):
        batch = plan.batch(s)
        for c in range(m):
            draws[c] += sorted(batch.draw[batch.component == c].tolist())
    assert all(d == list(range(len(d))) for d in draws)


def schedule_starts(schedule):
    return [s.start for s in schedule.stages]


def test_pieces_with_the_same_shares_share_a_table_and_tables_are_bounded():
    same = StagedSeats(td.Schedule([(0, [1, 2, 3]), (10, [3, 2, 1]), (20, [1, 2, 3])]).pieces(), 7)
    assert same.seats[0] is same.seats[2]
    # ten distinct pieces of a 10**6-step period would need 80 MB of seat tables
    ws = [[123457 + k, 200000, 1, 676542 - k] for k in range(10)]  # shares over 10**6
    long = td.Schedule([(10 * k, w) for k, w in enumerate(ws)])
    with pytest.raises(PlanError, match="seat tables need over 64 MiB"):
        StagedSeats(long.pieces(), 7)

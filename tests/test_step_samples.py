"""StepSamples: each step's samples computed once for a loader's lookahead stage and reader."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import treadle as td
from plan_helpers import FakeRef, FakeTable
from treadle.read.steps import StepSamples, eval_samples, train_samples

FIELDS = ("component", "moment", "position", "draw")


@pytest.fixture(scope="module")
def plan():
    tables = [FakeTable("a", [120, 200, 90]), FakeTable("b", [300, 80])]
    comps = [td.Component(FakeRef(t), weight=w) for t, w in zip(tables, (0.4, 0.6))]
    return td.Recipe(3, 16, comps, shuffle=td.BlockShuffle(block_rows=16, window_blocks=3)).plan()


def _same(a, b):
    return a.step == b.step and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def test_the_stage_s_samples_are_read_only_and_the_reader_s_writable_copies(plan):
    memo = StepSamples(train_samples, plan, 1, 2, together=4, stop=6)
    seen = memo.ahead(3)
    assert _same(seen, plan.batch(3, 1, 2))
    assert all(not getattr(seen, f).flags.writeable for f in FIELDS)
    with pytest.raises(ValueError, match="read-only"):
        seen.moment[0] = 0
    assert memo.ahead(3) is seen  # kept
    assert sorted(memo._kept) == [3, 4, 5]  # the steps after it together, short of stop
    got = memo.take(plan, 3, 1, 2)
    assert _same(got, plan.batch(3, 1, 2))
    assert all(getattr(got, f).flags.writeable for f in FIELDS)
    assert not np.shares_memory(got.moment, seen.moment)
    got.moment[:] = -1  # the reader's own: the stage's stay as they were
    assert _same(seen, plan.batch(3, 1, 2))
    assert 3 not in memo._kept  # handed out once
    assert _same(memo.take(plan, 3, 1, 2), plan.batch(3, 1, 2))  # asked again: computed
    assert _same(memo.take(plan, 4, 0, 2), plan.batch(4, 0, 2))  # another rank's: computed
    assert 4 in memo._kept


def test_kept_steps_are_bounded_and_every_step_is_the_plan_s(plan):
    memo = StepSamples(train_samples, plan, 0, 1, keep=5)
    for step in range(40):
        assert _same(memo.ahead(step), plan.batch(step))
        assert len(memo._kept) <= 5
    for step in range(40):  # the dropped ones are computed again
        assert _same(memo.take(plan, step, 0, 1), plan.batch(step))


def test_other_samplers_are_kept_one_step_at_a_time(plan):
    calls = []

    def sampler(p, step, rank, world):
        calls.append(step)
        return eval_samples(p, step, rank, world)

    memo = StepSamples(sampler, plan, 0, 1)
    first = memo.ahead(2)
    assert calls == [2] and not first.valid.flags.writeable
    got = memo.take(plan, 2, 0, 1)
    assert calls == [2] and got.valid.flags.writeable
    assert np.array_equal(got.moment, eval_samples(plan, 2, 0, 1).moment)
    assert memo.ahead(7) is not None and calls == [2, 7]


def test_threads_asking_at_once_get_the_plan_s_samples(plan):
    memo = StepSamples(train_samples, plan, 0, 1, keep=64)
    wrong = []

    def ask(first):
        for step in range(first, 60, 3):
            for got in (memo.ahead(step), memo.take(plan, step, 0, 1)):
                if not _same(got, plan.batch(step)):
                    wrong.append(step)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong

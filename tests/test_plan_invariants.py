"""Plan guarantees checked by brute force over whole plans: random mixes of components of very
different sizes (one row, blocks larger than the component), weight schedules with ramps,
full and block shuffles with partitions, and chains of exclusions at random steps."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError, PlanWarning
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord

STEPS = 24

_lengths = st.one_of(
    st.just([1]),  # a component of one row
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.lists(st.integers(5, 40), min_size=2, max_size=8),
)
_shuffle = st.one_of(
    st.none(),
    st.builds(
        td.BlockShuffle,
        st.sampled_from([1, 2, 3, 7, 10**6]),  # 10**6: one block larger than the component
        st.sampled_from([1, 2, 4]),
        st.sampled_from([1, 2, 4, 8]),
    ),
)


def _plan(lengths, batch, shuffle, seed, schedule=None, weights=None):
    tables = [FakeTable(f"t{i}", n) for i, n in enumerate(lengths)]
    weights = weights or [1.0] * len(tables)
    comps = [td.Component(FakeRef(t), weight=w) for t, w in zip(tables, weights, strict=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return td.Recipe(seed, batch, comps, schedule, shuffle=shuffle).plan(), tables


def _global(plan, steps, world):
    """Each step's global batch (component, moment) put together from every rank's slots."""
    b = plan.batch_size
    per_rank = [plan.batches(steps, r, world) for r in range(world)]
    out = []
    for i in range(len(steps)):
        comp, moment = np.empty(b, np.int64), np.empty(b, np.int64)
        for r in range(world):
            comp[r::world], moment[r::world] = per_rank[r][i].component, per_rank[r][i].moment
        out.append((comp, moment))
    return out


def _episode(table, moments):
    eps = table.episodes()
    return np.asarray(eps.names)[np.searchsorted(eps.starts, moments, side="right") - 1]


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(_lengths, min_size=1, max_size=3),
    batch=st.sampled_from([1, 4, 6, 12]),
    shuffle=_shuffle,
    seed=st.integers(0, 2**64 - 1),
    stages=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 3)), max_size=2),
)
def test_every_epoch_is_a_permutation_at_any_rank_count_and_from_the_record(
    lengths, batch, shuffle, seed, stages
):
    """Each component draws 0, 1, 2, ... without gaps; each of its epochs is its eligible
    moments once each, across schedule pieces and ramps; counts match ``plan.counts``; the
    global batch is the same at every rank count and after a round trip of the record."""
    c = len(lengths)
    schedule = None
    if c > 1 and stages:
        start, out = 0, [(0, [1.0] * c)]
        for gap, kind in stages:
            start += gap
            w = [float((i + kind) % 3) for i in range(c)]
            w = w if any(w) else [1.0] * c
            out.append((start, td.Ramp(w, steps=gap + 3) if kind % 2 else w))
        schedule = td.Schedule(out)
    try:
        plan, tables = _plan(lengths, batch, shuffle, seed, schedule)
    except PlanError:  # a schedule whose shares cannot be planned at this batch size
        return
    steps = list(range(STEPS))
    ref = plan.batches(steps)
    for world in (2, 3, 4):
        if batch % world == 0:
            got = _global(plan, steps, world)
            for (comp, moment), b in zip(got, ref, strict=True):
                assert (comp == b.component).all() and (moment == b.moment).all()
    again = Plan.from_record(RunRecord.from_json(plan.record.to_json()), FakeClient(tables))
    for s in (0, 7, STEPS - 1):
        assert (again.batch(s).moment == ref[s].moment).all()
    comp = np.concatenate([b.component for b in ref])
    draw = np.concatenate([b.draw for b in ref])
    moment = np.concatenate([b.moment for b in ref])
    total = plan.cumulative(STEPS)
    for k in range(c):
        n = plan.eligible(k)
        assert sorted(draw[comp == k].tolist()) == list(range(total[k]))
        everything = sorted(plan.eligible_moments(k, np.arange(n)).tolist())
        mine_d, mine_m = draw[comp == k], moment[comp == k]
        for e in range(total[k] // n):
            assert sorted(mine_m[mine_d // n == e].tolist()) == everything
    for s, b in enumerate(ref):
        assert np.bincount(b.component, minlength=c).tolist() == plan.counts(s).tolist()


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.lists(st.integers(1, 20), min_size=4, max_size=9), min_size=1, max_size=2),
    batch=st.sampled_from([4, 8, 12]),
    shuffle=_shuffle,
    seed=st.integers(0, 2**64 - 1),
    cuts=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sets(st.integers(0, 8), min_size=1, max_size=2),
            st.integers(0, STEPS - 1),
        ),
        min_size=1,
        max_size=3,
    ),  # fmt: skip
)
def test_chained_exclusions_keep_every_other_slot_and_resume_at_any_rank_count(
    lengths, batch, shuffle, seed, cuts
):
    """Exclusions of one table or another, at steps in any order: from its step on, no
    episode an exclusion names appears; every slot not holding one is the parent's; the
    derived record resumes to the same batches at every rank count."""
    plan, tables = _plan(lengths, batch, shuffle, seed)
    steps = list(range(STEPS))
    base = plan.batches(steps)
    run, done = plan, []
    for which, eps, step in cuts:
        table = tables[which % len(tables)]
        names = [f"ep{e}" for e in sorted(eps) if e < len(table.episodes().names)]
        if not names:
            continue
        try:
            run = run.exclude({table.name: names}, step)
        except PlanError:  # all already excluded, or a component left with nothing
            continue
        done.append((step, table.name, set(names)))
    got = run.batches(steps)
    again = Plan.from_record(RunRecord.from_json(run.record.to_json()), FakeClient(tables))
    for world in (1, 2, 4):
        for (comp, moment), b in zip(_global(again, steps, world), got, strict=True):
            assert (comp == b.component).all() and (moment == b.moment).all()
    for s, (old, new) in enumerate(zip(base, got, strict=True)):
        assert (old.component == new.component).all()
        out: dict[str, set[str]] = {}
        for start, name, names in done:
            if s >= start:
                out.setdefault(name, set()).update(names)
        for k, table in enumerate(tables):
            at = new.component == k
            gone = out.get(table.name, set())
            assert not set(_episode(table, new.moment[at]).tolist()) & gone
            kept = ~np.isin(_episode(table, old.moment[at]), list(gone))
            assert (old.moment[at][kept] == new.moment[at][kept]).all()

"""The plan's promises where the other plan tests do not go: block shuffles whose partitions the
rank count does or does not divide (locality), exclusions under weight schedules and windows
with offsets on both sides, one table read by two components, and what a loader delivers
(moments and the values at each window offset) at several rank counts, resumed at another."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError, PlanWarning
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord

STEPS = 16


def _recipe(tables, windows, weights, batch, shuffle, seed, schedule=None):
    comps = [td.Component(FakeRef(t), w, weight=x) for t, w, x in zip(tables, windows, weights)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return td.Recipe(seed, batch, comps, schedule, shuffle=shuffle).plan()


def _whole(plan, step, world):
    """The global batch of ``step`` put together from every rank's slots."""
    comp = np.empty(plan.batch_size, np.int64)
    moment = np.empty(plan.batch_size, np.int64)
    for r in range(world):
        b = plan.batch(step, r, world)
        assert (b.position == step * plan.batch_size + np.arange(r, plan.batch_size, world)).all()
        comp[r::world], moment[r::world] = b.component, b.moment
    return comp, moment


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.lists(st.integers(1, 30), min_size=1, max_size=5), min_size=1, max_size=3),
    weights=st.lists(st.sampled_from([1.0, 0.5, 3.0, 0.125]), min_size=3, max_size=3),
    batch=st.sampled_from([4, 6, 8, 12, 16, 24]),
    block=st.sampled_from([1, 3, 8, 10**6]),
    window=st.sampled_from([1, 2, 5]),
    parts=st.sampled_from([2, 3, 4, 6, 8, 16, 48]),
    seed=st.integers(0, 2**64 - 1),
)
def test_ranks_that_divide_the_partitions_read_their_own(
    lengths, weights, batch, block, window, parts, seed
):
    """With ``W | P`` rank ``r`` reads partitions ``p mod W = r`` but for the leftovers, and
    there are no more of those than the batch forces (per partition, items past its slots);
    at any rank count dividing the batch, divisor of ``P`` or not, the batches are the same."""
    tables = [FakeTable(f"t{i}", n) for i, n in enumerate(lengths)]
    plan = _recipe(tables, [None] * len(tables), weights[: len(tables)], batch,
                   td.BlockShuffle(block, window, parts), seed)  # fmt: skip
    elig = np.asarray([plan.eligible(c) for c in range(plan.num_components)])
    slots = np.arange(batch)
    for step in range(STEPS):
        whole = plan.batch(step)
        part = whole.draw % elig[whole.component] % parts  # the block shuffle's partition
        have = np.bincount(part, minlength=parts)
        room = np.bincount(slots % parts, minlength=parts)
        left = part != slots % parts
        assert left.sum() == batch - np.minimum(have, room).sum()
        for world in range(1, 9):
            if batch % world:
                continue
            comp, moment = _whole(plan, step, world)
            assert (comp == whole.component).all() and (moment == whole.moment).all()
            if parts % world == 0:
                for r in range(world):
                    mine = slots % world == r
                    assert (part[mine & ~left] % world == r).all()


_offsets = st.tuples(st.integers(-3, 0), st.integers(0, 3), st.booleans())


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.lists(st.integers(1, 12), min_size=2, max_size=6), min_size=1, max_size=2),
    spans=st.lists(_offsets, min_size=3, max_size=3),
    batch=st.sampled_from([2, 4, 6, 8]),
    shuffle=st.one_of(
        st.none(),
        st.builds(
            td.BlockShuffle,
            st.sampled_from([1, 2, 5]),
            st.sampled_from([1, 3]),
            st.sampled_from([1, 2, 4]),
        ),  # fmt: skip
    ),
    ramps=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4), st.booleans()), max_size=2),
    cuts=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sets(st.integers(0, 5), min_size=1, max_size=3),
            st.integers(0, STEPS - 1),
        ),
        min_size=1,
        max_size=3,
    ),  # fmt: skip
    seed=st.integers(0, 2**64 - 1),
)
def test_exclusions_under_schedules_and_windows_change_only_their_slots(
    lengths, spans, batch, shuffle, ramps, cuts, seed
):
    """A weight schedule (ramps included), windows reaching before and after the anchor
    (padded or not), the first table read by a second component with other windows, and a
    chain of exclusions: from each exclusion's step its episodes are gone, every other slot is
    the parent's, every moment is an anchor of its component, and the derived record gives
    the same batches at every rank count and at ``plan.at``."""
    tables = [FakeTable(f"t{i}", n) for i, n in enumerate(lengths)]
    reads = [*tables, tables[0]]
    windows = [td.Windows({"action": td.Rows(range(lo, hi + 1), pad=pad)}) for lo, hi, pad in spans]
    c = len(reads)
    schedule = None
    if ramps:
        stages, start = [(0, [1.0] * c)], 0
        for gap, k, ramp in ramps:
            start += gap
            w = [float((i + k) % 3) or 0.5 for i in range(c)]
            stages.append((start, td.Ramp(w, steps=gap + 1) if ramp else w))
        schedule = td.Schedule(stages)
    try:
        plan = _recipe(reads, windows[:c], [1.0] * c, batch, shuffle, seed, schedule)
    except PlanError:  # every episode shorter than a window, or shares this batch cannot plan
        return
    run, done = plan, []
    for which, eps, step in cuts:
        table = tables[which % len(tables)]
        names = [f"ep{e}" for e in sorted(eps) if e < len(table.episodes().names)]
        try:
            run = run.exclude({table.name: names}, step)
        except PlanError:  # never drawn, already excluded, or a component left with nothing
            continue
        done.append((step, table.name, set(names)))
    again = Plan.from_record(RunRecord.from_json(run.record.to_json()), FakeClient(tables))
    assert again.run_id == run.run_id
    for step, (old, new) in enumerate(zip(plan.batches(range(STEPS)), run.batches(range(STEPS)))):
        assert (old.component == new.component).all() and (old.draw == new.draw).all()
        for world in (1, 2, 3):
            if batch % world == 0:
                comp, moment = _whole(again, step, world)
                assert (comp == new.component).all() and (moment == new.moment).all()
        slot = step % batch
        assert run.at(step * batch + slot) == (int(new.component[slot]), int(new.moment[slot]))
        for k in range(c):
            at = new.component == k
            eps = plan.table(k).episodes()
            name = np.asarray(eps.names)
            e_old = name[np.searchsorted(eps.starts, old.moment[at], side="right") - 1]
            e_new = name[np.searchsorted(eps.starts, new.moment[at], side="right") - 1]
            gone = set().union(*[n for s, t, n in done if s <= step and t == reads[k].name])
            assert not set(e_new.tolist()) & gone
            kept = ~np.isin(e_old, list(gone))
            assert (old.moment[at][kept] == new.moment[at][kept]).all()
            first, stop = plan.anchor_runs(k)
            i = np.searchsorted(first, new.moment[at], side="right") - 1
            assert (i >= 0).all() and (new.moment[at] < stop[np.maximum(i, 0)]).all()


# -- what a loader delivers ------------------------------------------------------------------

_OFFSETS = [-2, 0, 1, 3]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two tables whose rows say (table, episode, frame): each value read can be checked."""
    root = str(tmp_path_factory.mktemp("attack") / "store")
    client = td.Client(root, create=True)
    branch = client.project("p").branch()
    with branch.transaction("data") as tx:
        for t, lengths in (("a", [5, 1, 13, 7, 2, 9]), ("b", [3, 20, 4, 6])):
            for e, n in enumerate(lengths):
                v = np.stack([np.full(n, 100 * (ord(t) - 96) + e), np.arange(n)], 1)
                tx.table(t).append_episode({"act": v.astype(np.float32)}, episode=f"{t}{e}")
    return client, branch


@pytest.fixture(scope="module")
def run(store):
    """Scheduled, block-shuffled into 4 partitions, then two exclusions at steps 2 and 5."""
    _, branch = store
    w = td.Windows({"act": td.Rows(_OFFSETS, pad=True)})
    comps = [td.Component(branch.table("a"), w, weight=0.4),
             td.Component(branch.table("b"), w, weight=0.6)]  # fmt: skip
    schedule = td.Schedule([(0, [1, 1]), (3, td.Ramp([1, 3], steps=4))])
    plan = td.Recipe(seed=5, batch_size=12, components=comps, schedule=schedule,
                     shuffle=td.BlockShuffle(3, 2, 4)).plan()  # fmt: skip
    return plan.exclude({"a": ["a2"]}, 2).exclude({"b": ["b1"], "a": ["a5"]}, 5)


def _check_values(run, batch, step, rank, world):
    want = run.batch(step, rank, world)
    assert batch["_moment"].tolist() == want.moment.tolist()
    assert batch["_component"].tolist() == want.component.tolist()
    for i, (c, m) in enumerate(zip(want.component.tolist(), want.moment.tolist())):
        eps = run.table(c).episodes()
        e = int(np.searchsorted(eps.starts, m, side="right") - 1)
        frame, n = m - int(eps.starts[e]), int(eps.lengths[e])
        assert (int(batch["_episode"][i]), int(batch["_frame"][i])) == (e, frame)
        for k, o in enumerate(_OFFSETS):
            f = min(max(frame + o, 0), n - 1)
            assert batch["act"][i, k].tolist() == [100 * (c + 1) + e, f]
            assert bool(batch["act_is_pad"][i, k]) == (f != frame + o)


@pytest.mark.parametrize(("world", "workers", "then"), [(4, 0, 3), (3, 2, 1), (2, 0, 4)])
def test_a_loader_delivers_the_plans_batches_and_resumes_at_another_rank_count(
    store, run, world, workers, then
):
    """Each rank's batches are ``plan.batch(step, rank, world)`` with the values of each window
    offset (padded at the episode's edges), partitions divided by the rank count or not; a
    state saved after 3 steps resumes at ``then`` ranks with the batches those ranks have."""
    client, _ = store
    steps = 8
    for rank in range(world):
        loader = td.TrainLoader(run, rank=rank, world_size=world, steps=steps, workers=workers)
        it = iter(loader)
        for step in range(3):
            _check_values(run, next(it), step, rank, world)
        state = loader.state_dict()
        it.close()
    assert state["step"] == 3
    for rank in range(then):
        again = td.TrainLoader.from_state(state, client, rank=rank, world_size=then, steps=steps)
        got = list(again)
        assert len(got) == steps - 3
        for step, batch in enumerate(got, start=3):
            _check_values(run, batch, step, rank, then)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    b=st.one_of(st.integers(1, 8), st.integers(1, 320)),
    w=st.sampled_from([1, 2, 7, 64, 1024]),
    p=st.one_of(st.integers(1, 4), st.integers(1, 320)),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**40),
)
def test_block_orders_at_their_extremes_are_bijections_and_redraws_rotate_segments(
    n, b, w, p, seed, epoch
):
    """``window_blocks`` past the blocks (up to 1024), partitions past the moments (empty
    ones), blocks past their partition: each epoch, and each exclusion attempt's redraws, are
    bijections of the component's eligible moments; with ``w = 1`` a redraw stays in its
    block (its segment)."""
    from treadle.plan.order_block import BlockOrder

    order = BlockOrder(seed, [n], [b], w, p)
    args = (np.zeros(n, np.int64), np.full(n, epoch, np.int64), np.arange(n, dtype=np.int64))
    got = order.eligible(*args)
    assert sorted(got.tolist()) == list(range(n))
    for attempt in (0, 31):
        moved = order.eligible(*args, attempt=attempt)
        assert sorted(moved.tolist()) == list(range(n))
        if w == 1:  # each partition's blocks of b rows, from the partition's first moment
            part = np.arange(n) % p
            start = part * (n // p) + np.minimum(part, n % p)
            assert ((got - start) // b == (moved - start) // b).all()


def test_the_card_counts_open_blocks_per_partition():
    """With ``partitions=4`` the card said "at most 2 open at once per component": each
    partition has its own open blocks, 8 of them in all for the component."""
    from treadle.plan.card import render_card

    t = FakeTable("t", [40, 40])
    order = _recipe([t], [None], [1.0], 8, td.BlockShuffle(5, 2, 4), 0)
    card = render_card(order.record)
    assert "blocks of 5 rows, at most 2 open at once per partition of a component, 4 parti" in card
    first = order.moments(0, np.arange(80))  # the component's first epoch
    blocks = [set((first[i : i + 8] // 5).tolist()) for i in range(0, 73, 4)]
    assert max(len(b) for b in blocks) > 2  # more than 2 blocks read within a few draws
    one = render_card(_recipe([t], [None], [1.0], 8, td.BlockShuffle(5, 2), 0).record)
    assert "blocks of 5 rows, at most 2 open at once per component, 1 partition\n" in one

"""td.BlockShuffle: a pure, exact, rank-invariant block-local order of each component's draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from plan_helpers import FakeClient, FakeRef, FakeTable
from treadle.errors import PlanError
from treadle.plan.card import render_card
from treadle.plan.order_block import BlockOrder, block_index
from treadle.plan.order_full import full_index
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord


def _epoch(order, comp, n, epoch):
    idx = np.arange(n, dtype=np.int64)
    return order.eligible(np.full(n, comp, np.int64), np.full(n, epoch, np.int64), idx)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 400),
    b=st.integers(1, 60),
    w=st.integers(1, 9),
    p=st.integers(1, 6),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 10**6),
)
def test_each_epoch_is_a_bijection(n, b, w, p, seed, epoch):
    order = BlockOrder(seed, [n, 7], [b, 3], w, p)
    got = _epoch(order, 0, n, epoch)
    assert sorted(got.tolist()) == list(range(n))
    # pure: the one-draw function gives the same index
    i = (seed + epoch) % n
    assert block_index(seed, 0, epoch, i, n, b, w, p) == got[i]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(50, 3000), b=st.integers(2, 80), w=st.integers(1, 6), seed=st.integers(0, 99))
def test_draws_stay_within_the_open_blocks(n, b, w, seed):
    """Any run of b draws reads at most w + 2 blocks (three segments: w open, a short block's
    segment between two others); the full permutation reads about b."""
    b = max(b, 2 * w)
    got = _epoch(BlockOrder(seed, [n], [b], w, 1), 0, n, 3)
    blocks = got // b
    for start in range(0, n - b + 1, max(1, b // 2)):
        assert len(set(blocks[start : start + b].tolist())) <= w + 2


def test_the_full_order_is_the_planner_s_old_permutation():
    """full_index is the permutation every run without a shuffle has always walked."""
    a = FakeTable("grasps", [40, 25, 31])
    plan = td.Recipe(11, 8, [td.Component(FakeRef(a), weight=1.0)]).plan()
    draws = np.arange(200)
    assert plan.moments(0, draws).tolist() == [
        full_index(11, 0, d // 96, d % 96, 96) for d in draws
    ]


@pytest.fixture(scope="module")
def tables():
    return [FakeTable("grasps", [120, 200, 90, 150, 33]), FakeTable("pushes", [300, 80, 41])]


def _recipe(tables, shuffle, batch=24, weights=(0.55, 0.45), seed=7):
    comps = [td.Component(FakeRef(t), weight=w) for t, w in zip(tables, weights)]
    return td.Recipe(seed, batch, comps, shuffle=shuffle)


@pytest.fixture(scope="module")
def plans(tables):
    full = _recipe(tables, None).plan()
    block = _recipe(tables, td.BlockShuffle(block_rows=16, window_blocks=3)).plan()
    parts = _recipe(tables, td.BlockShuffle(block_rows=8, window_blocks=2, partitions=4)).plan()
    return full, block, parts


def test_shares_and_draws_are_the_full_permutation_s(plans):
    full, block, parts = plans
    for step in [0, 1, 2, 37, 1000, 10**9]:
        f = full.batch(step)
        for other in (block, parts):
            o = other.batch(step)
            assert np.array_equal(np.sort(f.component), np.sort(o.component))
            assert np.array_equal(full.counts(step), other.counts(step))
            key = np.lexsort((o.draw, o.component))
            assert np.array_equal(np.sort(f.draw + 10**12 * f.component),
                                  (o.draw + 10**12 * o.component)[key])  # fmt: skip


def test_every_moment_once_per_component_epoch(plans):
    _, block, parts = plans
    for plan in (block, parts):
        for c in range(plan.num_components):
            n = plan.eligible(c)
            for epoch in (0, 5):
                got = plan.moments(c, np.arange(epoch * n, (epoch + 1) * n))
                first, stop = plan.anchor_runs(c)
                want = np.concatenate([np.arange(a, z) for a, z in zip(first, stop)])
                assert np.array_equal(np.sort(got), want)


@pytest.mark.parametrize("which", [1, 2])
def test_same_batches_at_any_rank_count(plans, which):
    plan = plans[which]
    for step in [0, 3, 99, 12345]:
        whole = plan.batch(step)
        for world in (2, 3, 4, 8, 12, 24):
            got = np.empty_like(whole.moment)
            comp = np.empty_like(whole.component)
            for r in range(world):
                b = plan.batch(step, r, world)
                got[r::world], comp[r::world] = b.moment, b.component
            assert np.array_equal(got, whole.moment) and np.array_equal(comp, whole.component)


def test_pure_resume_from_the_record(plans, tables):
    for plan in plans[1:]:
        again = Plan.from_record(RunRecord.from_json(plan.record.to_json()), FakeClient(tables))
        assert again.run_id == plan.run_id
        for step in [0, 17, 5000, 10**10]:
            assert np.array_equal(again.batch(step, 1, 4).moment, plan.batch(step, 1, 4).moment)
            pos = step * plan.batch_size + 5
            assert again.at(pos) == plan.at(pos)


def test_record_names_the_shuffle_and_old_records_are_the_full_permutation(plans):
    full, block, parts = plans
    assert "shuffle" not in full.record.to_dict()
    assert len({full.run_id, block.run_id, parts.run_id}) == 3
    sh = block.record.to_dict()["shuffle"]
    assert sh == {"algorithm": "treadle.block/1", "block_rows": [16, 16],
                  "window_blocks": 3, "partitions": 1}  # fmt: skip
    assert "treadle.block/1" in render_card(block.record)
    assert "full permutation" in render_card(full.record)
    bad = block.record.to_dict()
    for wrong in ({"block_rows": [16]}, {"block_rows": [16, None]}, {"partitions": 0},
                  {"row_bytes": [1, "x"]}, {"algorithm": "treadle.block/9"}, {"extra": 1}):  # fmt: skip
        bad["shuffle"] = {**sh, **wrong}
        with pytest.raises(PlanError, match="shuffle"):
            RunRecord.from_json(bad)


def test_partitions_keep_slots_on_their_class(plans):
    """With W dividing P, rank r reads partitions r mod W; items left over are few."""
    plan = plans[2]
    order, matched, total = plan._order, 0, 0
    for step in range(200):
        b = plan.batch(step)
        part = order.partition(b.component, b.draw % plan._elig[b.component])
        slots = np.arange(plan.batch_size)
        matched += int((part == slots % 4).sum())
        total += plan.batch_size
        # the most that can match: per partition, min(items, slots of its class)
        have = np.bincount(part, minlength=4)
        assert (part == slots % 4).sum() == np.minimum(have, plan.batch_size // 4).sum()
    assert matched / total > 0.8


def test_bad_arguments():
    for kwargs in ({"block_rows": 0}, {"window_blocks": 0}, {"partitions": 0},
                   {"block_rows": 2.5}, {"window_blocks": 5000}):  # fmt: skip
        with pytest.raises(PlanError, match="BlockShuffle"):
            td.BlockShuffle(**kwargs)
    with pytest.raises(PlanError, match="shuffle"):
        td.Recipe(1, 4, [td.Component(FakeRef(FakeTable("t", [9])))], shuffle="block")


def test_exclude_redraws_within_the_segment(tables):
    plan = _recipe(
        tables, td.BlockShuffle(block_rows=16, window_blocks=2), weights=(1.0, 0.0001)
    ).plan()
    derived = plan.exclude(episodes={"grasps": ["ep1"]}, from_step=0)
    n, order, local, changed = plan.eligible(0), plan._order, 0, 0
    every = plan.moments(0, np.arange(3 * n))  # draws of epochs 0..2 (no windows: index = row)
    for step in range(0, 60):
        p, d = plan.batch(step), derived.batch(step)
        bad = (p.component == 0) & (p.moment >= 120) & (p.moment < 320)
        assert np.array_equal(p.moment[~bad], d.moment[~bad])
        assert not ((d.component == 0) & (d.moment >= 120) & (d.moment < 320)).any()
        js = p.draw[bad]
        args = [np.zeros(js.size, np.int64), js // n, js % n]
        every_try = np.stack([order.eligible(*args, attempt=a) for a in range(32)], axis=1)
        for j, m, tries in zip(js, d.moment[bad], every_try.tolist()):
            changed += 1
            near = every[max(j - 32, (j // n) * n) : min(j + 32, (j // n + 1) * n)] // 16
            assert {t // 16 for t in tries} <= set(near.tolist())  # the segment's open blocks
            kept = [t for t in tries if not 120 <= t < 320]
            if kept:  # the first kept position of its segment, else the run-wide redraw
                assert m == kept[0]
                local += 1
    assert changed > 100 and local > changed / 2


def test_default_blocks_fit_half_the_cache(tmp_path, monkeypatch):
    """BlockShuffle() sizes blocks so that sum 2 * block bytes (the rows of the segment read
    and of the next) <= half the cache bound, counting video packets; the card states the
    cache it needs."""
    from treadle.video.values import VideoFrames

    client = td.Client(str(tmp_path), create=True)
    branch = client.project("robotics").branch("main")
    cams, acts = branch.table("cams"), branch.table("acts")
    rng = np.random.default_rng(0)
    for i in range(3):
        frames = rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8)
        cams.append_episode({"cam": VideoFrames(frames, fps=30)}, episode=f"c{i}")
        acts.append_episode({"action": rng.random((60, 7), np.float32)}, episode=f"a{i}")
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "256K")
    comps = [td.Component(cams, weight=0.5), td.Component(acts, weight=0.5)]
    plan = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle()).plan()
    sh = plan.record.shuffle
    assert sh.window_blocks == 4 and sh.partitions == 1 and sh.row_bytes is not None
    assert sh.row_bytes[0] > 500  # the video packets of a 32x32 noise frame are counted
    assert sh.cache_needed() <= (256 << 10) // 2
    share = (256 << 10) // 2 // 2 // 2  # a block's bytes: half the cache, 2 tables, 2 blocks
    # (w + 1) blocks gave 2.5x fewer rows; a block is at most its component (180 moments)
    assert sh.block_rows == tuple(min(180, share // b) for b in sh.row_bytes)
    assert 1 <= sh.block_rows[0] < sh.block_rows[1] <= 180
    assert "cache needed:" in render_card(plan.record)
    again = Plan.from_record(plan.record.to_json(), client)  # the sizes are the record's now
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1G")
    assert np.array_equal(again.batch(3).moment, plan.batch(3).moment)
    monkeypatch.setenv("TREADLE_CACHE_BYTES", " ")  # the cache refuses it: so does the sizing
    with pytest.raises(PlanError, match="TREADLE_CACHE_BYTES=' ' is not a size"):
        td.Recipe(3, 8, comps, shuffle=td.BlockShuffle()).plan()


def test_the_card_counts_the_rows_in_use_as_its_cache_figure_does(tmp_path, monkeypatch):
    """The card said "4 open per component" beside a cache figure of 5 blocks a component:
    a segment reads a contiguous 1/w of each of its w open blocks, one block's rows, and the
    next segment is fetched ahead: the figure counts two blocks' rows, and says why."""
    from treadle.plan.card import _bytes_text

    client = td.Client(str(tmp_path), create=True)
    acts = client.project("robotics").branch("main").table("acts")
    rng = np.random.default_rng(0)
    for i in range(3):
        acts.append_episode({"action": rng.random((60, 7), np.float32)}, episode=f"a{i}")
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "3K")
    plan = td.Recipe(3, 8, [td.Component(acts)], shuffle=td.BlockShuffle()).plan()
    sh = plan.record.shuffle
    assert sh.block_rows[0] < 180 // 5  # several blocks: w of them open at once
    assert sh.cache_needed() == 2 * sh.block_rows[0] * sh.row_bytes[0]
    card = render_card(plan.record)
    assert f"blocks of {sh.block_rows[0]} rows, at most 4 open at once per component, " in card
    assert (
        f"cache needed: {_bytes_text(sh.cache_needed())} for two blocks' rows per component "
        "(a segment reads 1/4 of each of its 4 open blocks; the next segment is fetched ahead), "
        "per partition a node reads; twice that with the chunks they straddle"
    ) in card


def test_a_block_past_the_component_is_recorded_as_it_and_the_card_says_so(tmp_path, monkeypatch):
    """``BlockShuffle(block_rows=10**9)`` records the partition's size: the same draws as the
    ask, and the same run as asking for that size; the card said "4 open per component" of a
    component that is one block, read in 4 parts in table order, and counted 5 of its blocks
    in the cache it needs."""
    from treadle.plan.card import _bytes_text

    client = td.Client(str(tmp_path), create=True)
    acts = client.project("robotics").branch("main").table("acts")
    for i in range(3):
        acts.append_episode({"action": np.zeros((60, 7), np.float32)}, episode=f"e{i}")
    comps = [td.Component(acts)]
    for parts, size in ((1, 180), (4, 45)):
        big = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle(10**9, partitions=parts)).plan()
        same = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle(size, partitions=parts)).plan()
        assert big.record.shuffle.block_rows == (size,)
        assert big.record.run_id == same.record.run_id
        card = render_card(big.record)
        each = "partition of a component" if parts > 1 else "component"
        assert f"blocks of {size} rows, at most 4 open at once per {each}" in card
        assert (
            "component 0: one block a partition (block_rows is capped at a partition's moments: "
            "a larger one draws the same); an epoch reads it in 4 parts in table order, "
            "shuffled within each"
        ) in card
    one = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle(10**9, window_blocks=1)).plan()
    assert "an epoch shuffles it whole\n" in render_card(one.record)
    several = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle(100)).plan()
    assert "one block a partition" not in render_card(several.record)  # 2 blocks
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1G")  # default sizing: the cap again
    plan = td.Recipe(3, 8, comps, shuffle=td.BlockShuffle()).plan()
    sh = plan.record.shuffle
    assert sh.block_rows == (180,) and sh.cache_needed([180]) == 180 * sh.row_bytes[0]
    assert f"cache needed: {_bytes_text(180 * sh.row_bytes[0])} for two blocks' rows" in (
        render_card(plan.record)
    )


def test_runs_without_a_shuffle_keep_their_ids_and_batches():
    """Pinned from main before block shuffles (2a2d64a): the same run ids and moments."""
    a, b = FakeTable("grasps", [120, 200, 90]), FakeTable("pushes", [300, 41])
    comps = [td.Component(FakeRef(a), weight=0.55), td.Component(FakeRef(b), weight=0.45)]
    plan = td.Recipe(7, 24, comps).plan()
    derived = plan.exclude(episodes={"grasps": ["ep1"]}, from_step=3)
    assert (plan.run_id, derived.run_id) == ("938019357c9c8284", "f03eb5f59422357f")
    assert plan.batch(12345, 1, 4).moment.tolist() == [149, 84, 98, 184, 155, 265]
    assert derived.batch(20).moment.tolist() == [
        120, 82, 85, 63, 52, 105, 336, 75, 3, 111, 125, 66,
        352, 145, 18, 330, 284, 349, 399, 99, 346, 54, 355, 92,
    ]  # fmt: skip


def _same(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("component", "moment", "position", "draw")) and a.step == b.step  # fmt: skip


def test_batches_of_several_steps_are_each_step_s_batch(plans, tables):
    """Plan.batches computes its steps together: the batches of Plan.batch, step by step, for
    every shuffle and a derived run (redrawn from its own step on)."""
    derived = plans[1].exclude(episodes={"grasps": ["ep1"], "pushes": ["ep0"]}, from_step=5)
    for plan in (*plans, derived):
        for steps, rank, world in (([0, 1, 2, 3, 4, 5, 6, 7, 8], 0, 1), ([9, 3, 10**9, 3], 2, 4),
                                   ([4], 5, 6), ([], 0, 1)):  # fmt: skip
            got = plan.batches(steps, rank, world)
            assert [b.step for b in got] == steps
            assert all(_same(b, plan.batch(s, rank, world)) for b, s in zip(got, steps))
    with pytest.raises(PlanError, match="step"):
        plans[0].batches([0, -1])

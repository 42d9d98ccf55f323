"""Padded windows (LeRobot's edge padding): clamped rows and frames, ``<column>_is_pad``,
eligibility from the unpadded specs only, and float offsets refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treadle as td
from treadle.errors import PlanError

LENGTHS = (5, 9, 3, 7)


def _project(root, lengths=LENGTHS, video=False, fps=None):
    client = td.Client(root)
    branch = client.project("robotics").branch()
    rng = np.random.default_rng(1)
    with branch.transaction("episodes") as tx:
        for e, n in enumerate(lengths):
            cols = {
                "action": np.stack([np.full(n, e), np.arange(n)], 1).astype(np.float32),
            }
            if video:
                cols["cam"] = td.VideoFrames(
                    rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8), fps=30
                )
            tx.table("demo").append_episode(cols, episode=f"ep-{e}")
    return branch


def _clamped(episode_of, frame_of, offsets, lengths):
    """Reference: (episode, clamped frame) per offset, and where it was clamped."""
    want = frame_of[:, None] + np.asarray(offsets)[None, :]
    last = np.asarray(lengths)[episode_of][:, None] - 1
    return np.clip(want, 0, last), (want < 0) | (want > last)


def _recipe(branch, windows, batch_size=4, seed=7):
    return td.Recipe(
        seed=seed, batch_size=batch_size, components=[td.Component(branch.table("demo"), windows)]
    )


OFFSETS = (-3, -1, 0, 2, 4)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_padded_rows_equal_a_clamped_reference(tmp_path, world):
    branch = _project(str(tmp_path))
    plan = _recipe(branch, td.Windows({"action": td.Rows(OFFSETS, pad=True)})).plan()
    assert plan.eligible(0) == sum(LENGTHS)  # all padded: every moment is an anchor
    starts = np.cumsum((0, *LENGTHS))[:-1]
    seen = set()
    for rank in range(world):
        loader = td.TrainLoader(plan, rank=rank, world_size=world, steps=6)
        for batch in loader:
            m = batch["_moment"].numpy()
            e = np.searchsorted(starts, m, side="right") - 1
            frames, pad = _clamped(e, m - starts[e], OFFSETS, LENGTHS)
            action = batch["action"].numpy()
            assert action.shape == (len(m), len(OFFSETS), 2)
            np.testing.assert_array_equal(action[..., 0], np.repeat(e[:, None], len(OFFSETS), 1))
            np.testing.assert_array_equal(action[..., 1], frames)
            assert batch["action_is_pad"].dtype == td_bool()
            np.testing.assert_array_equal(batch["action_is_pad"].numpy(), pad)
            seen.update(m.tolist())
    assert seen == set(range(sum(LENGTHS)))  # episode ends are drawn too


def td_bool():
    import torch

    return torch.bool


def test_padding_survives_a_resume(tmp_path):
    branch = _project(str(tmp_path))
    plan = _recipe(branch, td.Windows({"action": td.Rows(OFFSETS, pad=True)})).plan()
    full = [{k: v.numpy().copy() for k, v in b.items()} for b in td.TrainLoader(plan, steps=5)]
    loader = td.TrainLoader(plan, steps=5)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    del it
    resumed = td.TrainLoader.from_state(state, branch.project.client, steps=5)
    for want, got in zip(full[2:], resumed, strict=True):
        for k in want:
            np.testing.assert_array_equal(want[k], got[k].numpy())


def test_only_unpadded_specs_limit_eligibility(tmp_path):
    branch = _project(str(tmp_path))
    windows = td.Windows({"action": td.Rows(range(3)), "frame": td.Rows(range(-2, 6), pad=True)})
    plan = _recipe(branch, windows).plan()
    assert plan.eligible(0) == sum(n - 2 for n in LENGTHS)
    assert plan.kept(0) == (sum(n - 2 for n in LENGTHS), sum(LENGTHS))
    batch = next(iter(td.TrainLoader(plan, steps=1)))
    assert set(batch) >= {"action", "frame", "frame_is_pad"} and "action_is_pad" not in batch


def test_padded_video_repeats_the_edge_frames(tmp_path):
    branch = _project(str(tmp_path), video=True)
    plan = _recipe(branch, td.Windows({"cam": td.Video(OFFSETS, pad=True)}), batch_size=8).plan()
    exact = _recipe(branch, td.Windows({"cam": td.Video([0])}), batch_size=8).plan()
    starts = np.cumsum((0, *LENGTHS))[:-1]
    # every frame, decoded unpadded, by moment
    frames = {}
    for b in td.TrainLoader(exact, steps=6):
        for m, f in zip(b["_moment"].tolist(), b["cam"].numpy()):
            frames[m] = f[0]
    assert len(frames) == sum(LENGTHS)
    for batch in td.TrainLoader(plan, steps=3):
        m = batch["_moment"].numpy()
        e = np.searchsorted(starts, m, side="right") - 1
        clamped, pad = _clamped(e, m - starts[e], OFFSETS, LENGTHS)
        np.testing.assert_array_equal(batch["cam_is_pad"].numpy(), pad)
        for i in range(len(m)):
            for j in range(len(OFFSETS)):
                np.testing.assert_array_equal(
                    batch["cam"].numpy()[i, j], frames[int(starts[e[i]] + clamped[i, j])]
                )


def test_card_reports_anchors_kept_and_warns(tmp_path):
    from treadle.plan.card import render_card

    branch = _project(str(tmp_path))
    short = _recipe(branch, td.Windows({"action": td.Rows(range(3))})).plan()
    card = render_card(short.record)
    assert "16 of 24 moments kept (67%)" in card
    assert "warning" in card.lower()
    padded = _recipe(branch, td.Windows({"action": td.Rows(range(3), pad=True)})).plan()
    card = render_card(padded.record)
    assert "24 of 24 moments kept (100%)" in card and "warning" not in card.lower()


@pytest.mark.parametrize("bad", [[-1.5, 0], [0.0, 1.0], [np.float32(1)]])
def test_float_frame_offsets_are_refused(bad):
    with pytest.raises(PlanError, match="integer frame offsets"):
        td.Rows(bad)
    with pytest.raises(PlanError, match="integer frame offsets"):
        td.Video(bad)


def test_run_id_changes_with_pad(tmp_path):
    branch = _project(str(tmp_path))
    a = _recipe(branch, td.Windows({"action": td.Rows(range(3))})).plan().run_id
    b = _recipe(branch, td.Windows({"action": td.Rows(range(3), pad=True)})).plan().run_id
    assert a != b


# -- seconds and fps -------------------------------------------------------------------


def _rows_table(branch, name, lengths, fps, offset=0):
    with branch.transaction(f"{name}") as tx:
        for e, n in enumerate(lengths):
            action = np.stack([np.full(n, e + offset), np.arange(n)], 1).astype(np.float32)
            tx.table(name).append_episode({"action": action}, episode=f"{name}-{e}", fps=fps)


def test_seconds_deliver_the_rows_of_the_equivalent_frame_offsets(tmp_path):
    branch = td.Client(str(tmp_path)).project("robotics").branch()
    _rows_table(branch, "slow", (40, 25), fps=10)
    _rows_table(branch, "fast", (90, 61), fps=30)
    assert branch.table("slow").fps == 10 and branch.table("fast").fps == 30
    seconds = [-0.2, 0.0, 0.5, 1.0]

    def recipe(slow, fast):
        return td.Recipe(
            seed=3,
            batch_size=8,
            components=[
                td.Component(branch.table("slow"), td.Windows({"action": slow}), weight=1),
                td.Component(branch.table("fast"), td.Windows({"action": fast}), weight=1),
            ],
        )

    by_seconds = recipe(td.Rows(seconds=seconds), td.Rows(seconds=seconds)).plan()
    by_frames = recipe(td.Rows([-2, 0, 5, 10]), td.Rows([-6, 0, 15, 30])).plan()
    record = by_seconds.record.to_dict()
    assert [c["windows"]["action"]["offsets"] for c in record["components"]] == [
        [-2, 0, 5, 10],
        [-6, 0, 15, 30],
    ]
    assert by_seconds.run_id != by_frames.run_id  # the seconds are part of the run
    assert [by_seconds.eligible(c) for c in (0, 1)] == [by_frames.eligible(c) for c in (0, 1)]
    for a, b in zip(td.TrainLoader(by_seconds, steps=4), td.TrainLoader(by_frames, steps=4)):
        np.testing.assert_array_equal(a["_moment"].numpy(), b["_moment"].numpy())
        np.testing.assert_array_equal(a["action"].numpy(), b["action"].numpy())
    # a parsed record plans the same batches
    again = td.Plan.from_record(by_seconds.record.to_json(), branch.project.client)
    assert again.run_id == by_seconds.run_id
    assert again.windows(1)["action"].offsets == (-6, 0, 15, 30)


def test_seconds_off_the_frame_grid_or_without_fps_are_refused(tmp_path):
    branch = td.Client(str(tmp_path)).project("robotics").branch()
    _rows_table(branch, "slow", (40,), fps=10)
    _rows_table(branch, "nofps", (40,), fps=None)
    assert branch.table("nofps").fps is None

    def plan(name, spec):
        w = td.Windows({"action": spec})
        return td.Recipe(1, 2, [td.Component(branch.table(name), w)]).plan()

    with pytest.raises(PlanError, match=r"'action'.*0\.25.*10 fps"):
        plan("slow", td.Rows(seconds=[0, 0.25]))
    plan("slow", td.Rows(seconds=[0, 0.25], tolerance_s=0.06))  # within a wider tolerance
    with pytest.raises(PlanError, match=r"'nofps'.*'action'.*fps"):
        plan("nofps", td.Rows(seconds=[0, 0.1]))
    with pytest.raises(PlanError, match="exactly one"):
        td.Rows([0, 1], seconds=[0, 0.1])


def test_a_second_fps_is_refused(tmp_path):
    from treadle.errors import SchemaMismatch

    branch = td.Client(str(tmp_path)).project("robotics").branch()
    t = branch.table("t")
    t.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="a")
    assert t.fps is None
    t.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="b", fps=30)
    assert t.fps == 30
    t.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="c")  # keeps 30
    with pytest.raises(SchemaMismatch, match=r"'t'.*fps 30.*fps 10"):
        t.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="d", fps=10)
    assert t.fps == 30 and t.num_episodes == 3


def test_a_video_rate_sets_the_fps(tmp_path):
    from treadle.errors import SchemaMismatch

    branch = td.Client(str(tmp_path)).project("robotics").branch()
    t = branch.table("v")
    frames = np.zeros((4, 16, 16, 3), np.uint8)
    t.append_episode({"cam": td.VideoFrames(frames, fps=15)}, episode="a")
    assert t.fps == 15
    with pytest.raises(SchemaMismatch, match="fps"):
        t.append_episode({"cam": td.VideoFrames(frames, fps=30)}, episode="b")


# -- properties (pure: fake tables, no I/O) ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    fixed=st.lists(st.integers(-4, 4), min_size=1, max_size=4, unique=True),
    padded=st.lists(st.integers(-6, 6), min_size=1, max_size=4, unique=True),
    step=st.integers(0, 50),
)
def test_eligible_anchors_are_those_the_unpadded_spec_fits(lengths, fixed, padded, step):
    from plan_helpers import FakeTable
    from treadle.read.rows import padded_rows

    table = FakeTable("t", lengths, columns=("a", "b"))
    windows = td.Windows({"a": td.Rows(fixed), "b": td.Rows(padded, pad=True)})
    starts = np.cumsum((0, *lengths))[:-1]
    lo, hi = min(min(fixed), 0), max(max(fixed), 0)
    fits = {
        int(s + f) for s, n in zip(starts, lengths) for f in range(n) if 0 <= f + lo and f + hi < n
    }
    if not fits:
        with pytest.raises(PlanError, match="no eligible moments"):
            td.Recipe(1, 2, [td.Component(table, windows)]).plan()
        return
    plan = td.Recipe(1, 2, [td.Component(table, windows)]).plan()
    assert plan.eligible(0) == len(fits)
    assert set(plan.moments(0, np.arange(len(fits))).tolist()) == fits
    m = plan.batch(step).moment
    rows, pad = padded_rows(table, m, np.asarray(padded))
    e = np.searchsorted(starts, m, side="right") - 1
    clamped, want_pad = _clamped(e, m - starts[e], padded, lengths)
    np.testing.assert_array_equal(rows, starts[e][:, None] + clamped)
    np.testing.assert_array_equal(pad, want_pad)

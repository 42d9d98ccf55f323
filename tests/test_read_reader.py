"""The reader (:mod:`treadle.read.sample_reader`) and its stages: it reads exactly the samples it is
handed, one take per component and set of rows, and reads ahead only what it was handed."""

from __future__ import annotations

import threading

import numpy as np

import treadle as td
from treadle.read.columns import output_columns
from treadle.read.sample_reader import SampleReader


def reader_of(plan) -> SampleReader:
    """A CPU reader of every component of ``plan``."""
    tables = [plan.table(c) for c in range(plan.num_components)]
    return SampleReader(tables, output_columns(plan))


def spy_takes(plan, monkeypatch, columns: list | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """Record every row take the reader runs (its take stage, whichever path reads the
    rows: Lance take, mapped pages or a resident column): (table, rows), from any thread;
    the columns of each take go to ``columns`` when given."""
    import treadle.read.sample_reader as reader_module

    seen: list[tuple[str, tuple[int, ...]]] = []
    lock = threading.Lock()
    orig = reader_module.run_take

    def spy(take):
        with lock:
            seen.append((take.table.name, tuple(int(r) for r in np.unique(take.moments))))
            if columns is not None:
                columns.append([cs.column for cs in take.group])
        return orig(take)

    monkeypatch.setattr(reader_module, "run_take", spy)
    return seen


def step_takes(plan, steps, rank=0, world=1) -> list[tuple[str, tuple[int, ...]]]:
    """The takes of plain columns that reading exactly ``steps`` makes: one per component."""
    out = []
    for s in steps:
        b = plan.batch(s, rank, world)
        for c in np.unique(b.component):
            rows = np.unique(b.moment[b.component == c])
            out.append((plan.table(int(c)).name, tuple(int(r) for r in rows)))
    return out


def rows_plan(tmp_path, batch_size=8):
    rng = np.random.default_rng(4)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for name in ("a", "b"):
        branch.table(name).append(
            {"x": rng.random((200, 3), dtype=np.float32), "y": rng.integers(0, 9, 200)}
        )
    return td.Recipe(
        seed=1,
        batch_size=batch_size,
        components=[td.Component(branch.table(n), None, weight=w) for n, w in (("a", 1), ("b", 2))],
    ).plan()


def test_row_columns_share_one_take_and_keep_their_rows(tmp_path, monkeypatch):
    """Columns with the same offsets come from one take; every window holds its own rows."""
    rng = np.random.default_rng(3)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    data = {}
    for name in ("a", "b"):
        for e, n in enumerate((9, 14)):
            cols = {
                "action": rng.random((n, 7), dtype=np.float32),
                "state": rng.integers(0, 1000, (n, 2, 3)).astype(np.int32),
                "reward": rng.random(n),
            }
            branch.table(name).append_episode(cols, episode=f"{name}{e}")
            data[(name, e)] = cols
    windows = td.Windows(
        {"action": td.Rows(range(3)), "state": td.Rows(range(3)), "reward": td.Rows([2, 0])}
    )
    recipe = td.Recipe(
        seed=5,
        batch_size=8,
        components=[
            td.Component(branch.table("a"), windows, weight=0.25),
            td.Component(branch.table("b"), windows, weight=0.75),
        ],
    )
    plan = recipe.plan()
    reader = reader_of(plan)
    takes: list[list[str]] = []
    spy_takes(plan, monkeypatch, takes)
    names = ("a", "b")
    for batch, out in reader.read_many(plan.batch(step) for step in range(6)):
        assert list(out["_moment"]) == list(batch.moment)
        for i, (c, m) in enumerate(zip(out["_component"], out["_moment"])):
            eps = plan.table(int(c)).episodes()
            e = int(np.searchsorted(eps.starts, m, side="right") - 1)
            f = int(m - eps.starts[e])
            cols = data[(names[int(c)], e)]
            np.testing.assert_array_equal(out["action"][i], cols["action"][f : f + 3])
            np.testing.assert_array_equal(out["state"][i], cols["state"][f : f + 3])
            np.testing.assert_array_equal(out["reward"][i], cols["reward"][[f + 2, f]])
    reader.close()
    # one take per component and set of rows (same offsets), never one per column
    assert {tuple(sorted(c)) for c in takes} == {("action", "state"), ("reward",)}


def test_read_ahead_gives_the_same_batches_in_any_order(tmp_path):
    """The reader reads the batches after the current one ahead: any order of the samples
    handed to it gives the batches of the plan."""
    rng = np.random.default_rng(4)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for name in ("a", "b"):
        branch.table(name).append(
            {"x": rng.random((50, 3), dtype=np.float32), "y": rng.integers(0, 9, 50)}
        )
    recipe = td.Recipe(
        seed=1,
        batch_size=8,
        components=[td.Component(branch.table(n), None, weight=w) for n, w in (("a", 1), ("b", 2))],
    )
    plan = recipe.plan()

    def fresh(step: int, rank: int = 0, world: int = 1) -> dict:
        r = reader_of(plan)
        try:
            b = plan.batch(step, rank, world)
            return r.read(b.component, b.moment)
        finally:
            r.close()

    reader = reader_of(plan)
    orders = [(0, 1, 2, 3), (0, 2, 4, 6, 8), (5, 3, 4, 10, 11, 12, 2), (7, 7, 8)]
    for steps in orders:
        got_steps = []
        for batch, got in reader.read_many(plan.batch(s) for s in steps):
            got_steps.append(batch.step)
            want = fresh(batch.step)
            assert got.keys() == want.keys()
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
        assert got_steps == list(steps)
    # another rank and world size after the read-ahead of rank 0
    for batch, got in reader.read_many(plan.batch(s, 1, 2) for s in (0, 1, 2)):
        want = fresh(batch.step, 1, 2)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    reader.close()


def test_reader_reads_exactly_the_steps_it_is_handed(tmp_path, monkeypatch):
    """Handed a non-contiguous sequence of steps, the reader takes each of them once, never a
    step it was not handed, and never more than one batch ahead of the one it delivers."""
    plan = rows_plan(tmp_path)
    seen = spy_takes(plan, monkeypatch)
    steps = [5, 3, 9, 4, 20, 21, 7]
    reader = reader_of(plan)
    try:
        for i, (batch, _) in enumerate(reader.read_many(plan.batch(s) for s in steps)):
            assert batch.step == steps[i]
            assert set(seen) <= set(step_takes(plan, steps[: i + 2]))
    finally:
        reader.close()
    assert sorted(seen) == sorted(step_takes(plan, steps))


def test_resumed_loaders_read_each_step_once_and_no_other(tmp_path, monkeypatch):
    """A loader resumed at step k reads steps k .. stop-1 once each: nothing before k (already
    delivered), nothing at or after ``steps`` (never delivered), whatever it prefetches."""
    plan = rows_plan(tmp_path)
    seen = spy_takes(plan, monkeypatch)
    loader = td.TrainLoader(plan, steps=9, prefetch=3)
    loader.load_state_dict({"record": plan.record.to_dict(), "step": 4})
    got = [int(b["_moment"][0]) for b in loader]
    assert len(got) == 5 and loader.step == 9
    assert sorted(seen) == sorted(step_takes(plan, range(4, 9)))
    # a rank of two reads its own half of the same steps, once each
    seen.clear()
    loader = td.TrainLoader(plan, steps=6, rank=1, world_size=2)
    loader.load_state_dict({"record": plan.record.to_dict(), "step": 2})
    assert len(list(loader)) == 4
    assert sorted(seen) == sorted(step_takes(plan, range(2, 6), 1, 2))


def test_fixed_width_row_columns_need_no_lance_take_per_batch(tmp_path, monkeypatch):
    """Numbers and tensors come from :mod:`treadle.read.fixed` (a mapped or resident column),
    not one Lance take per batch, with the values a take gives."""
    from treadle.table.tensors import to_numpy

    plan = rows_plan(tmp_path)
    lance_takes = []
    for c in range(plan.num_components):
        t = plan.table(c)
        orig = t.take
        monkeypatch.setattr(
            t, "take", lambda rows, cols=None, o=orig: lance_takes.append(1) or o(rows, cols)
        )
    reader = reader_of(plan)
    try:
        for _batch, out in reader.read_many(plan.batch(s) for s in range(12)):
            for i, (c, m) in enumerate(zip(out["_component"], out["_moment"])):
                got = plan.table(int(c)).dataset.take([int(m)], columns=["x", "y"])
                for k in ("x", "y"):
                    want = to_numpy(got.column(k), got.schema.field(k))[0]
                    np.testing.assert_array_equal(out[k][i], want)
                    assert out[k].dtype == want.dtype
    finally:
        reader.close()
    assert lance_takes == []


def test_takes_from_memory_run_on_the_reading_thread(tmp_path, monkeypatch):
    """Takes served from mapped or resident columns are not handed to the take pool (a
    thread handoff costs more than the gather), and the pinned schema's fixed-width check
    and the episode starts of ``_episode``/``_frame`` are looked up once per table, not per
    batch; a Lance take still goes to the pool."""
    import treadle.read.sample_reader as reader_module
    import treadle.read.takes as takes_module

    plan = rows_plan(tmp_path)
    threads: list[str] = []
    orig = reader_module.run_take
    checks = []
    orig_fixed = takes_module._fixed
    monkeypatch.setattr(takes_module, "_fixed", lambda t, cs: checks.append(1) or orig_fixed(t, cs))

    def spy(take):
        threads.append(threading.current_thread().name)
        return orig(take)

    monkeypatch.setattr(reader_module, "run_take", spy)
    episodes = []
    for c in range(plan.num_components):
        t = plan.table(c)
        monkeypatch.setattr(t, "episodes", lambda o=t.episodes: episodes.append(1) or o())
    reader = reader_of(plan)
    here = threading.current_thread().name
    try:
        list(reader.read_many(plan.batch(s) for s in range(10)))
        per_reader = len(checks), len(episodes)
        assert threads and set(threads) == {here}
        list(reader.read_many(plan.batch(s) for s in range(10, 20)))
        assert (len(checks), len(episodes)) == per_reader
    finally:
        reader.close()
    threads.clear()
    slow = SampleReader([plan.table(c) for c in range(2)], output_columns(plan),
                        fixed_columns=False)  # fmt: skip
    try:
        list(slow.read_many(plan.batch(s) for s in range(3)))
    finally:
        slow.close()
    assert threads and here not in threads


def test_s3_video_fetch_of_next_batch_overlaps_this_decode(s3_root, monkeypatch):
    """On S3, the window bytes of the next batch are fetched while this batch decodes (the
    video stage runs ahead with the takes), with one ranged read per batch (a range per
    window) and each episode's stream index read once for the whole run."""
    import treadle.video.cpu_reader as video_reader
    from treadle.storage.store import Store
    from treadle.video._testing import synthetic_frames

    url, options = s3_root
    branch = td.Client(url, storage_options=options, create=True).project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(3):
            cam = td.VideoFrames(synthetic_frames(24, 32, 32, seed=e), fps=10)
            tx.table("v").append_episode({"cam": cam}, episode=f"ep-{e}")
    windows = td.Windows({"cam": td.Video(range(4))})
    recipe = td.Recipe(seed=3, batch_size=2, components=[td.Component(branch.table("v"), windows)])
    steps = 4
    fetches: list[int] = []  # ranges per window fetch, in order
    overlapped: list[bool] = []
    decodes = [0]
    lock = threading.Lock()
    orig_get, orig_decode = Store.get_ranges, video_reader.decode_fetched

    def get_ranges(self, requests):
        if any("media/" in r.key for r in requests):
            with lock:
                fetches.append(len(requests))
        return orig_get(self, requests)

    def decode(dec, window, out):
        with lock:
            d, decodes[0] = decodes[0], decodes[0] + 1
        k = d // 2  # this window's batch
        if d % 2 == 0 and k + 1 < steps:  # first window of a batch that has a next one
            for _ in range(300):  # wait (3 s at most) for the next batch's fetch to start
                if len(fetches) >= k + 2:
                    break
                threading.Event().wait(0.01)
            overlapped.append(len(fetches) >= k + 2)
        return orig_decode(dec, window, out)

    monkeypatch.setattr(Store, "get_ranges", get_ranges)
    monkeypatch.setattr(video_reader, "decode_fetched", decode)
    plan = recipe.plan()
    index_takes: list[int] = []
    table = plan.table(0)
    orig_take = table.take
    monkeypatch.setattr(
        table,
        "take",
        lambda rows, cols=None: (
            (cols == ["cam"] and index_takes.append(len(rows))) or orig_take(rows, cols)
        ),
    )
    reader = reader_of(plan)
    try:
        got = list(reader.read_many(plan.batch(s) for s in range(steps)))
    finally:
        reader.close()
    assert [out["cam"].shape for _, out in got] == [(2, 4, 32, 32, 3)] * steps
    assert overlapped == [True] * (steps - 1)
    assert fetches == [2] * steps
    episodes = {int(e) for _, out in got for e in out["_episode"]}
    assert sum(index_takes) == 24 * len(episodes)  # each episode's index rows, read once

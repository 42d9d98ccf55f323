"""Tables that change (issue 47): add_column, annotate, update, rename, drop, delete
episodes, compact. Rows never move, no media object is written, pinned runs read what
they read before, new runs see the change; every bad input is a named error with
nothing written."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

import treadle as td
from loader_helpers import batch_hash, make_project, recipe
from treadle.errors import AlreadyExists, InvalidName, NotFound, SchemaMismatch


def media(branch: td.Branch) -> dict[str, tuple]:
    """The listing of the project's media objects: key, size and last-modified time."""
    store = branch.project.client.store
    listing = store.list_info(f"projects/{branch.project.name}/media")
    return {k: (v.size, v.modified) for k, v in listing.items()}


def check_rows(table: td.Table) -> None:
    """Every episode's moments contiguous and in frame order, as the index says."""
    got = table.to_arrow(["episode", "frame"])
    names = got.column("episode").to_pylist()
    frames = np.asarray(got.column("frame").to_numpy())
    idx = table.episodes()
    assert sum(idx.lengths) == len(names)
    for name, start, n in zip(idx.names, idx.starts, idx.lengths, strict=True):
        assert names[start : start + n] == [name] * n
        assert frames[start : start + n].tolist() == list(range(n))
    assert len(set(idx.names)) == len(idx.names)


def batches(plan: td.Plan, steps: int = 3) -> list[str]:
    return [batch_hash(b) for b in td.TrainLoader(plan, steps=steps)]


def pinned_reads(branch: td.Branch, plan: td.Plan, pinned: td.Table) -> dict:
    """What a pinned run reads: its batches, the rest of them resumed from a state after
    one step, an EvalLoader pass over a pinned table, and the run's statistics."""
    loader = td.TrainLoader(plan, steps=3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    client = branch.project.client
    comp = td.Component(pinned, td.Windows({"action": td.Rows(range(2))}), weight=1.0)
    return {
        "batches": batches(td.Plan.from_record(plan.record, client)),
        "resumed": [batch_hash(b) for b in td.TrainLoader.from_state(state, client, steps=3)],
        "eval": [batch_hash(b) for b in td.EvalLoader(comp, 8)],
        "stats": plan.stats(["action"])["action"].mean.tolist(),
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("evolve") / "store"
    root.mkdir()
    branch = make_project(str(root), episodes=3, frames=12)
    plan = recipe(branch).plan()
    pinned = branch.table("failed").pin()
    return branch, plan, pinned, pinned_reads(branch, plan, pinned), media(branch)


def test_every_change_keeps_rows_media_and_pinned_runs(project):
    branch, plan, pinned, before, stored = project
    t = branch.table("failed")
    n = t.num_moments
    edits = [
        lambda: t.add_column("success", {"failed-0": True, "failed-1": False}, default=True),
        lambda: t.add_column("progress", np.linspace(0, 1, n, dtype=np.float32)),
        lambda: t.annotate("subtask", {"failed-0": [(0.0, 0.1, "reach"), (0.1, 0.4, "grasp")]}),
        lambda: t.update({"success": False}, where="episode = 'failed-2'"),
        lambda: t.rename_columns({"progress": "phase"}),
        lambda: t.drop_columns(["phase"]),
        lambda: t.delete_episodes(["failed-1"]),
        lambda: t.compact(),
    ]
    for edit in edits:
        edit()
        check_rows(t.pin())
        assert media(branch) == stored
    assert pinned_reads(branch, plan, pinned) == before
    got = t.to_arrow(["episode", "success", "subtask"]).to_pydict()
    assert got["episode"] == ["failed-0"] * 12 + ["failed-2"] * 12
    assert got["success"] == [True] * 12 + [False] * 12
    assert got["subtask"] == ["reach"] * 3 + ["grasp"] * 9 + [None] * 12
    assert "phase" not in t.schema.names and "progress" not in t.schema.names


def test_new_plan_selects_on_new_column(project):
    branch, *_ = project
    t = branch.table("nominal")
    t.add_column("ok", {"nominal-0": False}, default=True)
    w = td.Windows({"action": td.Rows(range(2))})
    comp = td.Component(t, w, weight=1.0, where="ok = false")
    plan = td.Recipe(seed=1, batch_size=4, components=[comp]).plan()
    eps = {int(e) for s in range(4) for e in plan.batch(s).moment // 12}
    assert eps == {0}
    check_rows(t.pin())


def new_files(before: td.Table, after: td.Table) -> list:
    """The Lance data files ``after`` lists that ``before`` does not."""
    old = {f.path for fr in before.dataset.get_fragments() for f in fr.metadata.files}
    return [f for fr in after.dataset.get_fragments() for f in fr.metadata.files
            if f.path not in old]  # fmt: skip


def test_changes_write_only_their_column(tmp_path):
    """update, add_column and annotate write data files of their column only."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in range(3):
        t.append_episode({"x": np.arange(5.0) + e, "task": ["a"] * 5}, episode=f"e{e}")
    before = t.pin()
    t.update({"task": "b"}, where="episode = 'e1' AND frame >= 2")
    after = t.pin()
    task_id = after.dataset.lance_schema.field("task").id()
    new = new_files(before, after)
    assert new and all(list(f.fields) == [task_id] for f in new)
    assert after.to_arrow(["task"]).column(0).to_pylist() == ["a"] * 7 + ["b"] * 3 + ["a"] * 5
    assert after.to_arrow(["x"]) == before.to_arrow(["x"])
    check_rows(after)
    for change, col in (
        (lambda: t.add_column("ok", {"e0": True}, default=False), "ok"),
        (lambda: t.annotate("phase", {"e2": [(1, 3, "reach")]}, frames=True), "phase"),
    ):
        before = t.pin()
        change()
        col_id = t.pin().dataset.lance_schema.field(col).id()
        assert {tuple(f.fields) for f in new_files(before, t.pin())} == {(col_id,)}
    after = t.pin()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert t.update({"task": "c"}, where="episode = 'nope'") is None
    assert any("matches no row" in str(w.message) for w in caught)
    assert t.pin().version == after.version
    t.update({"task": None}, where="frame = 0")
    assert t.to_arrow(["task"]).column(0).to_pylist()[::5] == [None, None, None]


def test_stats_recomputed_after_change(tmp_path):
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(4, dtype=np.float32)}, episode="a")
    t.add_column("y", np.arange(4, dtype=np.float32))

    def plan():
        comp = td.Component(t, td.Windows({"y": td.Rows(range(1))}), weight=1.0)
        return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()

    pinned = plan()
    assert float(t.stats(["y"])["y"].mean) == 1.5
    assert float(pinned.stats(["y"])["y"].mean) == 1.5
    t.update({"y": 5.0}, where="frame < 2")
    assert float(t.stats(["y"])["y"].mean) == 3.75
    assert float(plan().stats(["y"])["y"].mean) == 3.75  # a new run: no statistics of v1
    assert float(pinned.stats(["y"])["y"].mean) == 1.5


def test_stats_of_a_column_with_nulls_are_of_its_values(tmp_path):
    """An added column is null on episodes appended after it: table.stats raised that a
    batch cannot hold nulls; it is the statistics of the values there are."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(3.0)}, episode="a")
    t.add_column("score", np.array([1.0, 2.0, 6.0]))
    t.add_column("v", np.arange(6, dtype=np.float32).reshape(3, 2))
    t.append_episode({"x": np.arange(2.0)}, episode="b")
    s = t.stats(["score", "v", "x"])
    assert (int(s["score"].count), float(s["score"].mean), float(s["score"].max)) == (3, 3.0, 6.0)
    assert s["v"].mean.tolist() == [2.0, 3.0] and int(s["x"].count.max()) == 5
    t.update({"score": None})
    with pytest.raises(td.PlanError, match="no rows to compute statistics of column 'score'"):
        t.stats(["score"])


def test_later_appends_get_default_or_null_and_names_come_back(tmp_path):
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(3.0)}, episode="a")
    t.add_column("label", {"a": "good"}, default="unknown")
    t.add_column("score", np.ones(3))
    t.append_episode({"x": np.arange(2.0)}, episode="b")
    got = t.to_arrow(["label", "score"]).to_pydict()
    assert got == {"label": ["good"] * 3 + ["unknown"] * 2, "score": [1.0] * 3 + [None] * 2}
    t.delete_episodes(["a"])
    t.append_episode({"x": np.arange(4.0), "label": ["new"] * 4, "score": np.zeros(4)}, episode="a")
    assert t.pin().episodes().names == ["b", "a"]
    check_rows(t.pin())


def test_nulls_a_window_reads_are_a_plan_error_not_an_error_at_step_n(tmp_path):
    """A label added without default= is null on episodes appended after it: training
    over it used to fail at whatever step first drew such a moment (step 19 here), with
    an error that named no episode; the plan now refuses it, naming the episode."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    with t.branch.transaction("episodes") as tx:
        for e in range(50):
            x = np.full((10, 2), e, np.float32)
            tx.table("t").append_episode({"x": x}, episode=f"e{e}", fps=10)
    t.add_column("score", {f"e{e}": float(e) for e in range(50)})
    t.add_column("vec", np.ones((500, 3), np.float32))
    t.append_episode({"x": np.full((10, 2), 99, np.float32)}, episode="late", fps=10)

    def plan(windows, **kw):
        comp = td.Component(t, td.Windows(windows), **kw)
        return td.Recipe(seed=0, batch_size=4, components=[comp]).plan()

    for col in ("score", "vec"):
        with pytest.raises(
            td.PlanError, match=f"'{col}' of table 't' is null at episode 'late', frame 0"
        ):
            plan({col: td.Rows([0]), "x": td.Rows([0])})
    whole_row = td.Component(t, where="episode = 'late'")  # no windows: the anchor's row
    with pytest.raises(
        td.PlanError, match="'score' of table 't' is null at episode 'late', frame 0"
    ):
        td.Recipe(seed=0, batch_size=4, components=[whole_row]).plan()
    # a padded window before a labelled episode's end, or one that reaches the late
    # episode's frame 0 only from inside it
    t.update({"score": None}, where="episode = 'e3' AND frame = 9")
    with pytest.raises(td.PlanError, match="episode 'e3', frame 9"):
        plan({"score": td.Rows([0, 3], pad=True)}, episodes=["e3"], where="frame = 8")
    # the rows no window reads may be null: the plan is made and every batch reads
    assert plan({"score": td.Rows([0])}, episodes=["e3"], where="frame < 9").eligible(0) == 9
    ok = plan({"score": td.Rows([-1, 0])}, where="score IS NOT NULL AND frame < 9")
    for b in td.TrainLoader(ok, steps=30):
        assert not torch.isnan(b["score"]).any()
    assert plan({"x": td.Rows([0])}).eligible(0) == 510  # no number column with nulls


def test_only_columns_that_may_hold_nulls_are_read_when_planned(tmp_path, monkeypatch):
    """The plan looks for nulls only in columns that may hold one: added without a value
    for later episodes, or recorded by a write whose rows held one (Arrow's null counts).
    It read every number column whole on every plan (8 bytes a row, on every rank)."""
    from treadle.plan import null_rows

    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in range(3):
        t.append_episode({"x": np.arange(4.0), "y": np.arange(4.0)}, episode=f"e{e}", fps=10)
    read = []
    real = null_rows.null_runs
    monkeypatch.setattr(null_rows, "null_runs", lambda tb, c: read.append(c) or real(tb, c))
    comp = td.Component(t, td.Windows({"x": td.Rows([0]), "y": td.Rows([0])}))
    assert td.Recipe(seed=0, batch_size=2, components=[comp]).plan().eligible(0) == 12
    assert read == []  # no write held a null: nothing read
    # a write whose rows hold a null records it; the plan then finds it, naming it
    t.append_episode({"x": np.arange(4.0), "y": [0.0, None, 2.0, 3.0]}, episode="late", fps=10)
    comp = td.Component(t, td.Windows({"x": td.Rows([0]), "y": td.Rows([0])}))
    with pytest.raises(td.PlanError, match="'y' of table 't' is null at episode 'late', frame 1"):
        td.Recipe(seed=0, batch_size=2, components=[comp]).plan()
    assert read == ["y"]
    # update() may not put a null where no plan looks for one ...
    with pytest.raises(td.SchemaMismatch, match="column 'x' holds no null values"):
        t.update({"x": None}, where="episode = 'e0'")
    # ... and may where one does: the recorded column
    t.update({"y": None}, where="episode = 'e0' AND frame = 2")
    comp = td.Component(t, td.Windows({"y": td.Rows([0])}), where="episode != 'late'")
    with pytest.raises(td.PlanError, match="episode 'e0', frame 2"):
        td.Recipe(seed=0, batch_size=2, components=[comp]).plan()


def test_an_append_after_a_drop_leaves_an_added_column_null_without_a_conflict(tmp_path):
    """An added column is null on episodes appended after it; recording that as a null
    written changed the schema's metadata, which a table with a dropped column refused
    (CommitConflict: compact() first). Added columns are looked for nulls anyway."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(4.0), "y": np.arange(4.0)}, episode="a", fps=10)
    t.add_column("label", {"a": 1.0})
    t.drop_columns(["y"])
    t.append_episode({"x": np.arange(4.0)}, episode="b", fps=10)
    assert t.to_arrow(columns=["label"])["label"].null_count == 4
    comp = td.Component(t, td.Windows({"label": td.Rows([0])}))
    with pytest.raises(td.PlanError, match="'label' of table 't' is null at episode 'b'"):
        td.Recipe(seed=0, batch_size=2, components=[comp]).plan()


def test_a_store_made_again_at_its_path_is_looked_at_again_for_nulls(tmp_path):
    """Null rows found once were kept per process by (table URI, version, column): a store
    removed and written again at its path, to the same version, was judged by the first
    one's nulls (here a null that is no longer there refused the plan)."""
    import shutil

    def plan(t):
        comp = td.Component(t, td.Windows({"label": td.Rows([0])}))
        return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()

    (tmp_path / "s").mkdir()
    t = td.Client(str(tmp_path / "s")).project("p").branch().table("t")
    t.append_episode({"x": np.arange(4.0)}, episode="e0", fps=10)
    t.add_column("label", {"e0": 1.0})
    t.append_episode({"x": np.arange(4.0)}, episode="late", fps=10)  # label: null
    with pytest.raises(td.PlanError, match="'label' of table 't' is null at episode 'late'"):
        plan(t)
    shutil.rmtree(tmp_path / "s")
    (tmp_path / "s").mkdir()
    t = td.Client(str(tmp_path / "s")).project("p").branch().table("t")
    t.append_episode({"x": np.arange(4.0)}, episode="e0", fps=10)
    t.append_episode({"x": np.arange(4.0)}, episode="late", fps=10)
    t.add_column("label", {"e0": 1.0, "late": 2.0})  # the same version number, no null
    assert plan(t).eligible(0) == 8


def test_a_scan_over_nulls_is_refused_before_its_first_batch(tmp_path):
    """ScanDataset over a column added without default= (then episodes appended) or set
    null by update() read batches until the first null row, then failed mid-epoch with an
    error naming neither episode nor row; it is refused when made, naming them, and a
    filter that leaves the nulls out scans. Strings arrive as None. (EvalLoader plans its
    component, so it was refused already.)"""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in range(3):
        t.append_episode({"x": np.arange(4.0)}, episode=f"e{e}", fps=10)
    t.add_column("score", {f"e{e}": float(e) for e in range(3)})
    t.add_column("vec", np.ones((12, 2), np.float32))
    t.add_column("label", {f"e{e}": "a" for e in range(3)})
    t.append_episode({"x": np.arange(4.0)}, episode="late", fps=10)
    for col in ("score", "vec"):
        with pytest.raises(
            td.PlanError, match=f"'{col}' of table 't' is null at episode 'late', frame 0 .row 12"
        ):
            td.ScanDataset(t.pin().scan_request(["x", col]), batch_size=4)
    with pytest.raises(td.PlanError, match="'score' of table 't' is null at episode 'late'"):
        td.EvalLoader(td.Component(t, td.Windows({"score": td.Rows([0])})), 4)
    ok = td.ScanDataset(t.pin().scan_request(["score"], filter="score IS NOT NULL"), 4)
    assert torch.cat([b["score"] for b in ok]).tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    labels = [v for b in td.ScanDataset(t.pin().scan_request(["label"]), 4) for v in b["label"]]
    assert labels == ["a"] * 12 + [None] * 4
    t.update({"score": 7.0}, where="score IS NULL")
    t.update({"score": None}, where="episode = 'e1' AND frame = 2")
    with pytest.raises(td.PlanError, match="'score' .* null at episode 'e1', frame 2 .row 6"):
        td.ScanDataset(t.pin().scan_request(["score"]), batch_size=4, shuffle=True)
    scan = td.ScanDataset(t.pin().scan_request(["score"], filter="episode != 'e1'"), 4)
    assert (
        sorted(torch.cat([b["score"] for b in scan]).tolist()) == [0.0] * 4 + [2.0] * 4 + [7.0] * 4
    )


def test_delete_counts_each_episode_once_and_nothing_is_no_commit(tmp_path):
    """A name given twice was one episode deleted and a commit saying 'delete 2
    episodes'; an empty list made an empty commit."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in "abc":
        t.append_episode({"x": np.arange(3.0)}, episode=e)
    t.delete_episodes(["a", "a"])
    assert t.branch.head().summary == "t: delete 1 episode"
    head = t.branch.commit_id
    with pytest.warns(UserWarning, match="no episodes to delete"):
        assert t.delete_episodes([]) is None
    assert t.branch.commit_id == head


def test_update_of_an_image_column_takes_only_images_td_video_reads(tmp_path):
    """update() stored a null, junk bytes, a 16-bit PNG among 8-bit ones or an image of
    another size in a camera column: each stopped training at the step that drew it."""
    import io

    from PIL import Image

    def png(a):
        out = io.BytesIO()
        Image.fromarray(a).save(out, "PNG")
        return out.getvalue()

    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"cam": [png(np.full((8, 8, 3), i, np.uint8)) for i in range(4)]},
                     episode="a", fps=10)  # fmt: skip
    head = t.branch.commit_id
    bad = [None, b"junk", png(np.zeros((8, 8), np.uint16)), png(np.zeros((16, 8, 3), np.uint8))]
    for value in bad:
        with pytest.raises((SchemaMismatch, td.CorruptData), match="column 'cam'"):
            t.update({"cam": value}, where="frame = 2")
    assert t.branch.commit_id == head
    t.update({"cam": png(np.full((8, 8, 3), 200, np.uint8))}, where="frame = 2")
    comp = td.Component(t, td.Windows({"cam": td.Video([0])}))
    got = next(iter(td.EvalLoader(comp, 4)))["cam"]
    assert got[:, 0, 0, 0, 0].tolist() == [0, 1, 200, 3]


def test_a_pinned_version_says_where_changes_go(tmp_path):
    """t.pin().update(...) (a pinned run's table) was a bare AttributeError."""
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(3.0)}, episode="a")
    pinned = t.pin()
    for name in ("update", "add_column", "delete_episodes", "append_episode"):
        with pytest.raises(AttributeError, match=rf"never changes.*branch.table\('t'\).{name}"):
            getattr(pinned, name)
    with pytest.raises(AttributeError, match="'Table' object has no attribute 'nope'"):
        pinned.nope  # noqa: B018
    assert not hasattr(pinned, "update") and hasattr(pinned, "to_arrow")


def test_spans_are_exact_and_frames_work(tmp_path):
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(10.0)}, episode="a", fps=10)
    # 0.3 s * 10 fps is exactly frame 3 (as a float, 0.3 * 10 = 3.0000000000000004)
    t.annotate("s", {"a": [(0.0, 0.3, "p"), (0.3, 1.0, "q")]})
    assert t.to_arrow(["s"]).column(0).to_pylist() == ["p"] * 3 + ["q"] * 7
    t.annotate("f", {"a": [(2, 4, 7)]}, frames=True)
    assert t.to_arrow(["f"]).column(0).to_pylist() == [None] * 2 + [7] * 2 + [None] * 6


BAD = [
    (NotFound, lambda t: t.add_column("c", {"zz": 1}, default=0)),
    (SchemaMismatch, lambda t: t.add_column("c", np.zeros(3))),
    (SchemaMismatch, lambda t: t.add_column("c", {"a": 1})),
    (InvalidName, lambda t: t.add_column("_c", np.zeros(15))),
    (SchemaMismatch, lambda t: t.add_column("c_is_pad", np.zeros(15))),
    (AlreadyExists, lambda t: t.add_column("x", np.zeros(15))),
    (SchemaMismatch, lambda t: t.add_column("c")),
    (SchemaMismatch, lambda t: t.add_column("c", np.zeros(15), fn=len, columns=["x"])),
    (SchemaMismatch, lambda t: t.annotate("c", {"a": [(0, 0.5, 1), (0.4, 0.6, 2)]})),
    (SchemaMismatch, lambda t: t.annotate("c", {"a": [(0, 0.6, 1)]})),
    (SchemaMismatch, lambda t: t.annotate("c", {"a": [(-0.1, 0.2, 1)]})),
    (NotFound, lambda t: t.annotate("c", {"zz": [(0, 0.1, 1)]})),
    (NotFound, lambda t: t.update({"nope": 1})),
    (SchemaMismatch, lambda t: t.update({"frame": 1})),
    (NotFound, lambda t: t.delete_episodes(["zz"])),
    (SchemaMismatch, lambda t: t.update({"x": "text"})),
    (SchemaMismatch, lambda t: t.update({"v": None}, where="frame = 0")),  # a tensor: no nulls
    (NotFound, lambda t: t.drop_columns(["nope"])),
    (SchemaMismatch, lambda t: t.drop_columns(["episode"])),
    (InvalidName, lambda t: t.rename_columns({"x": "_x"})),
    (SchemaMismatch, lambda t: t.rename_columns({"x": "x_dim_mask"})),
    (AlreadyExists, lambda t: t.rename_columns({"x": "y"})),
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    t = td.Client(str(root)).project("p").branch().table("t")
    for e in "abc":
        t.append_episode(
            {"x": np.arange(5.0), "y": np.zeros(5), "v": np.zeros((5, 2))}, episode=e, fps=10
        )
    nofps = td.Client(str(root)).project("p").branch().table("nofps")
    nofps.append_episode({"x": np.arange(5.0)}, episode="a")
    return t, nofps


@pytest.mark.parametrize("error,edit", BAD)
def test_bad_input_is_a_named_error_with_nothing_written(small, error, edit):
    t, _ = small
    head = t.branch.commit_id
    with pytest.raises(error):
        edit(t)
    assert t.branch.commit_id == head


def test_seconds_on_a_table_without_fps(small):
    _, t = small
    head = t.branch.commit_id
    with pytest.raises(SchemaMismatch, match="frames=True"):
        t.annotate("c", {"a": [(0.0, 0.1, 1)]})
    assert t.branch.commit_id == head


def test_several_changes_in_one_transaction(tmp_path):
    branch = td.Client(str(tmp_path)).project("p").branch()
    for name in ("t", "u"):
        branch.table(name).append_episode({"x": np.arange(3.0)}, episode="a")
    head = branch.commit_id
    with branch.transaction("label both") as tx:
        tx.table("t").add_column("ok", {"a": True})
        tx.table("t").update({"ok": False}, where="frame = 1")
        tx.table("u").rename_columns({"x": "state"})
    assert branch.head().parents == (head,)
    assert branch.table("t").to_arrow(["ok"]).column(0).to_pylist() == [True, False, True]
    assert branch.table("u").schema.names == ["episode", "frame", "state"]
    with pytest.raises(td.TreadleError, match="separately"):
        with branch.transaction("mixed") as tx:
            tx.table("t").append_episode({"x": np.arange(2.0), "ok": [True] * 2}, episode="b")
            tx.table("t").add_column("z", np.zeros(5))
    assert branch.table("t").num_moments == 3


def test_on_object_stores(any_root):
    """Every change on local disk, S3 and Azurite: rows in place and the media listing
    (keys, sizes, times) unchanged after each; a pinned run reads the batches it read
    before; a new run selects on the new columns."""
    root, options = any_root
    branch = make_project(root, episodes=2, frames=8, storage_options=options)
    plan = recipe(branch, batch_size=4).plan()
    before, stored = batches(plan, 2), media(branch)
    t = branch.table("failed")
    edits = [
        lambda: t.add_column("success", {"failed-0": True}, default=False),
        lambda: t.add_column("progress", np.arange(16, dtype=np.float32)),
        lambda: t.add_column(
            "double", fn=lambda b: b["action"][:, 0] * 2, columns=["action"], progress=False
        ),  # fmt: skip
        lambda: t.annotate("phase", {"failed-1": [(0.0, 0.1, "reach")]}),  # fps 30: frames 0-2
        lambda: t.update({"success": True}, where="episode = 'failed-1' AND frame < 2"),
        lambda: t.delete_episodes(["failed-0"]),
        lambda: t.rename_columns({"action": "act"}),
        lambda: t.drop_columns(["act", "double"]),
        lambda: t.compact(),
    ]
    for edit in edits:
        values = t.to_arrow()
        edit()
        check_rows(t.pin())
        assert media(branch) == stored
    assert t.to_arrow() == values  # compact: the same rows, order and values, one file each
    assert all(len(f.metadata.files) == 1 for f in t.pin().dataset.get_fragments())
    assert t.schema.names == ["episode", "frame", "cam", "success", "progress", "phase"]
    assert batches(td.Plan.from_record(plan.record, branch.project.client), 2) == before
    got = t.to_arrow(["success", "progress", "phase"]).to_pydict()
    assert got == {"success": [True] * 2 + [False] * 6, "progress": list(range(8, 16)),
                   "phase": ["reach"] * 3 + [None] * 5}  # fmt: skip
    assert pa.types.is_boolean(t.schema.field("success").type)
    w = td.Windows({"cam": td.Video(range(1)), "progress": td.Rows(range(1))})
    comp = td.Component(t, w, weight=1.0, where="success = true AND phase = 'reach'")
    new = next(iter(td.TrainLoader(td.Recipe(seed=0, batch_size=2, components=[comp]).plan(),
                                   steps=1)))  # fmt: skip
    assert sorted(new["_frame"].tolist()) == [0, 1]
    assert sorted(new["progress"][:, 0].tolist()) == [8.0, 9.0]


def test_mapped_reads_survive_edits_and_name_compact_after_deletions(tmp_path, monkeypatch):
    from treadle import fastpaths
    from treadle.read.fixed import FixedReader

    monkeypatch.setattr(fastpaths, "_OFF", {})
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    img = np.arange(6 * 16 * 16 * 3, dtype=np.uint8).reshape(6, 16, 16, 3)
    t.append_episode({"img": img}, episode="a")
    t.add_column("ok", np.ones(6, bool))
    t.update({"ok": False}, where="frame = 2")
    assert FixedReader().path(t.pin(), "img") == "mapped"
    pinned = t.pin()
    pinned.dataset.delete("frame = 5")  # a Lance deletion file, from outside treadle
    deleted = pinned.project.table_at("t", pinned.dataset.latest_version)
    assert FixedReader().path(deleted, "img") != "mapped"
    assert "compact()" in fastpaths.reasons()["fixed-width reads"]


def test_branches_append_after_a_drop_keep_their_columns(tmp_path):
    project = td.Client(str(tmp_path)).project("p")
    main = project.branch()
    t = main.table("t")
    t.append_episode({"x": np.arange(3.0), "y": np.ones(3), "z": np.full(3, 2.0)}, episode="a")
    t.drop_columns(["y"])  # field ids are no longer 0..n-1
    side = project.create_branch("side", from_="main")
    t.append_episode({"x": np.arange(2.0), "z": np.full(2, 5.0)}, episode="b")
    s = side.table("t")  # the dataset's latest version is main's: an explicit listing
    s.append_episode({"x": np.arange(4.0), "z": np.full(4, 7.0)}, episode="c")
    assert s.to_arrow(["episode", "z"]).to_pydict() == {
        "episode": ["a"] * 3 + ["c"] * 4,
        "z": [2.0] * 3 + [7.0] * 4,
    }
    assert t.to_arrow(["z"]).column(0).to_pylist() == [2.0] * 3 + [5.0] * 2
    check_rows(s.pin())


def test_computed_column_in_batches_and_on_an_executor(project):
    branch, *_ = project
    t = branch.table("nominal")
    table = t.pin()

    def mean_pixel(batch):
        return batch["cam"].reshape(len(batch["cam"]), -1).mean(axis=1).astype(np.float32)

    t.add_column("brightness", fn=mean_pixel, columns=["cam"], batch_rows=5, progress=False)
    got = t.to_arrow(["brightness"]).column(0).to_numpy()
    first = next(iter(td.TrainLoader(recipe_one(t, table), steps=1)))
    assert got.shape == (table.num_moments,)
    want = first["cam"][:, 0].reshape(len(first["cam"]), -1).float().mean(axis=1).numpy()
    np.testing.assert_allclose(got[first["_moment"].numpy()], want, rtol=1e-5)

    class Inline:  # an executor: the Executor.map contract, run in this process
        def map(self, fn, items, what):
            return [fn(item) for item in items]

    t.add_column("double", fn=lambda b: b["action"][:, 0] * 2, columns=["action"],
                 executor=Inline(), batch_rows=7)  # fmt: skip
    arr = t.to_arrow(["action", "double"])
    np.testing.assert_array_equal(
        np.asarray(arr.column("double").to_pylist()),
        np.asarray(arr.column("action").to_pylist())[:, 0] * 2,
    )
    with pytest.raises(SchemaMismatch, match="values"):
        t.add_column("bad", fn=lambda b: [1, 2], columns=["action"], batch_rows=4)
    check_rows(t.pin())


def recipe_one(t, table):
    w = td.Windows({"cam": td.Video(range(1))})
    return td.Recipe(seed=3, batch_size=6, components=[td.Component(table, w, weight=1.0)]).plan()


def test_gc_keeps_deleted_episodes_media_while_a_tag_reaches_them(tmp_path):
    from datetime import timedelta

    def video(seed):
        frames = np.random.default_rng(seed).integers(0, 255, (4, 16, 16, 3), dtype=np.uint8)
        return td.VideoFrames(frames, fps=10)

    client = td.Client(str(tmp_path))
    for name, tagged in (("tagged", True), ("untagged", False)):
        p = client.project(name)
        t = p.branch().table("t")
        t.append_episode({"cam": video(0)}, episode="a")
        t.append_episode({"cam": video(1)}, episode="b")
        if tagged:
            p.tag("before", p.branch().commit_id)
        stored = media(p.branch())
        t.delete_episodes(["a"])
        p.gc(older_than=timedelta(0), keep_days=0)
        left = media(p.branch())
        if tagged:
            assert left == stored
            assert p.branch().table("t").at(p.tags()["before"]).num_episodes == 2
        else:
            assert len(left) == 1 and set(left) < set(stored)
        assert t.pin().to_arrow(["episode"]).column(0).to_pylist() == ["b"] * 4


def test_viewer_shows_added_columns_with_nulls(tmp_path):
    from treadle.ui.episode import episode_data
    from treadle.ui.readonly import ViewerClient

    client = td.Client(str(tmp_path))
    t = client.project("p").branch().table("t")
    t.append_episode({"x": np.arange(4.0)}, episode="a", fps=10)
    t.add_column("ok", {"a": True})
    t.add_column("emb", np.ones((4, 2), np.float32))
    t.annotate("phase", {"a": [(0.0, 0.2, "reach")]})
    t.append_episode({"x": np.arange(3.0)}, episode="b")  # the added columns are null here
    v = t.pin().version
    viewer = ViewerClient(client)  # what the viewer's GETs read through
    a = episode_data(viewer, "p", "t", v, "a")
    assert a["series"]["ok"] == [[1.0] * 4] and a["tasks"]["phase"] == ["reach"]
    b = episode_data(viewer, "p", "t", v, "b")
    assert b["series"]["ok"] == [[None] * 3]
    assert b["series"]["emb"] == [[None] * 3, [None] * 3]


def test_show_has_an_added_column_on_a_step(tmp_path):
    """`treadle show` (read_step, step_html) of a new run shows an added column's values."""
    from treadle.ui.step import read_step, step_html

    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    t.append_episode({"x": np.arange(4.0)}, episode="a")
    values = np.linspace(0, 1, 4, dtype=np.float32)
    t.add_column("progress", values)
    comp = td.Component(t, td.Windows({"progress": td.Rows(range(1))}), weight=1.0)
    plan = td.Recipe(seed=0, batch_size=2, components=[comp]).plan()
    view = read_step(plan, 0)
    np.testing.assert_array_equal(view.arrays["progress"][:, 0], values[plan.batch(0).moment])
    assert "<b>progress</b>" in step_html(view, inline=True)


def test_bench_case_meets_its_goal_on_a_small_table(tmp_path):
    """bench/case_evolve.py's goal, on 20k moments: adding a per-episode bool and a
    per-moment float32 writes at most 2x each column's bytes plus a constant, and no media."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "case_evolve.py"
    spec = importlib.util.spec_from_file_location("bench_case_evolve", path)
    assert spec is not None and spec.loader is not None
    case = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(case)
    table = case.build(tmp_path, 20_000, 20)
    names = table.pin().episodes().names
    rows = [
        case.measure(tmp_path, table, "success", {n: i % 3 == 0 for i, n in enumerate(names)}),
        case.measure(tmp_path, table, "progress", np.linspace(0, 1, 20_000, dtype=np.float32)),
    ]
    for r in rows:
        assert 0 < r["bytes_written"] <= 2 * r["column_bytes"] + (16 << 10), r
        assert r["media_bytes_written"] == 0 and r["media_listing_same"], r
    print(rows)

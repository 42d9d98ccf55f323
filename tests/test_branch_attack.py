"""Branches, merges and refs under attack: what a demanding user does with them."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from test_evolve import check_rows


def refs(p):
    return {b: p.branch(b).commit_id for b in p.branches()}


def labelled(root):
    """main: a; labels adds column ok; main appends b; labels merged into main once."""
    p = td.Client(root).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    labels = p.create_branch("labels", from_="main")
    labels.table("t").add_column("ok", {"a": True}, default=False)
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    p.merge("labels", into="main")
    return p, labels


def got(p, columns):
    t = p.branch().table("t").pin()
    check_rows(t)
    return t.to_arrow(columns).to_pydict()


def test_a_labels_branch_merges_again_after_more_appends(tmp_path):
    """The first merge's commit recorded add_column (what it did to main); the next merge
    counted it as main's own change since the labels' commit and refused: 'main did
    [add_column, append]' (fails before)."""
    p, labels = labelled(str(tmp_path))
    labels.table("t").append_episode({"x": [7.0], "ok": [True]}, episode="e")
    p.branch().table("t").append_episode({"x": [8.0], "ok": [False]}, episode="f")
    p.merge("labels", into="main")
    assert got(p, ["episode", "ok"]) == {
        "episode": ["a"] * 3 + ["b"] * 2 + ["f", "e"],
        "ok": [True] * 3 + [False] * 3 + [True],
    }


def test_a_labels_branch_adds_another_column_and_merges_again(tmp_path):
    p, labels = labelled(str(tmp_path))
    labels.table("t").add_column("q", {"a": 1}, default=0)
    p.branch().table("t").append_episode({"x": [8.0], "ok": [False]}, episode="f")
    p.merge("labels", into="main")
    assert got(p, ["episode", "ok", "q"]) == {
        "episode": ["a"] * 3 + ["b"] * 2 + ["f"],
        "ok": [True] * 3 + [False] * 3,
        "q": [1] * 3 + [0] * 3,
    }
    labels.table("t").update({"q": 5})  # an update beside appends still does not combine
    p.branch().table("t").append_episode({"x": [9.0], "ok": [False], "q": [0]}, episode="g")
    before = refs(p)
    with pytest.raises(td.MergeConflict, match=r"'main' did \['append'\].*'labels' did .*update"):
        p.merge("labels", into="main")
    assert refs(p) == before


def test_a_name_that_is_a_branch_and_a_tag_is_not_read_as_the_branch(tmp_path):
    """A tag named like a branch: diff and merge of that name silently read the branch, so
    merge('labels') merged the moving branch, not the tagged commit (fails before). While
    the two name different commits it is an InvalidName asking for the commit id."""
    p, labels = labelled(str(tmp_path))
    first = p.branch().log()[-1].id
    p.tag("labels", first)
    before = refs(p)
    with pytest.raises(td.InvalidName, match="names both a branch.*and a tag"):
        p.diff("labels", "main")
    with pytest.raises(td.InvalidName, match="give the commit id"):
        p.merge("labels", into="main")
    assert refs(p) == before
    p.tag("release", first)
    fix = p.create_branch("fix", from_="release")  # a tag names where a branch starts
    assert fix.commit_id == first  # (it was 'not a commit id or prefix' before)
    assert p.diff(first, "release").tables == {}


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_gc_that_expires_the_merged_commit_meanwhile_leaves_no_head_unreadable(
    tmp_path, monkeypatch, fast_forward
):
    """A gc expired the merged commit (not a head, not tagged) between the merge's check and
    its move of main: main's head named the deleted table version, every read of main failed
    on a missing manifest (fails before; the fast-forward raised, main left unreadable). The
    lost tables are put back to main's versions and CommitConflict says so."""
    from datetime import timedelta

    import treadle.catalog.merge as merge

    root = str(tmp_path)
    p = td.Client(root).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    side = p.create_branch("side", from_="main")
    c1 = side.table("t").append_episode({"x": np.arange(2.0)}, episode="c")
    side.table("t").append_episode({"x": np.arange(2.0)}, episode="d")
    if not fast_forward:
        p.branch().table("u").append({"y": [1.0]})
    real, ran = merge.expired_error, []

    def racing(place, cid, table):
        out = real(place, cid, table)
        if not ran:  # the gc decides after the check, before the branch moves
            ran.append(td.Client(root).project("p").gc(older_than=timedelta(0), keep_days=0))
        return out

    monkeypatch.setattr(merge, "expired_error", racing)
    with pytest.raises(td.CommitConflict, match=rf"{c1.id[:8]}.*tables \['t'\].*put back"):
        p.merge(c1.id, into="main")
    assert c1.id in ran[0].expired_commits
    fresh = td.Client(root).project("p")
    assert fresh.branch().table("t").to_arrow(["x"]).column(0).to_pylist() == [0.0, 1.0, 2.0]
    assert fresh.branch().head().message.startswith("put back ['t']")


@pytest.mark.parametrize("side_did", ["append", "add_column"])
def test_a_gc_beside_a_merge_keeps_the_merged_version(tmp_path, monkeypatch, side_did):
    """A merge wrote its merged Lance version holding no gc lease: a gc (grace 0) that ran
    before the merge commit landed deleted the version, and main's head named it (fails
    before: every read of main was a missing manifest)."""
    from datetime import timedelta

    root = str(tmp_path)
    p = td.Client(root).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    side = p.create_branch("side", from_="main")
    if side_did == "append":
        side.table("t").append_episode({"x": np.arange(2.0)}, episode="s")
    else:
        side.table("t").add_column("ok", {"a": True}, default=False)
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="m")
    real, ran = p.save_commit, []

    def racing(commit):
        if len(commit.parents) == 2 and not ran:
            ran.append(td.Client(root).project("p").gc(older_than=timedelta(0)))
        return real(commit)

    monkeypatch.setattr(p, "save_commit", racing)
    p.merge("side", into="main")
    assert ran
    t = td.Client(root).project("p").branch().table("t").pin()
    check_rows(t)
    assert list(t.episodes().names) == (["a", "m", "s"] if side_did == "append" else ["a", "m"])


def test_rows_written_apart_at_different_frame_rates_never_meet(tmp_path):
    """Two branches (or two writers on one) appended the first episodes naming an fps, 10
    on one and 30 on the other: the merge (and the later commit) kept one rate for all the
    rows, so seconds became frames at the wrong rate for the others (fails before). The
    merge is a MergeConflict, the commit a SchemaMismatch, both naming the two rates."""
    root = str(tmp_path)
    p = td.Client(root).project("p")
    first = p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a")
    side = p.create_branch("side", from_="main")
    side.table("t").append_episode({"x": np.arange(2.0)}, episode="s", fps=30)
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="m", fps=10)
    before = refs(p)
    with pytest.raises(td.MergeConflict, match="10 fps on this side, 30 fps"):
        p.merge("side", into="main")
    assert refs(p) == before
    other = p.create_branch("other", from_=first.id)
    with pytest.raises(td.SchemaMismatch, match=r"table 't'.*30 and 10 fps"):
        with other.transaction("tx") as tx:
            tx.table("t").append_episode({"x": np.arange(2.0)}, episode="q", fps=30)
            td.Client(root).project("p").branch("other").table("t").append_episode(
                {"x": np.arange(2.0)}, episode="r", fps=10
            )
    t = p.branch("other").table("t").pin()
    assert (t.fps, list(t.episodes().names)) == (10.0, ["a", "r"])


@pytest.mark.parametrize("into", ["main", "labels"])
@pytest.mark.parametrize("drop", [True, False])
def test_renames_and_drops_on_one_side_merge_with_appends_on_the_other(tmp_path, into, drop):
    """A branch that renamed (and dropped, and added) columns, beside one that appended: a
    MergeConflict before (only added columns combined with appends); now the appended rows
    take the new names, lose the dropped columns and take the added ones' defaults, and
    what they recorded (a null) moves with the renamed one (where a column was dropped too,
    the null's record was a CommitConflict: the test appended no null there, before)."""
    import pyarrow as pa

    from treadle.table.null_columns import recorded_nulls

    p = td.Client(str(tmp_path)).project("p")
    act = np.arange(6, dtype=np.float32).reshape(3, 2)
    p.branch().table("t").append_episode(
        {"x": np.arange(3.0), "y": np.ones(3), "act": act}, episode="a", fps=10
    )
    labels = p.create_branch("labels", from_="main")
    labels.table("t").rename_columns({"x": "pos"})
    if drop:
        labels.table("t").drop_columns(["y"])
    labels.table("t").add_column("ok", {"a": True}, default=False)
    labels.table("t").rename_columns({"act": "action"})
    last = None
    rows = {"episode": ["b"] * 2, "frame": [0, 1], "x": [5.0, last], "y": [2.0, 2.0]}
    main_t = p.branch().table("t")
    schema = main_t.pin().schema
    rows["act"] = pa.array([[1.0, 2.0], [3.0, 4.0]], schema.field("act").type)
    main_t.append(pa.table(rows, schema=schema))
    p.merge("labels" if into == "main" else "main", into=into)
    t = p.branch(into).table("t").pin()
    check_rows(t)
    names = ["episode", "frame", "pos", "action", "ok"]
    assert t.schema.names == (names if drop else names[:3] + ["y"] + names[3:])
    got = t.to_arrow(["episode", "pos", "ok"]).to_pydict()
    assert got == {"episode": ["a"] * 3 + ["b"] * 2, "pos": [0.0, 1.0, 2.0, 5.0, last],
                   "ok": [True] * 3 + [False] * 2}  # fmt: skip
    action = t.to_arrow(["action"]).column(0).to_pylist()
    assert np.asarray(action).tolist() == [[0, 1], [2, 3], [4, 5], [1, 2], [3, 4]]
    assert "pos" in recorded_nulls(t.schema) and "x" not in recorded_nulls(t.schema)
    if not drop:
        assert t.to_arrow(["y"]).column(0).to_pylist() == [1.0] * 3 + [2.0] * 2


def test_a_rename_beside_an_update_stays_a_conflict(tmp_path):
    p, labels = labelled(str(tmp_path))
    labels.table("t").rename_columns({"x": "pos"})
    p.branch().table("t").update({"x": 1.0})
    before = refs(p)
    with pytest.raises(td.MergeConflict, match="rename_columns"):
        p.merge("labels", into="main")
    assert refs(p) == before


@pytest.mark.parametrize("then", ["rename", "drop"])
def test_a_rename_or_drop_after_a_drop_keeps_each_columns_values(tmp_path, then):
    """After drop_columns(['y']), a rename or drop of another column gave the table field
    ids 0..n-1 again: 'z' (renamed 'w', or left after dropping 'x') read the dropped y's
    values without a word (a column of another type: every read failed) (fails before)."""
    p = td.Client(str(tmp_path)).project("p")
    t = p.branch().table("t")
    cols = {"x": np.arange(3.0), "y": np.full(3, 7.0), "z": np.full(3, 9.0)}
    t.append_episode({**cols, "act": np.ones((3, 2), np.float32)}, episode="a", fps=10)
    t.drop_columns(["y"])
    if then == "rename":
        t.rename_columns({"z": "w"})
        assert t.to_arrow(["w"]).column(0).to_pylist() == [9.0] * 3
    else:
        t.drop_columns(["x"])
        assert t.to_arrow(["z"]).column(0).to_pylist() == [9.0] * 3
    assert np.asarray(t.to_arrow(["act"]).column(0).to_pylist()).tolist() == [[1, 1]] * 3

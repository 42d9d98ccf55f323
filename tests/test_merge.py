"""Branches that merge, and diffs (issue 47, section 3): fast-forward, three-way by table
from the operation kinds commits record, MergeConflict writing nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

import treadle as td
from test_evolve import check_rows
from treadle.cli import main as cli_main


def project_with_table(root, options=None):
    p = td.Client(root, storage_options=options).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    return p


def refs(p):
    return {b: p.branch(b).commit_id for b in p.branches()}


def test_fast_forward(tmp_path):
    p = project_with_table(str(tmp_path))
    labels = p.create_branch("labels", from_="main")
    labels.table("t").add_column("ok", {"a": True})
    c = p.merge("labels", into="main")
    assert p.branch().commit_id == labels.commit_id == c.id
    assert p.merge("labels", into="main").id == c.id  # nothing left to merge


def test_both_appended_base_then_ours_then_theirs(any_root):
    root, options = any_root
    p = project_with_table(root, options)
    side = p.create_branch("side", from_="main")
    main = p.branch()
    main.table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    side.table("t").append_episode({"x": np.arange(4.0)}, episode="c")
    ours, theirs = main.commit_id, side.commit_id
    c = p.merge("side", into="main")
    assert c.parents == (ours, theirs)
    t = main.table("t").pin()
    assert list(t.episodes().names) == ["a", "b", "c"]
    check_rows(t)
    assert t.to_arrow(["x"]).column(0).to_pylist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]


def test_columns_on_one_side_appends_on_the_other(any_root):
    root, options = any_root
    p = project_with_table(root, options)
    labels = p.create_branch("labels", from_="main")
    labels.table("t").add_column("ok", {"a": False}, default=True)
    labels.table("t").annotate("phase", {"a": [(0.0, 0.2, "reach")]})
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    c = p.merge("labels", into="main")
    assert "default or null" in c.message
    got = p.branch().table("t").to_arrow(["episode", "ok", "phase"]).to_pydict()
    assert got["ok"] == [False] * 3 + [True] * 2
    assert got["phase"] == ["reach"] * 2 + [None] * 3
    assert got["episode"] == ["a"] * 3 + ["b"] * 2


def test_table_changed_on_one_side_takes_that_side(tmp_path):
    p = project_with_table(str(tmp_path))
    p.branch().table("u").append_episode({"y": np.arange(2.0)}, episode="u0")
    side = p.create_branch("side", from_="main")
    side.table("t").update({"x": 9.0}, where="frame = 0")
    p.branch().table("u").append_episode({"y": np.arange(2.0)}, episode="u1")
    p.merge("side", into="main")
    main = p.branch()
    assert main.table("t").to_arrow(["x"]).column(0).to_pylist() == [9.0, 1.0, 2.0]
    assert list(main.table("u").pin().episodes().names) == ["u0", "u1"]


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (lambda t: t.update({"x": 1.0}), lambda t: t.update({"x": 2.0})),
        (lambda t: t.delete_episodes(["a"]), lambda t: t.append_episode({"x": [1.0]}, episode="z")),
        (lambda t: t.append_episode({"x": [1.0]}, episode="z"),
         lambda t: t.append_episode({"x": [2.0]}, episode="z")),
    ],
)  # fmt: skip
def test_conflict_names_the_table_and_moves_nothing(tmp_path, ours, theirs):
    p = project_with_table(str(tmp_path))
    side = p.create_branch("side", from_="main")
    ours(p.branch().table("t"))
    theirs(side.table("t"))
    before = refs(p)
    with pytest.raises(td.MergeConflict, match="table 't'"):
        p.merge("side", into="main")
    assert refs(p) == before


def test_diff_and_cli(tmp_path, capsys):
    root = str(tmp_path)
    p = project_with_table(root)
    p.tag("v1", p.branch().commit_id)
    t = p.branch().table("t")
    t.add_column("ok", {"a": True})
    t.append_episode({"x": np.arange(2.0), "ok": [False] * 2}, episode="b")
    t.delete_episodes(["a"])
    d = p.diff("v1", "main")
    td_ = d.tables["t"]
    assert (td_.episodes_added, td_.episodes_removed) == (["b"], ["a"])
    assert td_.columns_added == {"ok": "bool"}
    assert (td_.moments_before, td_.moments_after) == (3, 2)
    assert cli_main(["diff", "p", "v1", "main", "--root", root, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tables"]["t"]["episodes_removed"] == ["a"]
    assert cli_main(["diff", "p", "v1", "main", "--root", root]) == 0
    assert "+columns ok" in capsys.readouterr().out
    assert p.diff("main", "main").tables == {}
    assert cli_main(["log", "p", "--root", root]) == 0
    assert "t: add_column ok" in capsys.readouterr().out
    kinds = [c.changes.get("t") for c in p.branch().log()[:3]]
    assert [k[0].split()[0] for k in kinds] == ["delete_episodes", "append", "add_column"]


def test_diff_names_columns_whose_values_were_updated(tmp_path, capsys):
    """A relabelling branch (update only) showed as 'changed' and nothing else: the
    columns an update set, on either side since the other, are named."""
    root = str(tmp_path)
    p = project_with_table(root)
    p.branch().table("t").add_column("ok", {"a": True})
    fix = p.create_branch("fix", from_="main")
    fix.table("t").update({"x": -1.0}, where="frame = 0")
    fix.table("t").update({"ok": False})
    d = p.diff("main", "fix").tables["t"]
    assert d.columns_updated == ["ok", "x"] and d.columns_added == {}
    assert p.diff("fix", "main").tables["t"].columns_updated == ["ok", "x"]
    p.branch().table("t").update({"ok": False}, where="frame = 1")  # main moves too
    assert p.diff("main", "fix").tables["t"].columns_updated == ["ok", "x"]
    assert cli_main(["diff", "p", "main", "fix", "--root", root]) == 0
    assert "~values ok, x" in capsys.readouterr().out
    fix.table("t").add_column("new", {"a": 1})
    fix.table("t").update({"new": 2})  # added on that side: a new column, not an update
    assert "new" not in p.diff("main", "fix").tables["t"].columns_updated


def test_delete_then_appends_on_both_sides_merge(any_root):
    root, options = any_root
    p = project_with_table(root, options)
    main = p.branch()
    main.table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    main.table("t").delete_episodes(["a"])
    side = p.create_branch("side", from_="main")
    side.table("t").append_episode({"x": np.arange(4.0)}, episode="c")
    main.table("t").append_episode({"x": np.arange(1.0)}, episode="d")
    side.table("t").append_episode({"x": np.arange(2.0)}, episode="a")  # the name again
    p.merge("side", into="main")
    t = main.table("t").pin()
    assert list(t.episodes().names) == ["b", "d", "c", "a"]
    check_rows(t)


def test_delete_beside_appends_is_a_conflict_and_fast_forwards_work(any_root):
    """Deletion files never break branches (treadle writes none): a delete on main after
    `side` branched, appends on both, is a MergeConflict naming the table and both sides
    (only appends, or columns beside appends, merge), every ref as it was; a branch made
    after the delete appends and fast-forwards main."""
    root, options = any_root
    p = project_with_table(root, options)
    main = p.branch()
    main.table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    side = p.create_branch("side", from_="main")
    main.table("t").delete_episodes(["a"])
    main.table("t").append_episode({"x": np.arange(1.0)}, episode="d")
    side.table("t").append_episode({"x": np.arange(4.0)}, episode="c")
    before = refs(p)
    with pytest.raises(td.MergeConflict, match=r"table 't'.*delete_episodes.*append"):
        p.merge("side", into="main")
    assert refs(p) == before
    fix = p.create_branch("fix", from_="main")
    fix.table("t").append_episode({"x": np.arange(2.0)}, episode="e")
    assert p.merge("fix", into="main").id == fix.commit_id == main.commit_id
    t = main.table("t").pin()
    assert list(t.episodes().names) == ["b", "d", "e"]
    check_rows(t)
    assert list(side.table("t").pin().episodes().names) == ["a", "b", "c"]
    d = p.diff("side", "main").tables["t"]
    assert (d.episodes_added, d.episodes_removed) == (["d", "e"], ["a", "c"])


def test_criss_cross_merge_names_its_common_ancestors(tmp_path):
    p = project_with_table(str(tmp_path))
    x = p.create_branch("x", from_="main")
    y = p.create_branch("y", from_="main")
    x.table("u").append_episode({"y": np.arange(2.0)}, episode="u0")
    y.table("v").append_episode({"y": np.arange(2.0)}, episode="v0")
    x1, y1 = x.commit_id, y.commit_id
    p.merge(x1, into="y")
    p.merge(y1, into="x")
    before = refs(p)
    with pytest.raises(td.MergeConflict, match=f"{x1[:8]}|{y1[:8]}"):
        p.merge("y", into="x")
    assert refs(p) == before


def test_their_appended_fragment_goes_after_ours_whatever_its_id(tmp_path):
    """Their appended fragment (id 3) was re-listed by a Lance Append that kept its id,
    and Lance orders fragments by id: the merged table read c, a, b, d while its episode
    index said a, b, d, c (fails before: every moment id of the merge read another row)."""
    p = project_with_table(str(tmp_path))
    p.branch().table("t").append_episode({"x": np.arange(3.0) + 10}, episode="b")
    side = p.create_branch("side", from_="main")
    side.table("t").append_episode({"x": np.arange(2.0) + 20}, episode="c")
    p.branch().table("t").append_episode({"x": np.arange(2.0) + 30}, episode="d")
    p.merge("side", into="main")
    t = p.branch().table("t").pin()
    assert list(t.episodes().names) == ["a", "b", "d", "c"]
    check_rows(t)
    x = [0, 1, 2, 10, 11, 12, 30, 31, 20, 21]
    assert t.to_arrow(["x"]).column(0).to_pylist() == x


def test_a_merge_that_kept_our_version_of_a_table_did_nothing_to_it(tmp_path):
    """A merge commit whose table is one parent's version counted as an 'unknown' change
    of it (its other parent's version differed), and a later merge of appends on both
    sides was refused (fails before)."""
    p = project_with_table(str(tmp_path))
    side = p.create_branch("side", from_="main")
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="b")
    side.table("u").append_episode({"y": np.arange(2.0)}, episode="q", fps=10)
    p.merge("side", into="main")  # three-way: t is main's version
    s2 = p.create_branch("s2", from_="side")
    p.branch().table("t").append_episode({"x": np.arange(2.0) + 5}, episode="c")
    s2.table("t").append_episode({"x": np.arange(2.0) + 7}, episode="d")
    p.merge("s2", into="main")
    t = p.branch().table("t").pin()
    assert list(t.episodes().names) == ["a", "b", "c", "d"]
    check_rows(t)
    assert t.to_arrow(["x"]).column(0).to_pylist() == [0, 1, 2, 0, 1, 5, 6, 7, 8]


def test_finding_the_merge_base_walks_the_history_a_bounded_number_of_times(tmp_path, monkeypatch):
    """merge_base walked the ancestors of every common commit: quadratic in the history's
    length (fails before: one walk per commit of the history)."""
    import treadle.catalog.merge as merge

    p = project_with_table(str(tmp_path))
    for i in range(30):
        p.branch().table("u").append({"y": [float(i)]})
    side = p.create_branch("side", from_="main")
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="m")
    side.table("t").append_episode({"x": np.arange(2.0)}, episode="s")
    walks = []
    real = merge.ancestors
    monkeypatch.setattr(merge, "ancestors", lambda *a: walks.append(a) or real(*a))
    p.merge("side", into="main")
    assert len(walks) <= 8
    assert list(p.branch().table("t").pin().episodes().names) == ["a", "m", "s"]


def _expired_side(root):
    """main: a; side: c (commit c1), d; main moves on (table u); gc expires c1 and a's."""
    from datetime import timedelta

    p = project_with_table(root)
    side = p.create_branch("side", from_="main")
    c1 = side.table("t").append_episode({"x": np.arange(2.0)}, episode="c")
    side.table("t").append_episode({"x": np.arange(2.0)}, episode="d")
    return p, c1, lambda: p.gc(older_than=timedelta(0), keep_days=0).expired_commits


@pytest.mark.parametrize("fast_forward", [True, False])
def test_merging_an_expired_commit_moves_no_branch(tmp_path, fast_forward):
    """Merging a commit retention expired fast-forwarded the branch to it, or (three-way)
    committed its gone table version: the branch's head then read nothing (fails before)."""
    p, c1, gc = _expired_side(str(tmp_path))
    if not fast_forward:
        p.branch().table("u").append({"y": [1.0]})
    assert c1.id in gc()
    fresh = td.Client(str(tmp_path)).project("p")
    before = refs(fresh)
    with pytest.raises(td.ExpiredCommit, match=rf"merging '{c1.id}' into 'main'.*{c1.id[:8]}"):
        fresh.merge(c1.id, into="main")
    assert refs(fresh) == before
    assert fresh.branch().table("t").to_arrow(["x"]).num_rows == 3


def test_a_merge_whose_common_ancestor_expired_says_so(tmp_path):
    """Both branches appended since a common ancestor retention expired: the merge needs
    its row count; it said a Lance manifest was not found (fails before)."""
    p, _, gc = _expired_side(str(tmp_path))
    base = p.branch().commit_id
    p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="m")
    assert base in gc()
    fresh = td.Client(str(tmp_path)).project("p")
    before = refs(fresh)
    with pytest.raises(td.ExpiredCommit, match=rf"merging 'side' into 'main'.*{base[:8]}"):
        fresh.merge("side", into="main")
    assert refs(fresh) == before


@pytest.mark.parametrize("labels_on_main", [False, True])
def test_a_merge_keeps_the_nulls_the_other_side_recorded(tmp_path, labels_on_main):
    """Their appended rows held a null, recorded in their schema; the merged version took
    ours' schema without it, so a plan no longer refused the null before step 0 and a batch
    failed mid-epoch (fails before)."""
    import pyarrow as pa

    from treadle.table.null_columns import recorded_nulls

    p = project_with_table(str(tmp_path))
    side = p.create_branch("side", from_="main")
    rows = {"episode": ["b"] * 3, "frame": [0, 1, 2], "x": [0.0, None, 2.0]}
    side.table("t").append(pa.table(rows))
    if labels_on_main:  # main only added a column: "columns+appends"
        p.branch().table("t").add_column("ok", {"a": True})
    else:  # main appended too: "appends"
        p.branch().table("t").append_episode({"x": np.arange(2.0)}, episode="c")
    p.merge("side", into="main")
    t = p.branch().table("t")
    assert "x" in recorded_nulls(t.pin().schema)
    with pytest.raises(td.PlanError, match="'x'.*episode 'b', frame 1"):
        td.Recipe(seed=1, batch_size=2, components=[td.Component(t)]).plan()


def test_a_null_recorded_on_a_table_with_a_dropped_column_merges_and_appends(tmp_path):
    """Main dropped a column (its field ids are no longer 0..n-1); the side appended rows
    holding a null, so the merged version records one more null column, a change of the
    schema's metadata: a CommitConflict asked to compact() main, which renumbers nothing
    (the merge, and an append of a null on main, had no way through; fails before). The
    version now keeps the base's field ids under the new metadata."""
    import pyarrow as pa

    from treadle.table.null_columns import recorded_nulls

    p = td.Client(str(tmp_path)).project("p")
    p.branch().table("t").append_episode({"y": np.arange(3.0), "x": np.arange(3.0)},
                                         episode="a", fps=10)  # fmt: skip
    side = p.create_branch("side", from_="main")
    p.branch().table("t").drop_columns(["y"])
    rows = {"episode": ["b"] * 2, "frame": [0, 1], "y": [5.0, 6.0], "x": [None, 7.0]}
    side.table("t").append(pa.table(rows))
    c = p.merge("side", into="main")
    assert c.parents[1] == side.commit_id
    t = p.branch().table("t")
    check_rows(t.pin())
    assert t.to_arrow().to_pydict() == {"episode": ["a"] * 3 + ["b"] * 2,
                                        "frame": [0, 1, 2, 0, 1],
                                        "x": [0.0, 1.0, 2.0, None, 7.0]}  # fmt: skip
    assert "x" in recorded_nulls(t.pin().schema)
    t.append(pa.table({"episode": ["d"], "frame": [0], "x": pa.array([None], pa.float64())}))
    assert t.to_arrow(["x"]).column(0).to_pylist()[-2:] == [7.0, None]


def test_a_diff_line_of_an_added_or_removed_table_shows_no_none():
    # before: "t: added; moments None -> 4" (`treadle diff` of a release before a table existed)
    from treadle.catalog.diff import TableDiff

    assert TableDiff("t", "added", None, 4).line() == "t: added; 4 moments"
    assert TableDiff("t", "removed", 1234, None).line() == "t: removed; had 1,234 moments"
    assert TableDiff("t", "changed", 3, 2).line() == "t: changed; moments 3 -> 2"

"""Merges after a purge: branches that only appended after it merge (the purge deleted the
same episodes on each), and no merge brings a purged episode's blanked rows back."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import treadle as td
from test_evolve import check_rows


def refs(p):
    return {b: p.branch(b).commit_id for b in p.branches()}


def three(root):
    p = td.Client(root).project("p")
    for i, e in enumerate("abc"):
        p.branch().table("t").append_episode({"x": np.arange(3.0) + 10 * i}, episode=e, fps=10)
    return p


def xs(p, branch="main"):
    t = p.branch(branch).table("t").pin()
    check_rows(t)
    return list(t.episodes().names), t.to_arrow(["x"]).column(0).to_pylist()


def test_branches_that_only_appended_after_a_purge_merge(tmp_path):
    """The purge deleted b on main and on side (one commit each): both sides then did
    delete_episodes and append, a MergeConflict 'by contract' (fails before). Side had also
    appended before the purge; main re-used a deleted name."""
    p = three(str(tmp_path))
    side = p.create_branch("side", from_="main")
    side.table("t").append_episode({"x": [40.0]}, episode="e1")
    old = p.branch().commit_id
    p.purge("t", ["b"], reason="consent withdrawn")
    p.branch().table("t").append_episode({"x": [50.0, 51.0]}, episode="d")
    side.table("t").append_episode({"x": [60.0]}, episode="e2")
    m = p.merge("side", into="main")
    assert m.parents[1] == side.commit_id
    assert xs(p) == (["a", "c", "d", "e1", "e2"], [0, 1, 2, 20, 21, 22, 50, 51, 40, 60])
    with pytest.raises(td.Purged, match="consent withdrawn"):
        p.branch().table("t").at(old).to_arrow(filter="episode = 'b'")
    assert not p.branch().table("t").pin().purged(fresh=True)
    p.merge("main", into="side")  # a fast-forward now
    assert xs(p, "side") == xs(p)


@pytest.mark.parametrize("appended", ["main", "side"])
def test_a_branch_that_only_had_the_purge_merges_either_way(tmp_path, appended):
    p = three(str(tmp_path))
    p.create_branch("side", from_="main")
    p.purge("t", ["b"], reason="r")
    p.branch(appended).table("t").append_episode({"x": [70.0]}, episode="z")
    want = (["a", "c", "z"], [0, 1, 2, 20, 21, 22, 70])
    p.merge("side", into="main")
    assert xs(p) == want
    p.merge("main", into="side")
    assert xs(p, "side") == want


def test_different_deletions_on_each_side_are_a_conflict_naming_them(tmp_path):
    p = three(str(tmp_path))
    side = p.create_branch("side", from_="main")
    p.purge("t", ["b"], reason="r")
    side.table("t").delete_episodes(["a"])
    side.table("t").append_episode({"x": [1.0]}, episode="q")
    p.branch().table("t").append_episode({"x": [2.0]}, episode="w")
    before = refs(p)
    with pytest.raises(td.MergeConflict, match=r"lost different episodes.*\['b'\].*\['a', 'b'\]"):
        p.merge("side", into="main")
    assert refs(p) == before


def test_merging_a_commit_made_before_the_purge_brings_no_blanked_rows_back(tmp_path):
    """A tag on a side branch appended b, later purged: merging the tag into main (which
    appended too) committed b's blanked rows as live rows: zeros read as data, and the
    merged version named no purge (fails before). It is td.Purged; nothing moves."""
    p = three(str(tmp_path))
    side = p.create_branch("side", from_="main")
    c = side.table("t").append_episode({"x": [5.0, 6.0]}, episode="s")
    p.tag("old", c.id)
    p.branch().table("t").append_episode({"x": [9.0]}, episode="d")
    p.purge("t", ["s"], reason="legal hold")
    before = refs(p)
    with pytest.raises(td.Purged, match=r"episode 's'.*legal hold.*no branch moved"):
        p.merge("old", into="main")
    assert refs(p) == before
    assert xs(p)[0] == ["a", "b", "c", "d"]


def labelled_side(root):
    """Main added a column; side appended 's' (777, 778): merging side into main writes
    s's rows again beside main's column ("columns+appends")."""
    p = three(root)
    side = p.create_branch("side", from_="main")
    side.table("t").append_episode({"x": [777.0, 778.0]}, episode="s")
    p.branch().table("t").add_column("ok", {"a": True, "b": True, "c": True})
    return p


def held_anywhere(root, value):
    """Whether some Lance version of table t in storage, or some data file, holds ``value``."""
    import glob
    import os

    import lance
    from lance.file import LanceFileReader

    uri = os.path.join(root, "projects", "p", "tables", "t.lance")
    for v in lance.dataset(uri).versions():
        if value in lance.dataset(uri, version=v["version"]).to_table(["x"])["x"].to_pylist():
            return True
    for path in glob.glob(os.path.join(uri, "data", "*.lance")):
        got = LanceFileReader(path).read_all().to_table()
        if any(value in col.to_pylist() for col in got.columns if col.type == "double"):
            return True
    return False


def run_in_thread(fn, errors, done=None):
    def run():
        try:
            fn()
        except BaseException as e:
            errors.append(e)
        finally:
            if done is not None:
                done.set()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_merge_while_a_purge_runs_is_refused_and_keeps_no_purged_rows(tmp_path, monkeypatch):
    """The purge scanned the table's versions; a merge then wrote s's rows again (beside
    main's new column) and moved main; the purge deleted s on main's new head, but never
    saw the merged version: s's values stayed readable at the merge commit, in no purge
    record (fails before). A merge that would change a table a purge is purging is now a
    CommitConflict that writes nothing, and no version nor data file holds s's values."""
    from treadle.catalog import purge as purge_mod

    root = str(tmp_path)
    p = labelled_side(root)
    scanned, go = threading.Event(), threading.Event()
    real = purge_mod._scan

    def paused(*args):
        got = real(*args)
        scanned.set()
        go.wait()
        return got

    monkeypatch.setattr(purge_mod, "_scan", paused)
    errors: list[BaseException] = []
    other = td.Client(root).project("p")  # another process's project
    th = run_in_thread(lambda: other.purge("t", ["s"], reason="consent withdrawn"), errors,
                       scanned)  # fmt: skip
    scanned.wait()
    try:
        with pytest.raises(td.CommitConflict, match="purge of table 't' is running"):
            p.merge("side", into="main")
    finally:
        go.set()
        th.join()
    assert errors == []
    assert xs(p) == (["a", "b", "c"], [0, 1, 2, 10, 11, 12, 20, 21, 22])
    assert not held_anywhere(root, 777.0)
    assert xs(p, "side")[0] == ["a", "b", "c"]


def test_a_purge_waits_for_a_running_merge_then_purges_what_it_merged(tmp_path, monkeypatch):
    """A merge planned (side still held s), then a purge of s ran whole before the merge
    wrote: the merge then copied s's blanked rows, or met the branches the purge had moved
    (fails before: the merge failed). A purge now waits for the merges running when it
    starts, then scans what they committed: s is purged from the merged version too."""
    from treadle.catalog import merge as merge_mod
    from treadle.catalog import purgeguard

    root = str(tmp_path)
    p = labelled_side(root)
    planned, go, waiting = threading.Event(), threading.Event(), threading.Event()
    real_merged, real_sleep = merge_mod.merged_version, purgeguard._sleep

    def paused(*args):
        planned.set()
        go.wait()
        return real_merged(*args)

    def sleep(s):
        waiting.set()
        real_sleep(0.05)

    monkeypatch.setattr(merge_mod, "merged_version", paused)
    monkeypatch.setattr(purgeguard, "_sleep", sleep)
    errors: list[BaseException] = []
    merged: list = []
    mt = run_in_thread(lambda: merged.append(p.merge("side", into="main")), errors, planned)
    planned.wait()
    other = td.Client(root).project("p")
    pt = run_in_thread(lambda: other.purge("t", ["s"], reason="consent withdrawn"), errors)
    while not waiting.wait(0.05) and pt.is_alive():
        pass  # the purge waits for the merge (or, before, ran whole)
    go.set()
    mt.join()
    pt.join()
    assert errors == []
    p = td.Client(root).project("p")  # the merge's handles predate the purge
    assert xs(p) == (["a", "b", "c"], [0, 1, 2, 10, 11, 12, 20, 21, 22])
    with pytest.raises(td.Purged, match="consent withdrawn"):
        p.branch().table("t").at(merged[0].id).to_arrow(filter="episode = 's'")
    assert not held_anywhere(root, 777.0)


def test_a_dead_purges_lease_neither_refuses_merges_nor_stays(tmp_path):
    """A purge that died holding its lease (no beat for LEASE_TTL) did nothing more: a
    merge goes on, and the lease's marker is deleted; a live one refuses the merge."""
    import os
    import time

    root = str(tmp_path)
    p = labelled_side(root)
    lease = tmp_path / "projects" / "p" / "running" / "purges" / "t" / "dead"
    lease.mkdir(parents=True)
    (lease / "start").write_bytes(b"")
    with pytest.raises(td.CommitConflict, match="purge of table 't' is running"):
        p.merge("side", into="main")
    old = time.time() - 6 * 60
    os.utime(lease / "start", (old, old))
    p.merge("side", into="main")
    assert xs(p)[0] == ["a", "b", "c", "s"]
    assert not (lease / "start").exists()

"""Merges after a purge: branches that only appended after it merge (the purge deleted the
same episodes on each), and no merge brings a purged episode's blanked rows back."""

from __future__ import annotations

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

"""``project.diff`` reads the commits between its two ends and their common ancestors, not
the whole history (treadle.catalog.between), with the same answer as the whole walk."""

from __future__ import annotations

import random

import numpy as np
import pytest

import treadle as td
from treadle.catalog.between import _reachable, sides
from treadle.catalog.commit import Commit


def full_sides(load, a, b):
    left, right = _reachable(load, a), _reachable(load, b)
    return left - right, right - left


def random_history(rng, n, skew=False):
    """``n`` commits: chains on a few branches, merges between them (criss-cross ones too)."""
    commits: dict[str, Commit] = {}
    heads = []
    root = Commit.create([], "root", {}, after=1000.0)
    commits[root.id] = root
    heads.append(root.id)
    for i in range(n):
        pick = rng.random()
        if pick < 0.15 and len(heads) < 6:
            heads.append(heads[rng.randrange(len(heads))])  # a new branch
            continue
        k = rng.randrange(len(heads))
        parents = [heads[k]]
        if pick > 0.8 and len(heads) > 1:
            other = rng.randrange(len(heads))
            if heads[other] != heads[k]:
                parents.append(heads[other])
        newest = max(commits[p].time for p in parents)
        c = Commit.create(parents, f"c{i}", {}, after=newest)
        if skew and rng.random() < 0.05:  # a writer whose clock was behind (an old treadle)
            c = Commit(c.parents, c.message, newest - 5.0, c.tables)._with_id()
        commits[c.id] = c
        heads[k] = c.id
    return commits, heads


def test_sides_equal_the_whole_walk_on_histories_with_merges():
    rng = random.Random(7)
    for _ in range(30):
        commits, heads = random_history(rng, 120)
        ids = list(commits)
        for _ in range(15):
            a, b = rng.choice(heads + ids), rng.choice(heads + ids)
            got = sides(commits.__getitem__, a, b)
            assert (set(got.left), set(got.right)) == full_sides(commits.__getitem__, a, b)
            assert not got.walked


def test_out_of_order_times_never_leave_a_commit_out():
    """Commits an older treadle wrote on a machine whose clock was behind: a parent it
    reads that is not older is walked whole (exact); one it does not read may add a common
    commit to a side, never drop one of a side's own (the limit the docs state)."""
    rng = random.Random(8)
    walked = 0
    for _ in range(30):
        commits, heads = random_history(rng, 120, skew=True)
        ids = list(commits)
        for _ in range(15):
            a, b = rng.choice(heads + ids), rng.choice(heads + ids)
            got = sides(commits.__getitem__, a, b)
            left, right = full_sides(commits.__getitem__, a, b)
            assert got.left >= left and got.right >= right
            walked += got.walked
    assert walked


def test_commits_are_newer_than_their_parents_whatever_the_clock():
    parent = Commit.create([], "from a machine ahead", {}, after=4e9)
    child = Commit.create([parent.id], "here", {}, after=parent.time)
    assert child.time > parent.time


def chain(project, n, change):
    """``n`` commits on main, each recording ``change`` of table t (no Lance write)."""
    for _ in range(n):
        head = project.refs.head("main")
        parent = project.load_commit(head.commit_id)
        c = Commit.create([parent.id], "bulk", dict(parent.tables), {"t": [change]}, parent.time)
        project.save_commit(c)
        assert project.refs.try_advance("main", head.seq + 1, c.id)


def counted(project, monkeypatch):
    reads: list[str] = []
    real = project.load_commit
    monkeypatch.setattr(project, "load_commit", lambda cid: reads.append(cid) or real(cid))
    return reads


@pytest.mark.parametrize("length", [50, 2000])
def test_a_diff_reads_the_commits_that_differ_not_the_history(tmp_path, monkeypatch, length):
    """A diff of two branches read every commit of a long history (fails before: 2000+
    reads); now the commits since the fork and a few around it, at any length."""
    p = td.Client(str(tmp_path)).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    chain(p, length, "update x")
    side = p.create_branch("side", from_="main")
    p.branch().table("t").update({"x": 1.0}, where="frame = 0")
    side.table("u").append_episode({"y": np.arange(2.0)}, episode="u0", fps=10)
    p.merge("main", into="side")  # a merge commit on one side
    side.table("t").add_column("ok", {"a": True})
    side.table("t").update({"ok": False}, where="frame = 1")
    reads = counted(p, monkeypatch)
    d = p.diff("main", "side")
    assert len(reads) < 40, len(reads)
    assert d.tables["t"].columns_added == {"ok": "bool"}
    assert d.tables["t"].columns_updated == []  # 'ok' is new; x's update is on both sides
    assert sorted(d.tables) == ["t", "u"]
    older = p.branch("main").log()[length // 2].id
    reads.clear()
    d = p.diff(older, "side")
    assert d.tables["t"].columns_updated == ["x"]  # the bulk updates after that commit
    assert len(reads) < 3 * (length // 2) + 40  # each commit of a side read twice or so


def test_a_diff_over_merges_names_what_the_whole_walk_names(tmp_path):
    """Merges both ways between two branches: each side's updates are named, as the whole
    walk names them (the answer did not change with the bounded walk)."""
    p = td.Client(str(tmp_path)).project("p")
    p.branch().table("t").append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    p.branch().table("t").add_column("k", {"a": 1})
    p.branch().table("t").add_column("m", {"a": 1})
    side = p.create_branch("side", from_="main")
    side.table("u").append_episode({"y": np.arange(2.0)}, episode="u0", fps=10)
    p.branch().table("t").update({"k": 2})
    p.merge("main", into="side")  # main's update reaches side: both have it
    side.table("t").update({"m": 3})
    p.branch().table("v").append_episode({"z": np.arange(2.0)}, episode="v0", fps=10)
    p.merge("side", into="main")  # a fast-forward is impossible: three-way
    p.branch().table("t").update({"x": 5.0})
    d = p.diff("side", "main").tables["t"]
    load = p.load_commit
    left, right = full_sides(load, p.branch("side").commit_id, p.branch().commit_id)
    named = {c.split(" ", 1)[1] for cid in left | right for c in load(cid).changes.get("t", ())
             if c.startswith("update ")}  # fmt: skip
    assert d.columns_updated == sorted(named) == ["x"]

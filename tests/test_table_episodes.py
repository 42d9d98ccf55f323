"""Episode boundaries follow the episode key, frames run 0..len-1, names are unique.

Writes that break a rule are refused naming the episode (or column); a stored table
that breaks one (written by another tool, here Lance itself) is ``CorruptData`` naming
the table and the column, never an episode index with made-up boundaries.
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from treadle.errors import AlreadyExists, CorruptData, SchemaMismatch


@pytest.fixture
def branch(local_root):
    return td.Client(local_root).project("p").branch("main")


def _rows(episodes, frames, frame_type=pa.int32()):
    return pa.table(
        {
            "episode": pa.array(episodes),
            "frame": pa.array(frames, frame_type),
            "v": pa.array(np.arange(len(frames), dtype=np.float32)),
        }
    )


def _foreign(branch, name, table):
    """A table another tool wrote (Lance directly), read through treadle."""
    project = branch.project
    ds = lance.write_dataset(table, project.table_uri(name))
    return project.table_at(name, ds.version)


@pytest.mark.parametrize(
    "episodes, frames, named",
    [
        (["a", "a", "b", "b"], [0, 1, 2, 3], "'b'"),  # a new name, frames not restarted
        (["a", "a", "a"], [0, 2, 3], "'a'"),  # a gap
        (["a", "a", "a", "a"], [0, 1, 0, 1], "'a'"),  # one name, two episodes
        (["a", "a", "b", "a"], [0, 1, 0, 0], "'a'"),  # a name back after another
    ],
)
def test_bad_episode_rows_are_refused_by_name(branch, episodes, frames, named):
    with pytest.raises(SchemaMismatch, match=named):
        branch.table("t").append(_rows(episodes, frames))
    with pytest.raises(CorruptData, match=rf"table 't'.*{named}"):
        _foreign(branch, "t", _rows(episodes, frames)).episodes()


def test_boundaries_follow_the_key(branch):
    branch.table("t").append(_rows(["a", "a", "b", "b", "b"], [0, 1, 0, 1, 2]))
    ep = branch.table("t").pin().episodes()
    assert ep.names == ["a", "b"]
    assert ep.starts.tolist() == [0, 2] and ep.lengths.tolist() == [2, 3]


def test_duplicate_episode_is_refused_across_commits(branch):
    t = branch.table("t")
    t.append_episode({"v": np.zeros(2, np.float32)}, episode="a")
    head = branch.head().id
    with pytest.raises(AlreadyExists, match="'a'"):
        t.append_episode({"v": np.ones(3, np.float32)}, episode="a")
    with pytest.raises(AlreadyExists, match="'a'"):
        t.append(_rows(["b", "a"], [0, 0]))
    with pytest.raises(AlreadyExists, match="'c'"):
        with branch.transaction("twice") as tx:
            tx.table("t").append_episode({"v": np.ones(1, np.float32)}, episode="c")
            tx.table("t").append(_rows(["c"], [0]))
    assert branch.head().id == head
    assert t.pin().episodes().names == ["a"]


def test_duplicate_episode_is_refused_between_racing_writers(branch):
    branch.table("t").append_episode({"v": np.zeros(1, np.float32)}, episode="first")
    with pytest.raises(AlreadyExists, match="'z'"):
        with branch.transaction("loser") as loser:
            loser.table("t").append_episode({"v": np.ones(2, np.float32)}, episode="z")
            with branch.transaction("winner") as winner:
                winner.table("t").append_episode({"v": np.full(3, 2, np.float32)}, episode="z")
    ep = branch.table("t").pin().episodes()
    assert ep.names == ["first", "z"] and ep.lengths.tolist() == [1, 3]


@pytest.mark.parametrize(
    "episode, frame, column",
    [
        (pa.array(["a", None]), pa.array([0, 1], pa.int32()), "episode"),
        (pa.array(["a", "a"]), pa.array([0, None], pa.int32()), "frame"),
        (pa.array([1, 1]), pa.array([0, 1], pa.int32()), "episode"),
        (pa.array(["a", "a"]), pa.array(["0", "1"]), "frame"),
        (pa.array(["a", "a"]), pa.array([0.0, 1.0]), "frame"),
        (pa.array(["a", "a"]), pa.array([0, -1], pa.int64()), "frame"),
    ],
)
def test_corrupt_episode_columns_are_named(branch, episode, frame, column):
    bad = pa.table({"episode": episode, "frame": frame, "v": pa.array([1.0, 2.0])})
    with pytest.raises(SchemaMismatch, match=rf"'t'.*column '{column}'"):
        branch.table("t").append(bad)
    table = _foreign(branch, "t", bad)
    with pytest.raises(CorruptData, match=rf"table 't'.*column '{column}'"):
        table.episodes()
    with pytest.raises(CorruptData, match=rf"table 't'.*column '{column}'"):
        td.Recipe(seed=0, batch_size=1, components=[td.Component(table)]).plan()

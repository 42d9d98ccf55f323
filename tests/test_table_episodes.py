"""Episode boundaries follow the episode key, frames run 0..len-1, names are unique.

Writes that break a rule are refused naming the episode (or column); a stored table
that breaks one (written by another tool, here Lance itself) is ``CorruptData`` naming
the table and the column, never an episode index with made-up boundaries.
"""

from __future__ import annotations

from pathlib import Path

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


def _data_files(table):
    return {f.metadata.files[0].path for f in table.pin().dataset.get_fragments()}


def _on_disk(branch):
    return {p.name for p in (Path(branch.project.table_uri("t")) / "data").glob("*.lance")}


def test_later_commits_read_only_the_fragments_they_change(branch, monkeypatch):
    """A writer's commits check new episode names against the stored episode index, not
    the table's rows: after its first commit, a commit scans no version of the table and
    reads only fragments it writes or compaction rewrites (never the whole table)."""
    t = branch.table("t")
    t.append_episode({"v": np.zeros(3, np.float32)}, episode="e0")
    scans, reads = [], set()
    real_ds, real_frag = lance.LanceDataset.scanner, lance.LanceFragment.scanner

    def ds_scanner(self, *a, **k):
        scans.append((self.version, k.get("columns"), k.get("filter")))
        return real_ds(self, *a, **k)

    def frag_scanner(self, *a, **k):
        reads.add(self.metadata.files[0].path)
        return real_frag(self, *a, **k)

    monkeypatch.setattr(lance.LanceDataset, "scanner", ds_scanner)
    monkeypatch.setattr(lance.LanceFragment, "scanner", frag_scanner)
    for i in range(1, 13):
        before, files = _data_files(t), _on_disk(branch)
        reads.clear()
        t.append_episode({"v": np.full(3, i, np.float32)}, episode=f"e{i}")
        written = _on_disk(branch) - files  # its new fragment and what compaction wrote
        assert scans == [], f"commit {i} scanned the table: {scans}"
        assert reads <= (before - _data_files(t)) | written, f"commit {i} read old fragments"
    monkeypatch.undo()
    assert t.pin().episodes().names == [f"e{i}" for i in range(13)]


def test_a_name_another_writer_committed_is_refused_after_the_cache(any_root):
    """The names a writer knows (carried from its own commits) do not hide the fragments
    another writer (another client: its own cache) committed in between."""
    root, opts = any_root
    ours = td.Client(root, storage_options=opts).project("p").branch("main").table("t")
    theirs = td.Client(root, storage_options=opts).project("p").branch("main").table("t")
    for i in range(3):
        ours.append_episode({"v": np.zeros(2, np.float32)}, episode=f"a{i}")
    theirs.append_episode({"v": np.ones(2, np.float32)}, episode="b")
    head = ours.pin().commit_id
    with pytest.raises(AlreadyExists, match=r"table 't'.*already has episode 'b'"):
        ours.append_episode({"v": np.zeros(4, np.float32)}, episode="b")
    with pytest.raises(AlreadyExists, match=r"already has episode 'a1'"):
        theirs.append_episode({"v": np.zeros(4, np.float32)}, episode="a1")
    ours.append_episode({"v": np.zeros(1, np.float32)}, episode="c")
    assert ours.pin().commit_id != head
    assert ours.pin().episodes().names == ["a0", "a1", "a2", "b", "c"]


def test_a_table_without_stored_episode_index_still_refuses_duplicates(local_root):
    """A table written before treadle stored episode indexes (here: its objects deleted)
    is checked too: each fragment's names are computed from that fragment, once."""
    t = td.Client(local_root).project("p").branch("main").table("t")
    for name in ("a", "b"):
        t.append_episode({"v": np.zeros(2, np.float32)}, episode=name)
    stored = Path(local_root) / "projects/p/episodes/t"
    for obj in stored.glob("*.json"):
        obj.unlink()
    old = td.Client(local_root).project("p").branch("main").table("t")
    with pytest.raises(AlreadyExists, match="already has episode 'a'"):
        old.append_episode({"v": np.ones(3, np.float32)}, episode="a")
    old.append_episode({"v": np.ones(3, np.float32)}, episode="c")
    assert old.pin().episodes().names == ["a", "b", "c"]


def test_stored_index_reads_lengths_without_names_and_names_on_first_use(branch, monkeypatch):
    # issue 33: the boundaries come from the stored objects without decoding a name per
    # episode; the names (quotes, backslashes, the JSON keys' own text, non-ASCII) are
    # read when first used, and equal what a scan of the table gives
    import pickle

    from treadle.table import episode_store
    from treadle.table.episodes import episode_runs

    odd = ['a"b', "c\\", 'd","lengths":[1]}', 'é\\"', "plain", '"', "x" * 300]
    t = branch.table("t")
    for k in range(0, len(odd), 2):  # several commits: several fragments
        names = odd[k : k + 2]
        t.append(_rows([n for n in names for _ in range(3)], [0, 1, 2] * len(names)))
    pinned = t.pin()
    with monkeypatch.context() as m:  # the full decode (a name per episode) is not used
        m.setattr(episode_store.FragmentRuns, "decode", None)
        index = pinned.episodes()
    assert len(index.names) == len(odd) and index.names._array is None  # noqa: SLF001
    assert index.lengths.tolist() == [3] * len(odd)
    assert index.starts.tolist() == list(range(0, 3 * len(odd), 3))
    assert index.names == odd and index.names._array is not None  # noqa: SLF001
    cols = pinned.to_arrow(["episode", "frame"])  # the reference: the rules over a full scan
    assert episode_runs(cols["episode"], cols["frame"], "ref", CorruptData).names == index.names
    assert index.names.index("plain") == 4 and "nope" not in index.names
    assert index.names[-1] == odd[-1] and index.names[1:3] == odd[1:3]
    assert pickle.loads(pickle.dumps(index)).names == odd

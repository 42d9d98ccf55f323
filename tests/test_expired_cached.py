"""A commit retention expired while a client still held its table version open.

One :class:`td.Client` reads a table at commit c1 (its Lance handle is cached), a later
append compacts c1's only fragment away, and ``gc --keep-days 0`` expires c1 and deletes
that data file. Every read through the cached handle then raises :class:`td.ExpiredCommit`
naming the table and the commit (as opening the version afresh does), not the
:class:`td.NotFound` of a Lance data file: Lance takes, the fixed-width reader (mapped,
resident and take paths), ``where=`` selections, the statistics scan, the episode index,
a loader's next batch and a resume (on local disk, S3 and Azure), and a video column's
stream index.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

import treadle as td
from treadle.read.fixed import FixedReader
from treadle.read.stream_index import StreamIndexes

WIDE = 128  # float32 values a row: 512 bytes, over FULL_ZIP_ROW_BYTES (a mapped column)


N = 64  # rows an append: more than a loader reads ahead


def _rows(i: int) -> dict:
    n = N
    return {
        "x": np.arange(n * i, n * i + n, dtype=np.int64),
        "s": [f"r{n * i + k}" for k in range(n)],  # not fixed-width: a Lance take
        "v": np.full((n, WIDE), i, np.float32),  # wide fixed-width: mapped on local disk
    }


def _project(root: str, opts=None) -> tuple[td.Project, td.TableRef, td.Commit]:
    project = td.Client(root, storage_options=opts, create=True).project("p")
    t = project.branch().table("t")
    c1 = t.append_episode(_rows(0), episode="e0")
    return project, t, c1


def _expire(project: td.Project, t: td.TableRef, c1: td.Commit) -> None:
    """A later commit that compacts c1's fragment away, then gc expiring c1 (the files only
    c1's version lists go)."""
    t.append_episode(_rows(1), episode="e1")
    assert len(t.pin().dataset.get_fragments()) == 1  # c1's data file is no head's
    report = project.gc(older_than=timedelta(0), keep_days=0)
    assert c1.id in report.expired_commits


def _expired(c1: td.Commit) -> str:
    return rf"table 't' at commit {c1.id[:8]} of project 'p' was expired by retention"


def test_take_through_a_cached_handle_of_an_expired_commit(any_root):
    project, t, c1 = _project(*any_root)
    old = t.at(c1.id)
    assert old.take([0, 1], ["s"]).column("s").to_pylist() == ["r0", "r1"]  # handle cached
    _expire(project, t, c1)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        old.take([2], ["s"])
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        old.to_arrow(["x"])
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        project.branch().table("t").at(c1.id).select_runs("x > 1")
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        old.matching_rows("x > 1")  # a ScanDataset's filter (before: raw ArrowInvalid)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        old.stats(["x"])  # the statistics scan (before: Lance's raw ArrowInvalid)


def test_fixed_width_reads_through_a_cached_handle_of_an_expired_commit(any_root):
    """On an object store the wide column is mapped from its copy in the object cache."""
    project, t, c1 = _project(*any_root)
    old = t.at(c1.id)
    assert old.num_moments == N and old.schema.names  # handle cached
    before = FixedReader()  # maps c1's file before gc: the mapping outlives the file
    assert before.path(old, "v") == "mapped"
    _expire(project, t, c1)
    got = before.read(old, [3, 0], ["v"])["v"]
    assert got.shape == (2, WIDE) and not got.any()  # c1's values, never another's
    before.close()
    # a reader made after gc (a resumed loader's) cannot map the gone file: its resident
    # and take paths read through the cached handle
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        FixedReader().read(old, [0, 1], ["v"])
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        FixedReader().read(old, [0, 1], ["x"])  # narrow: read whole (resident)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        FixedReader(resident_bytes=0).read(old, [0, 1], ["x"])  # a Lance take


def test_episode_index_through_a_cached_handle_of_an_expired_commit(local_root):
    project, t, c1 = _project(local_root)
    old = td.Client(local_root).project("p").branch().table("t").at(c1.id)  # not computed
    assert old.num_moments == N
    _expire(project, t, c1)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        old.episodes()


def test_loader_and_resume_through_the_same_client_of_an_expired_commit(any_root):
    """A run planned on c1 reads a batch; gc expires c1 (the run never checkpointed, so
    nothing pins it); its next batches and a resume through the same client are told."""
    project, t, c1 = _project(*any_root)
    recipe = td.Recipe(seed=1, batch_size=1, components=[td.Component(t)])
    loader = td.TrainLoader(recipe, steps=N)
    it = iter(loader)
    first = next(it)
    assert first["s"][0].startswith("r") and first["v"].shape == (1, WIDE)
    state = loader.state_dict()
    _expire(project, t, c1)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        for _ in it:  # the batch read ahead before gc may still come
            pass
    client = project.client  # the same client: its handle of c1's version is cached
    again = td.TrainLoader.from_state({**state, "step": 1}, client, steps=N - 1)
    with pytest.raises(td.ExpiredCommit, match=_expired(c1)):
        next(iter(again))


def test_video_of_an_expired_commit_reads_its_index_named_and_keeps_its_media(local_root):
    """Video: the stream index of an episode not read before gc is a take (ExpiredCommit);
    the media objects stay, because every kept head's version still names them (tables
    only grow, compaction rewrites rows, not streams), so a window fetch never meets a
    missing stream of an expired commit."""
    from treadle.video._testing import synthetic_frames

    project = td.Client(local_root, create=True).project("p")
    v = project.branch().table("v")
    c1 = v.append_episode({"cam": td.VideoFrames(synthetic_frames(6, 32, 32, seed=0), fps=10)},
                          episode="e0")  # fmt: skip
    old = v.at(c1.id)
    assert old.num_moments == 6 and old.num_episodes == 1  # its episode index cached
    store = project.client.store
    media = store.list(f"{project.prefix}/media")
    assert len(media) == 1
    v.append_episode({"cam": td.VideoFrames(synthetic_frames(6, 32, 32, seed=1), fps=10)},
                     episode="e1")  # fmt: skip
    assert len(v.pin().dataset.get_fragments()) == 1
    assert c1.id in project.gc(older_than=timedelta(0), keep_days=0).expired_commits
    assert set(media) <= set(store.list(f"{project.prefix}/media"))  # e0's stream kept
    with pytest.raises(td.ExpiredCommit, match=rf"table 'v' at commit {c1.id[:8]}"):
        StreamIndexes().load(old, "cam", [0])  # a take of the stream index rows

"""Readers sized for DROID (issue 13, part 3): a reader's video index is bounded and
compact, and a table version's episode index is stored once and read, not rebuilt from
a scan of the whole ``frame`` column (no timings here; ``bench/case_scale.py`` times it).
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import treadle as td
import treadle.table.episodes as episodes_mod
import treadle.table.write as write_mod
from treadle.errors import CorruptData
from treadle.read.columns import output_columns
from treadle.read.sample_reader import SampleReader


@pytest.fixture
def scans(monkeypatch):
    """How many rows the episode rules were run over (every episode index scan calls
    ``episode_runs``): wraps it where the old and the new read paths look it up."""
    seen: list[int] = []
    real = episodes_mod.episode_runs

    def counting(episodes, frames, *a, **k):
        seen.append(len(frames))
        return real(episodes, frames, *a, **k)

    monkeypatch.setattr(episodes_mod, "episode_runs", counting)
    try:
        import treadle.table.episode_store as store
    except ImportError:  # the code before the stored index
        return seen
    monkeypatch.setattr(store, "episode_runs", counting)
    return seen


def scan_episode_index(table):
    """The reference: the rules run over the table's whole ``episode``/``frame`` columns."""
    cols = table.to_arrow(["episode", "frame"])
    return episodes_mod.episode_runs(cols["episode"], cols["frame"], "ref", CorruptData)


def _same(a, b) -> None:
    assert a.names == b.names
    assert np.array_equal(a.starts, b.starts) and a.starts.dtype == np.int64
    assert np.array_equal(a.lengths, b.lengths) and a.lengths.dtype == np.int64


def _episode(i: int, n: int) -> dict:
    return {"a": np.arange(n, dtype=np.int32) + 1000 * i, "s": np.full(n, i, np.float32)}


def _write_history(root: str, opts=None) -> tuple[td.Project, list[str]]:
    """Single-episode commits (compacted as they go), multi-episode appends, a
    transaction of several episodes: commit ids in order."""
    project = td.Client(root, storage_options=opts, create=opts is None).project("p")
    t = project.branch().table("t")
    commits = [t.append_episode(_episode(i, 3 + i % 7), episode=f"e{i}").id for i in range(12)]
    rows = {"episode": [], "frame": [], "a": [], "s": []}
    for k, n in enumerate([5, 1, 9, 2]):
        rows["episode"] += [f"m{k}"] * n
        rows["frame"] += list(range(n))
        rows["a"] += [k] * n
        rows["s"] += [0.5] * n
    commits.append(t.append(rows).id)
    with project.branch().transaction("three") as tx:
        for i in range(3):
            tx.table("t").append_episode(_episode(i, 4), episode=f"x{i}")
    commits.append(tx.commit.id)
    return project, commits


def test_episode_index_is_stored_with_each_commit_and_read_not_rescanned(any_root, scans):
    root, opts = any_root
    _, commits = _write_history(root, opts)
    fresh = td.Client(root, storage_options=opts).project("p")
    t = fresh.branch().table("t")
    scans.clear()
    got = [t.at(c).episodes() for c in commits]
    # before: every version's index was rebuilt from its whole frame column
    # (14 scans over 14 + 25 + ... rows)
    assert scans == [], scans
    for c, idx in zip(commits, got):
        _same(idx, scan_episode_index(t.at(c)))
    assert got[-1].names[-3:] == ["x0", "x1", "x2"]
    assert len(got[-1]) == 12 + 4 + 3
    assert len(t.pin().dataset.get_fragments()) < 12  # the history was compacted


def test_episodes_that_span_fragments_join_exactly(local_root, monkeypatch, scans):
    """Fragments cut inside episodes (small files): the stored runs join back to the
    same index a whole-column scan gives, before and after compaction."""
    real = write_mod.write_fragments
    monkeypatch.setattr(
        write_mod, "write_fragments", lambda *a, **k: real(*a, max_rows_per_file=7, **k)
    )
    project = td.Client(local_root, create=True).project("p")
    t = project.branch().table("t")
    rows = {"episode": [], "frame": [], "a": []}
    for k, n in enumerate([10, 3, 15, 1, 8]):
        rows["episode"] += [f"m{k}"] * n
        rows["frame"] += list(range(n))
        rows["a"] += [k] * n
    c1 = t.append(rows).id
    c2 = t.append_episode({"a": np.arange(20)}, episode="long").id
    for c in (c1, c2):
        pinned = td.Client(local_root).project("p").branch().table("t").at(c)
        assert len(pinned.dataset.get_fragments()) > 1
        scans.clear()
        idx = pinned.episodes()
        assert scans == []
        _same(idx, scan_episode_index(pinned))
    assert idx.names[-1] == "long" and int(idx.lengths[-1]) == 20
    firsts = [
        json.loads(o.read_bytes().split(b"\n", 1)[1])["first_frame"] for o in _objects(local_root)
    ]
    assert max(firsts) > 0  # some fragment starts inside an episode


def _objects(root: str) -> list:
    from pathlib import Path

    return sorted((Path(root) / "projects/p/episodes/t").glob("*.json"))


def test_table_without_stored_index_reads_the_same_and_is_indexed_once(local_root, scans):
    """A table written before treadle stored episode indexes (no objects): computed once,
    from each fragment alone, stored; the next reader scans nothing."""
    _, commits = _write_history(local_root)
    expected = [scan_episode_index(td.Client(local_root).project("p").branch().table("t").at(c))
                for c in commits]  # fmt: skip
    for p in _objects(local_root):
        p.unlink()
    scans.clear()
    t = td.Client(local_root).project("p").branch().table("t")
    for c, e in zip(commits, expected):
        _same(t.at(c).episodes(), e)
    assert scans and sum(scans) <= sum(len(x.names) * 10 for x in expected)
    assert _objects(local_root)  # before: nothing was stored
    scans.clear()
    t = td.Client(local_root).project("p").branch().table("t")
    for c, e in zip(commits, expected):
        _same(t.at(c).episodes(), e)
    assert scans == []


def _tamper(path, edit, keep_crc: bool) -> None:
    """Rewrite a stored object: ``edit`` its fields; a new checksum unless ``keep_crc``."""
    crc, body = path.read_bytes().split(b"\n", 1)
    d = json.loads(body)
    edit(d)
    new = json.dumps(d).encode()
    path.write_bytes((crc if keep_crc else b"%08x" % zlib.crc32(new)) + b"\n" + new)


def _more(d: dict) -> None:
    d["lengths"] = [n + 1 for n in d["lengths"]]


@pytest.mark.parametrize(
    "edit, keep_crc, message",
    [
        (lambda d: d.update(lengths=d["lengths"][::-1]), True, "checksum mismatch"),
        (_more, False, "do not add up"),
        (lambda d: (_more(d), d.update(rows=sum(d["lengths"]))), False, "rows, the fragment"),
        (lambda d: d.update(file="another.lance"), False, "another.lance"),
    ],
)
def test_a_tampered_stored_index_is_a_named_error_never_other_episodes(
    local_root, edit, keep_crc, message
):
    project = td.Client(local_root, create=True).project("p")
    t = project.branch().table("t")
    for i in range(4):
        t.append_episode(_episode(i, 3 + i), episode=f"e{i}")  # compacts into one fragment
    (obj,) = [p for p in _objects(local_root) if p.name.startswith(
        t.pin().dataset.get_fragments()[0].metadata.files[0].path)]  # fmt: skip
    _tamper(obj, edit, keep_crc)
    with pytest.raises(CorruptData, match=message) as err:
        td.Client(local_root).project("p").branch().table("t").pin().episodes()
    assert "table 't' of project 'p'" in str(err.value)
    assert obj.name in str(err.value)
    obj.unlink()  # what the message says to do: recomputed from the table
    _same(td.Client(local_root).project("p").branch().table("t").pin().episodes(),
          scan_episode_index(t.pin()))  # fmt: skip


def _video_project(root: str, episodes: int, frames: int) -> td.Branch:
    rng = np.random.default_rng(0)
    branch = td.Client(root, create=True).project("p").branch()
    with branch.transaction("video") as tx:
        for e in range(episodes):
            tx.table("t").append_episode(
                {
                    "cam": td.VideoFrames(
                        rng.integers(0, 255, (frames, 16, 16, 3), np.uint8), fps=30
                    ),
                    "a": np.arange(frames, dtype=np.float32),
                },
                episode=f"e{e}",
            )
    return branch


def test_reader_holds_at_most_32_bytes_per_frame_of_video_index(local_root):
    episodes, frames = 12, 250
    branch = _video_project(local_root, episodes, frames)
    recipe = td.Recipe(
        seed=1,
        batch_size=24,
        components=[td.Component(branch.table("t"), td.Windows({"cam": td.Video([0, 1])}))],
    )
    plan = recipe.plan()
    reader = SampleReader([plan.table(0)], output_columns(plan))
    try:
        seen: set[int] = set()
        for step in range(40):
            batch = plan.batch(step, 0, 1)
            seen.update(reader.read(batch.component, batch.moment)["_episode"].tolist())
            if len(seen) == episodes:
                break
        assert len(seen) == episodes
        cache = reader._streams  # noqa: SLF001 (the reader's stream index cache)
        # before: the whole video column stayed in every reader, ~200 bytes a frame
        assert cache.resident_frames() == episodes * frames
        assert cache.resident_bytes() <= 32 * cache.resident_frames(), cache.resident_bytes()
    finally:
        reader.close()


def test_reader_video_index_cache_is_bounded(local_root):
    from treadle.read.stream_index import StreamIndexes

    branch = _video_project(local_root, 6, 40)
    table = branch.table("t").pin()
    cache = StreamIndexes(max_frames=100)
    for e in range(6):
        key, index = cache.lookup(table, "cam", e)
        assert len(index) == 40 and key.startswith("media/t/")
        assert cache.resident_frames() <= 100
    assert cache.resident_frames() == 80  # the two latest episodes
    again = cache.load(table, "cam", [0, 5])
    assert sorted(again) == [0, 5] and cache.resident_frames() <= 100


def test_reader_video_index_cache_is_bounded_in_episodes_too(local_root):
    # short episodes: ~0.7 KB of object and array headers each, whatever their frames;
    # 2**18 frames of 4-frame episodes were ~65k episodes, ~60 MB (issue 33)
    from treadle.read.stream_index import DEFAULT_MAX_FRAMES, StreamIndexes

    assert StreamIndexes().max_episodes == DEFAULT_MAX_FRAMES // 32
    table = _video_project(local_root, 6, 40).table("t").pin()
    cache = StreamIndexes(max_frames=10_000, max_episodes=2)
    for e in range(6):
        assert len(cache.lookup(table, "cam", e)[1]) == 40
        assert cache.resident_frames() <= 80
    assert cache.resident_frames() == 80  # the two latest episodes, far under max_frames
    assert sorted(k[-1] for k in cache._items) == [4, 5]  # noqa: SLF001

"""The frame sizes of video columns, recorded per episode when written
(:mod:`treadle.table.frame_sizes`): a plan checks what the episodes it reaches decode to
without reading the video index; deletes, purges and merges keep the record right, and a
table written before the record was kept is planned from its index, as before."""

from __future__ import annotations

import logging

import lance
import pytest
import torch

import treadle as td
from test_video_adversarial import _cams, _plan
from treadle import fastpaths
from treadle.errors import PlanError
from treadle.table import frame_sizes, write
from treadle.table.frame_sizes import VIDEO_SIZES_KEY, merge_frame_sizes, recorded_frame_sizes
from treadle.video._testing import synthetic_frames

CAM = td.Windows({"cam": td.Video([0])})
VIDEO = {"cam", "wrist"}  # the video columns these tests name


@pytest.fixture
def takes(monkeypatch):
    """The row counts of every Lance take that reads a video column's index."""
    asked, real = [], lance.LanceDataset.take

    def take(self, indices, columns=None, **kw):
        if columns and any(str(c).split(".")[0] in VIDEO for c in columns):
            asked.append(len(indices))
        return real(self, indices, columns=columns, **kw)

    monkeypatch.setattr(lance.LanceDataset, "take", take)
    return asked


def _held(t: td.TableRef) -> dict:
    return recorded_frame_sizes(t.pin().schema)["cam"]["held"]


def test_the_plan_reads_no_index_rows_when_sizes_are_recorded(tmp_path, takes):
    # before: a take of every reached episode's first row at every plan
    branch = _cams(tmp_path, {"a": ("t", (48, 64)), "b": ("t", (32, 48)), "c": ("t", (48, 64))})
    t = branch.table("t")
    assert _held(t) == {"64x48": ["a", "c"], "48x32": ["b"]}
    with pytest.raises(PlanError, match=r"48x64 .*episode 'a'.*32x48 .*episode 'b'"):
        _plan(td.Component(t, CAM))
    _plan(td.Component(t, CAM, episodes=["a", "c"]))
    _plan(td.Component(t, CAM, episodes=["b"]))
    assert takes == []


def test_sizes_past_the_listed_episodes_are_told_apart_without_reads(tmp_path, takes, monkeypatch):
    monkeypatch.setattr(frame_sizes, "MAX_NAMES", 2)
    sizes = {f"e{i}": ("t", (32, 48)) for i in range(5)}
    branch = _cams(tmp_path, {**sizes, "odd": ("t", (48, 64)), "e5": ("t", (32, 48))})
    t = branch.table("t")
    rec = recorded_frame_sizes(t.pin().schema)["cam"]
    assert rec["more"] == ["48x32"] and rec["held"]["64x48"] == ["odd"]
    with pytest.raises(PlanError, match=r"32x48 .*episode 'e0'.*48x64 .*episode 'odd'"):
        _plan(td.Component(t, CAM))
    _plan(td.Component(t, CAM, episodes=["e3", "e4", "e5"]))
    assert takes == []
    t.delete_episodes(["odd"])
    assert "64x48" not in _held(t)
    _plan(td.Component(t, CAM))
    assert takes == []


def test_a_table_written_before_the_record_is_planned_from_its_index(
    tmp_path, takes, monkeypatch, caplog
):
    monkeypatch.setattr(fastpaths, "_OFF", {})
    caplog.set_level(logging.WARNING, logger="treadle")
    with monkeypatch.context() as m:  # written as an earlier treadle did: no record
        m.setattr(write, "with_frame_sizes", lambda schema, rows, fresh: schema)
        branch = _cams(tmp_path, {"a": ("t", (48, 64)), "b": ("t", (48, 64))})
    # this treadle appends to it: a record of 'c' alone would miss 'a' and 'b'
    clip = td.VideoFrames(synthetic_frames(6, 32, 48, seed=9), fps=10)
    branch.table("t").append_episode({"cam": clip}, episode="c")
    t = branch.table("t")
    assert VIDEO_SIZES_KEY not in (t.pin().schema.metadata or {})
    with pytest.raises(PlanError, match=r"48x64 .*episode 'a'.*32x48 .*episode 'c'"):
        _plan(td.Component(t, CAM))
    assert takes == [3]
    assert [r for r in caplog.records if "recorded video sizes is off" in r.getMessage()]
    path = td.info().paths["recorded video sizes"]
    assert not path.on and "table 't', column 'cam'" in path.reason


def test_a_purge_takes_the_names_out_of_every_versions_record(tmp_path, takes):
    project = td.Client(str(tmp_path)).project("p")
    _cams(tmp_path, {"secret": ("t", (32, 48)), "kept": ("t", (48, 64))})
    t = project.branch().table("t")
    project.purge("t", ["secret"], reason="consent withdrawn")
    ds = lance.dataset(t.pin().uri)
    for v in ds.versions():
        meta = lance.dataset(t.pin().uri, version=v["version"]).schema.metadata or {}
        assert b"secret" not in meta.get(VIDEO_SIZES_KEY, b"")
    assert _held(t) == {"64x48": ["kept"]}
    _plan(td.Component(t, CAM, episodes=["kept"]))
    assert takes == []


def test_a_merge_keeps_both_sides_sizes(tmp_path, takes):
    branch = _cams(tmp_path, {"a": ("t", (48, 64))})
    project = td.Client(str(tmp_path)).project("p")
    side = project.create_branch("side", from_="main")
    clip = td.VideoFrames(synthetic_frames(6, 32, 48, seed=3), fps=10)
    side.table("t").append_episode({"cam": clip}, episode="s")
    clip = td.VideoFrames(synthetic_frames(6, 48, 64, seed=4), fps=10)
    branch.table("t").append_episode({"cam": clip}, episode="m")
    project.merge("side", into="main")
    t = project.branch().table("t")
    assert _held(t) == {"64x48": ["a", "m"], "48x32": ["s"]}
    with pytest.raises(PlanError, match=r"32x48 .*episode 's'"):
        _plan(td.Component(t, CAM))
    assert takes == []


def test_a_merge_with_a_side_that_recorded_nothing_records_nothing():
    # the side without a record holds rows the record would not cover
    import pyarrow as pa

    from treadle.table.tensors import KIND_KEY

    field = pa.field("cam", pa.struct([("width", pa.int32()), ("height", pa.int32())]),
                     metadata={KIND_KEY: b"video"})  # fmt: skip
    mine = pa.schema([field], metadata={VIDEO_SIZES_KEY: b'{"cam":{"held":{},"more":[]}}'})
    assert recorded_frame_sizes(merge_frame_sizes(mine, pa.schema([field]))) == {}
    assert recorded_frame_sizes(merge_frame_sizes(pa.schema([field]), mine)) == {}
    other = pa.schema([pa.field("x", pa.int32())])  # no such column there: kept
    assert recorded_frame_sizes(merge_frame_sizes(mine, other)) == {"cam": {"held": {}, "more": []}}


def test_a_scan_of_two_frame_sizes_says_what_it_takes_and_takes_size(tmp_path, takes):
    # before: the first batch that met both sizes said "give the Video spec a size=(H, W)",
    # which a ScanDataset has no way to take
    branch = _cams(tmp_path, {"a": ("t", (48, 64)), "b": ("t", (32, 48)), "c": ("t", (48, 64))})
    t = branch.table("t").pin()
    with pytest.raises(PlanError, match=r"48x64 .*episode 'a'.*32x48 .*episode 'b'") as e:
        td.ScanDataset(t.scan_request(["cam"]), batch_size=4)
    assert "ScanDataset size=(H, W)" in str(e.value) and "filter=" in str(e.value)
    assert takes == []  # from the record
    batches = list(td.ScanDataset(t.scan_request(["cam"]), batch_size=18, size=(24, 32)))
    assert [b["cam"].shape for b in batches] == [(18, 24, 32, 3)]
    named = td.ScanDataset(t.scan_request(["cam"]), batch_size=18, size={"cam": (24, 32)})
    assert torch.equal(next(iter(named))["cam"], batches[0]["cam"])
    one = td.ScanDataset(t.scan_request(["cam"], filter="episode != 'b'"), batch_size=12)
    assert next(iter(one))["cam"].shape == (12, 48, 64, 3)
    with pytest.raises(PlanError, match=r"names \['frame'\], which are not video columns"):
        td.ScanDataset(t.scan_request(["cam", "frame"]), batch_size=4, size={"frame": (2, 2)})


def test_an_append_rebased_past_a_delete_and_a_rename_keep_the_record_right(tmp_path, takes):
    branch = _cams(tmp_path, {"a": ("t", (48, 64)), "odd": ("t", (32, 48))})
    t = branch.table("t")
    with branch.transaction("late append") as tx:
        clip = td.VideoFrames(synthetic_frames(6, 48, 64, seed=5), fps=10)
        tx.table("t").append_episode({"cam": clip}, episode="late")
        t.delete_episodes(["odd"])  # lands first: the rebased append must not bring it back
    assert _held(t) == {"64x48": ["a", "late"]}
    t.rename_columns({"cam": "wrist"})
    rec = recorded_frame_sizes(t.pin().schema)
    assert list(rec) == ["wrist"] and rec["wrist"]["held"] == {"64x48": ["a", "late"]}
    _plan(td.Component(t, td.Windows({"wrist": td.Video([0])})))
    assert takes == []


def test_a_video_episode_appended_after_a_drop_records_its_size(tmp_path, takes):
    # each new episode's name changes the record (the schema's metadata); after a column
    # was dropped (field ids no longer 0..n-1) such a write was refused: "compact() first"
    branch = td.Client(str(tmp_path)).project("p").branch()
    clip = td.VideoFrames(synthetic_frames(6, 48, 64, seed=1), fps=10)
    branch.table("t").append_episode({"x": [0.0] * 6, "cam": clip}, episode="a")
    t = branch.table("t")
    t.drop_columns(["x"])
    clip = td.VideoFrames(synthetic_frames(6, 32, 48, seed=2), fps=10)
    t.append_episode({"cam": clip}, episode="b")
    assert _held(t) == {"64x48": ["a"], "48x32": ["b"]}
    with pytest.raises(PlanError, match=r"32x48 .*episode 'b'"):
        _plan(td.Component(t, CAM))
    assert takes == []

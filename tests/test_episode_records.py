"""What a version's schema records of its episodes (off-grid videos, image sizes) leaves
with them: ``delete_episodes`` and ``project.purge`` take the deleted episodes' entries
out, so a plan no longer refuses for them nor names them, and purged names are gone from
every version's record. Records written by an earlier treadle still plan as before."""

from __future__ import annotations

import io
import json

import lance
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import treadle as td
from test_video_frame_grid import CFR_MS, VFR_MS, _file, _plan
from treadle.errors import PlanError
from treadle.table import off_grid
from treadle.table.image_sizes import IMAGES_KEY, recorded_images
from treadle.table.off_grid import OFF_GRID_KEY, recorded_off_grid

WIDE_MS = [0, 33, 67, 500, 533, 567, 600, 633, 667, 700, 733, 767]  # 0.4 s off
SECRET = "subject-4411-withdrawn"


def _cams(root, videos: dict[str, list[int]]) -> td.TableRef:
    branch = td.Client(root).project("p").branch()
    for name, times in videos.items():
        branch.table("cams").append_episode({"cam": td.VideoFile(_file(times))}, episode=name)
    return branch.table("cams")


def test_deleting_the_variable_frame_rate_episode_lifts_the_refusal(tmp_path):
    # before: the record still named 'phone' after its deletion, and the plan was refused
    t = _cams(str(tmp_path), {"steady": CFR_MS, "phone": VFR_MS})
    with pytest.raises(PlanError, match="episode 'phone'"):
        _plan(t, td.Video(seconds=[0.0, 0.1]))
    t.delete_episodes(["phone"])
    assert recorded_off_grid(t.pin().schema) == {}
    plan = _plan(t, td.Video(seconds=[0.0, 0.1]))
    assert plan.record.components[0].windows["cam"].offsets == (0, 3)


def test_deleting_the_furthest_off_episode_names_the_next(tmp_path):
    # before: the error went on naming 'far' (0.4 s), which the version no longer has
    t = _cams(str(tmp_path), {"near": VFR_MS, "far": WIDE_MS, "steady": CFR_MS})
    t.delete_episodes(["far"])
    rec = recorded_off_grid(t.pin().schema)["cam"]
    assert rec["episode"] == "near" and rec["deviation_s"] < 0.2
    assert list(rec["episodes"]) == ["near"]
    with pytest.raises(PlanError, match="episode 'near'") as e:
        _plan(t, td.Video(seconds=[0.0, 0.1]))
    assert "far" not in str(e.value)


def test_the_record_names_the_furthest_off_episodes_and_bounds_the_others(monkeypatch):
    from treadle.table.off_grid import off_grid_without

    monkeypatch.setattr(off_grid, "MAX_EPISODES", 2, raising=False)
    schema = pa.schema([pa.field("cam", pa.int64())])
    for name, dev in (("a", 0.3), ("b", 0.1), ("c", 0.2), ("d", 0.05)):
        schema = off_grid.with_off_grid(schema, "cam", dev, name)
    rec = json.loads(schema.metadata[OFF_GRID_KEY])["cam"]
    assert rec["episodes"] == {"a": 0.3, "c": 0.2} and rec["more_s"] == 0.1
    assert rec["more_episode"] == "b" and len(rec["episodes"]) == 2
    after = pa.schema(schema, metadata={OFF_GRID_KEY: off_grid_without(schema, ["a", "c"])})
    got = recorded_off_grid(after)["cam"]
    assert (got["deviation_s"], got["episode"]) == (0.1, "b")
    gone = pa.schema(schema, metadata={OFF_GRID_KEY: off_grid_without(schema, ["a", "b", "c"])})
    got = recorded_off_grid(gone)["cam"]  # b's bound stays over d (unknown), unnamed
    assert (got["deviation_s"], got["episode"]) == (0.1, None)


def _old_with_off_grid(schema, column, deviation_s, episode):
    """The record as treadle wrote it before it kept one entry per episode."""
    rec = json.loads((schema.metadata or {}).get(OFF_GRID_KEY) or "{}")
    if deviation_s > 0 and (column not in rec or deviation_s > rec[column]["deviation_s"]):
        rec[column] = {"deviation_s": float(deviation_s), "episode": episode}
        return schema.with_metadata({**(schema.metadata or {}), OFF_GRID_KEY: json.dumps(rec)})
    return schema


def _old_merge_off_grid(schema, other):
    for col, rec in json.loads((other.metadata or {}).get(OFF_GRID_KEY) or "{}").items():
        schema = _old_with_off_grid(schema, col, rec["deviation_s"], rec["episode"])
    return schema


def test_an_earlier_treadles_record_plans_the_same_and_a_delete_keeps_its_bound(
    tmp_path, monkeypatch
):
    import treadle.table.schema_records as records
    import treadle.table.write as write

    monkeypatch.setattr(write, "with_off_grid", _old_with_off_grid)
    monkeypatch.setattr(write, "merge_off_grid", _old_merge_off_grid)
    monkeypatch.setattr(records, "merge_off_grid", _old_merge_off_grid)
    t = _cams(str(tmp_path), {"near": VFR_MS, "far": WIDE_MS, "steady": CFR_MS})
    monkeypatch.undo()
    raw = json.loads(t.pin().schema.metadata[OFF_GRID_KEY])
    assert set(raw["cam"]) == {"deviation_s", "episode"}  # the earlier form
    with pytest.raises(PlanError, match="episode .far. shows its frames up to 0.3998"):
        _plan(t, td.Video(seconds=[0.0, 0.1]))
    t.delete_episodes(["far"])  # 'near' is off too, by less: the old record cannot say
    with pytest.raises(PlanError, match="up to 0.3998") as e:
        _plan(t, td.Video(seconds=[0.0, 0.1]))
    assert "'far'" not in str(e.value) and "did not name" in str(e.value)
    assert "far" not in t.pin().schema.metadata[OFF_GRID_KEY].decode()


def _png(h: int, w: int) -> bytes:
    b = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(b, format="PNG")
    return b.getvalue()


def _images(root, sizes: dict[str, tuple[int, int]]) -> td.TableRef:
    t = td.Client(root).project("p").branch().table("imgs")
    for name, (h, w) in sizes.items():
        t.append_episode({"rgb": [_png(h, w)] * 3, "a": np.zeros(3, np.float32)}, episode=name)
    return t


def _plan_images(t):
    comp = td.Component(t, td.Windows({"rgb": td.Video([0])}))
    return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()


def test_deleting_the_one_episode_of_another_size_lifts_the_refusal(tmp_path):
    # before: the record kept 'odd' and its size: the plan still asked for size=
    t = _images(str(tmp_path), {"a": (16, 16), "odd": (8, 24), "b": (16, 16)})
    with pytest.raises(PlanError, match="more than one size"):
        _plan_images(t)
    t.delete_episodes(["odd"])
    rec = recorded_images(t.pin().schema)["rgb"]
    assert [s[:2] for s in rec["sizes"]] == [[16, 16]] and "odd" not in json.dumps(rec)
    batch = next(iter(td.TrainLoader(_plan_images(t), steps=1)))
    assert tuple(batch["rgb"].shape[-3:]) == (16, 16, 3)


def test_deleting_the_first_episode_of_a_size_names_another(tmp_path):
    t = _images(str(tmp_path), {"a": (16, 16), "w1": (8, 24), "w2": (8, 24)})
    t.delete_episodes(["w1"])
    with pytest.raises(PlanError, match="episode 'w2'") as e:
        _plan_images(t)
    assert "w1" not in str(e.value)


def _metadata_of_every_version(t: td.TableRef) -> list[bytes]:
    table = t.pin()
    ds = lance.dataset(table.uri)
    out = []
    for v in ds.versions():
        meta = lance.dataset(table.uri, version=v["version"]).schema.metadata or {}
        out.append(meta.get(OFF_GRID_KEY, b"") + meta.get(IMAGES_KEY, b""))
    return out


def test_a_purge_takes_the_names_out_of_every_versions_records(tmp_path):
    # before: every version's off-grid and image records still named the purged episode
    root = str(tmp_path)
    project = td.Client(root).project("p")
    branch = project.branch()
    for name, times, size in ((SECRET, VFR_MS, (8, 24)), ("kept", CFR_MS, (16, 16))):
        branch.table("t").append_episode(
            {"cam": td.VideoFile(_file(times)), "rgb": [_png(*size)] * 12}, episode=name
        )
    t = branch.table("t")
    assert any(SECRET.encode() in m for m in _metadata_of_every_version(t))
    project.purge("t", [SECRET], reason="consent withdrawn")
    assert not [m for m in _metadata_of_every_version(t) if SECRET.encode() in m]
    assert recorded_off_grid(t.pin().schema) == {}
    assert [s[:2] for s in recorded_images(t.pin().schema)["rgb"]["sizes"]] == [[16, 16]]


def test_an_append_staged_before_a_delete_does_not_bring_its_entry_back(tmp_path):
    # before: the append, rebased on the head that deleted 'phone', merged its base's
    # record (which named 'phone') into the head's, and the plan was refused again
    t = _cams(str(tmp_path), {"phone": VFR_MS, "steady": CFR_MS})
    branch = td.Client(str(tmp_path)).project("p").branch()
    with branch.transaction("late append") as tx:
        tx.table("cams").append_episode({"cam": td.VideoFile(_file(WIDE_MS))}, episode="late")
        t.delete_episodes(["phone"])  # lands first
    assert list(t.pin().episodes().names) == ["steady", "late"]
    rec = recorded_off_grid(t.pin().schema)["cam"]
    assert list(rec["episodes"]) == ["late"] and rec["episode"] == "late"


def test_a_size_an_update_wrote_stays_after_its_listed_episodes_go(tmp_path):
    t = _images(str(tmp_path), {"a": (16, 16), "odd": (8, 24), "b": (16, 16)})
    t.update({"rgb": _png(8, 24)}, where="episode = 'a' AND frame = 0")
    t.delete_episodes(["odd"])  # 'a' holds an 8x24 image still
    with pytest.raises(PlanError, match="more than one size"):
        _plan_images(t)


def test_a_size_an_earlier_treadle_added_is_kept_by_a_delete():
    from treadle.table.image_sizes import images_without

    rec = {"format": "PNG", "more": False, "sizes": [[16, 16, "a"], [24, 8, "odd"], [8, 8, "x"]],
           "names": {"16x16": ["a", "b"], "24x8": ["odd"]}, "names_more": []}  # fmt: skip
    schema = pa.schema([pa.field("rgb", pa.binary())], metadata={IMAGES_KEY: json.dumps(
        {"rgb": rec})})  # fmt: skip
    left = json.loads(images_without(schema, ["odd", "x"]))["rgb"]
    assert left["sizes"] == [[16, 16, "a"], [8, 8, None]]  # 8x8's other holders: unknown

"""Tables that change, attacked: what a version records of a column by its name follows a
renamed column (and leaves with a dropped one), and ``plan.stats`` of a run that leaves a
table's null rows out of its windows."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import treadle as td
from test_video_frame_grid import CFR_MS, VFR_MS, _file
from treadle.errors import PlanError
from treadle.table.image_sizes import recorded_images
from treadle.table.null_columns import recorded_nulls
from treadle.table.off_grid import recorded_off_grid


def _plan(table, windows, **kw) -> td.Plan:
    comp = td.Component(table, td.Windows(windows), weight=1.0, **kw)
    return td.Recipe(seed=0, batch_size=4, components=[comp]).plan()


def test_a_renamed_off_grid_video_is_still_refused_in_seconds(tmp_path):
    # before: the record stayed under "cam", so Video(seconds=...) over "camera" planned and
    # anchor frame 0 + 0.1 s delivered frame 3 (shown at 0.15 s), not frame 2 (at 0.067 s)
    t = td.Client(str(tmp_path)).project("p").branch().table("cams")
    for name, times in (("steady", CFR_MS), ("phone", VFR_MS)):
        t.append_episode({"cam": td.VideoFile(_file(times))}, episode=name)
    t.add_column("ok", {"steady": True}, default=False)
    t.rename_columns({"cam": "camera"})
    assert list(recorded_off_grid(t.schema)) == ["camera"]
    with pytest.raises(PlanError, match="column 'camera'.*episode 'phone'"):
        _plan(t, {"camera": td.Video(seconds=[0.0, 0.1])})
    t.drop_columns(["camera"])
    assert recorded_off_grid(t.schema) == {}


def test_a_renamed_column_with_a_null_is_refused_when_planned(tmp_path):
    # before: the null record stayed under "x": the plan did not look at "y", and the
    # loader failed at the step that drew the null (CorruptData), not before step 0
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in range(3):
        x = pa.array([None if (e, i) == (2, 3) else float(i) for i in range(6)], pa.float32())
        t.append(pa.table({"episode": [f"e{e}"] * 6, "frame": np.arange(6), "x": x,
                           "k": np.ones(6, np.float32)}))  # fmt: skip
    t.rename_columns({"x": "y"})
    assert recorded_nulls(t.schema) == {"y"}
    with pytest.raises(PlanError, match="column 'y'.*episode 'e2', frame 3"):
        _plan(t, {"y": td.Rows([0])})
    t.drop_columns(["y"])
    assert recorded_nulls(t.schema) == set()


def _png(h: int, w: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_a_renamed_image_column_keeps_its_sizes(tmp_path):
    # before: the sizes stayed under "img"; a plan over "rgb" did not know it holds two
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e, (h, w) in enumerate([(8, 12), (10, 6)]):
        t.append_episode({"img": [_png(h, w)] * 4, "k": np.ones(4, np.float32)}, episode=f"e{e}")
    t.rename_columns({"img": "rgb"})
    assert list(recorded_images(t.schema)) == ["rgb"]
    with pytest.raises(PlanError, match="more than one size"):
        _plan(t, {"rgb": td.Video([0])})
    t.drop_columns(["rgb"])
    assert recorded_images(t.schema) == {}


@pytest.mark.parametrize("leave_out", [{"episodes": ["e0", "e1"]}, {"where": "episode != 'e2'"}])
def test_plan_stats_of_a_run_that_leaves_a_tables_nulls_out(tmp_path, leave_out):
    # before: CorruptData ("column 'a' holds null values") though the run reads none, as
    # the docs' remedy for nulls (leave those moments out) says; the run itself trained
    t = td.Client(str(tmp_path)).project("p").branch().table("t")
    for e in range(3):
        t.append_episode({"x": np.arange(6, dtype=np.float32) + 10 * e}, episode=f"e{e}")
    t.add_column("a", {"e0": 1.5, "e1": 2.0, "e2": 3.0})
    t.update({"a": None}, where="episode = 'e2' AND frame > 1")
    plan = _plan(t, {"a": td.Rows([0, 1]), "x": td.Rows([0])}, **leave_out)
    got = plan.stats(["a", "x"])
    rows = t.to_arrow(["episode", "frame", "a", "x"]).to_pydict()
    anchors = [i for i, (e, f) in enumerate(zip(rows["episode"], rows["frame"], strict=True))
               if e != "e2" and f < 5]  # fmt: skip
    a = np.array([rows["a"][i + o] for i in anchors for o in (0, 1)], np.float64)
    x = np.array([rows["x"][i] for i in anchors], np.float64)
    assert got["a"].count == len(a) and got["x"].count == len(x)
    np.testing.assert_allclose([got["a"].mean, got["a"].min, got["a"].max], [a.mean(), 1.5, 2.0])
    np.testing.assert_allclose(got["x"].mean, x.mean())
    t.update({"a": None}, where="episode = 'e1' AND frame = 5")  # a window reads it
    with pytest.raises(PlanError, match="column 'a'.*episode 'e1', frame 5"):
        _plan(t, {"a": td.Rows([0, 1])}, **leave_out)


@pytest.mark.parametrize("names", [("t", "t"), ("t", "u")])
def test_a_recipe_over_one_project_name_in_two_stores_is_refused(tmp_path, names):
    # before: planned; tables of one name were pinned once, so the second store's component
    # read the first store's rows (silently), and a resume read one store (NotFound)
    refs = []
    for i, name in enumerate(names):
        root = tmp_path / f"store{i}"
        root.mkdir()
        t = td.Client(str(root)).project("p").branch().table(name)
        t.append_episode({"x": np.arange(5, dtype=np.float32) + 100 * i}, episode="e0")
        refs.append(t)
    w = td.Windows({"x": td.Rows([0])})
    recipe = td.Recipe(seed=0, batch_size=2, components=[td.Component(r, w) for r in refs])
    with pytest.raises(PlanError, match="project 'p' of 2 stores"):
        recipe.plan()

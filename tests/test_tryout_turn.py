"""What a new user ran into trying issues 44, 46 and 47's features from the docs."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

import treadle as td
from treadle.cli import main


@pytest.fixture(scope="module")
def grasps(tmp_path_factory):
    """A 5-moment table: a string split into characters would fit it exactly."""
    client = td.Client(str(tmp_path_factory.mktemp("turn") / "root"), create=True)
    ref = client.project("robotics").branch("main").table("grasps")
    ref.append_episode({"x": np.arange(5, dtype=np.float32)}, episode="g-0", fps=10)
    return ref


def test_add_column_refuses_a_string_as_per_moment_values(grasps):
    # before: "hello" was stored one character per moment ('h', 'e', 'l', 'l', 'o')
    before = grasps.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"column 'label'.*got str"):
        grasps.add_column("label", "hello")
    assert grasps.pin().version == before


def test_update_with_a_value_of_another_type_names_the_value_and_the_column_type(grasps):
    # before: "column 'x' has type string: storing it as float ...", though 'x' is float
    with pytest.raises(td.SchemaMismatch) as e:
        grasps.update({"x": "fast"}, where="frame = 1")
    assert "value 'fast'" in str(e.value) and "column 'x' of type float" in str(e.value)


def test_update_with_a_where_that_does_not_parse_is_a_named_error(grasps):
    # before: Lance's ValueError, with a path into Lance's Rust sources and no table name
    before = grasps.pin().version
    with pytest.raises(td.SchemaMismatch) as e:
        grasps.update({"x": 1.0}, where="x >>> 1")
    msg = str(e.value)
    assert "table 'grasps'" in msg and "where='x >>> 1'" in msg and ".rs:" not in msg
    assert grasps.pin().version == before


def test_zarr_import_does_not_log_a_warning_per_imagecodecs_codec(caplog):
    # before: 67 lines "numcodec imagecodecs_... already registered" on every zarr import
    pytest.importorskip("imagecodecs")
    from treadle.importers.zarr.zarr_import import _zarr

    with caplog.at_level(logging.WARNING):
        _zarr()
        _zarr()
    assert not [r for r in caplog.records if "already registered" in r.getMessage()]


@pytest.mark.parametrize(
    ("topics", "match"),
    [
        (
            ["/joint_states:joints"],
            r"--topic takes TOPIC\[:FIELD\]=COLUMN, got '/joint_states:joints'",
        ),
        (["/joint_states=a", "/joint_states=b"], r"--topic /joint_states is given twice"),
    ],
)
def test_ros2_topic_option_errors(tmp_path, capsys, topics, match):
    # before: "takes KEY=VALUE"; a topic given twice silently kept only the last column
    argv = ["import", "ros2", str(tmp_path), "--project", "p", "--table", "t", "--fps", "30"]
    for t in topics:
        argv += ["--topic", t]
    assert main([*argv, "--root", str(tmp_path / "store")]) == 1
    assert re.search(match, capsys.readouterr().err)


def test_hdf5_and_zarr_of_numbers_only_need_no_fps(tmp_path):
    # before: "images='video' needs fps=" for sources that hold no camera at all, which also
    # hid the real error of a damaged file behind it
    h5py, zarr = pytest.importorskip("h5py"), pytest.importorskip("zarr")
    with h5py.File(tmp_path / "state.hdf5", "w") as f:
        for n in range(2):
            f[f"data/demo_{n}/actions"] = np.full((4, 2), n, np.float64)
    buffer = zarr.create_group(str(tmp_path / "state.zarr"), zarr_format=2)
    buffer.create_array("data/state", data=np.arange(10, dtype=np.float32).reshape(5, 2))
    buffer.create_array("meta/episode_ends", data=np.array([2, 5]))
    robots = td.Client(str(tmp_path / "root"), create=True).project("robotics")
    td.importers.hdf5(str(tmp_path / "state.hdf5"), robots, "h", progress=False)
    td.importers.zarr(str(tmp_path / "state.zarr"), robots, "z", progress=False)
    main = robots.branch("main")
    assert main.table("h").pin().num_moments == 8 and main.table("h").pin().fps is None
    assert main.table("z").pin().episodes().names == ["episode_000000", "episode_000001"]
    with h5py.File(tmp_path / "cam.hdf5", "w") as f:
        f["data/demo_0/actions"] = np.zeros((4, 2))
        f["data/demo_0/obs/wrist"] = np.zeros((4, 8, 8, 3), np.uint8)
    with pytest.raises(td.SchemaMismatch, match=r"camera 'obs/wrist'.*--fps"):
        td.importers.hdf5(str(tmp_path / "cam.hdf5"), robots, "c", progress=False)


@pytest.mark.parametrize(
    ("call", "column"),
    [
        (lambda t: t.add_column("mixed2", [1, "x", 2, 3, 4]), "mixed2"),
        (lambda t: t.annotate("mixed3", {"g-0": [(0, 1, 1), (1, 2, "x")]}, frames=True), "mixed3"),
    ],
)
def test_values_of_mixed_types_are_an_error_naming_the_table(grasps, call, column):
    # before: "column 'mixed': cannot store values: ..." with no table or project
    with pytest.raises(td.SchemaMismatch, match=rf"table 'grasps'.*column '{column}'.*str"):
        call(grasps)


def test_a_default_of_another_type_is_refused_before_it_breaks_every_later_append(tmp_path):
    # before: stored as it was; then every append_episode without the column raised
    # pyarrow's "ArrowTypeError: Expected bytes, got a 'int' object"
    ref = td.Client(str(tmp_path / "root"), create=True).project("p").branch("main").table("t")
    ref.append_episode({"x": np.arange(3, dtype=np.float32)}, episode="a", fps=10)
    before = ref.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"table 't'.*column 's'.*default 1.*string"):
        ref.add_column("s", {"a": "hello"}, default=1)
    assert ref.pin().version == before
    ref.add_column("ok", {"a": np.True_}, default=np.False_)  # numpy scalars: plain values
    ref.append_episode({"x": np.arange(2, dtype=np.float32)}, episode="b", fps=10)
    assert ref.to_arrow(["ok"]).column(0).to_pylist() == [True] * 3 + [False] * 2


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    """A 2 s rosbag2 (MCAP) of 100 Hz joint states and one latched task string."""
    pytest.importorskip("rosbags")
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    types = ts.types
    joint_state, string = types["sensor_msgs/msg/JointState"], types["std_msgs/msg/String"]
    header, time = types["std_msgs/msg/Header"], types["builtin_interfaces/msg/Time"]
    path = tmp_path_factory.mktemp("bags") / "run_01"
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        joints = w.add_connection("/joint_states", joint_state.__msgtype__, typestore=ts)
        task = w.add_connection("/task", string.__msgtype__, typestore=ts)
        w.write(task, 1, ts.serialize_cdr(string(data="pick"), string.__msgtype__))
        for i in range(201):
            t = i * 10_000_000 + 5_000_000
            msg = joint_state(
                header=header(stamp=time(sec=t // 10**9, nanosec=t % 10**9), frame_id=""),
                name=["a", "b"], position=np.array([i, -i], float), velocity=np.ones(2),
                effort=np.zeros(0),
            )  # fmt: skip
            w.write(joints, t + 1_000_000, ts.serialize_cdr(msg, joint_state.__msgtype__))
    return path


def _tables(project):
    try:
        return list(project.branch("main").tables())
    except td.NotFound:  # not even the project was written
        return []


def _ros2(bag, tmp_path, **kw):
    robots = td.Client(str(tmp_path / "root"), create=True).project("robotics")
    kw.setdefault("fps", 30)
    kw.setdefault("topics", {"/joint_states": "j", "/task": "task"})
    return td.importers.ros2(str(bag), robots, "t", progress=False, **kw), robots


def test_ros2_a_clock_too_fast_for_memory_is_an_error_before_it_is_made(bag, tmp_path):
    # before: fps=1e9 built 2e9 clock moments as Python ints: the process was killed (OOM)
    with pytest.raises(td.CorruptData, match=r"bag .*run_01: a clock at 1000000000 fps gives"):
        _ros2(bag, tmp_path, fps=1e9)  # (not run against the old code: it takes the memory)
    with pytest.raises(td.CorruptData, match=r"gives 200001 moments over 2\.000 s"):
        _ros2(bag, tmp_path, fps=100_000, max_episode_bytes=1_000_000)


@pytest.mark.parametrize(
    ("column", "clash"),
    [("j_position", "topic /joint_states"), ("j_age_s", "topic /joint_states"),
     ("timestamp", "the clock"), ("frame", "the table")],
)  # fmt: skip
def test_ros2_a_column_two_topics_give_is_an_error(bag, tmp_path, column, clash):
    # before: the task string silently replaced the joint positions (or the timestamps)
    with pytest.raises(td.SchemaMismatch, match=rf"column '{column}' .* also given by {clash}"):
        _ros2(bag, tmp_path, topics={"/joint_states": "j", "/task": column})
    assert _tables(td.Client(str(tmp_path / "root")).project("robotics")) == []


def test_ros2_linear_on_a_latched_string_is_refused(bag, tmp_path):
    # before: accepted, and the string held as if align were "hold"
    with pytest.raises(td.SchemaMismatch, match=r"column 'task'.*interpolates floats only"):
        _ros2(bag, tmp_path, align={"task": "linear"})


def test_renaming_onto_an_existing_column_does_not_suggest_update(grasps):
    # before: "already has column 'x' (use update() to change its values)"
    grasps.add_column("note", {"g-0": "n"})
    with pytest.raises(td.AlreadyExists, match=r"column 'x' \(rename 'note' to a name") as e:
        grasps.rename_columns({"note": "x"})
    assert "update()" not in str(e.value)


def test_a_merge_conflict_names_the_branches(tmp_path):
    # before: "this side did ['update'], the merged side did ['update']"
    project = td.Client(str(tmp_path / "root"), create=True).project("p")
    project.branch("main").table("g").append_episode({"x": np.zeros(3, np.float32)}, episode="a")
    for name, value in (("b1", 1.0), ("b2", 2.0)):
        project.create_branch(name, from_="main").table("g").update({"x": value})
    with pytest.raises(td.MergeConflict) as e:
        project.merge("b1", into="b2")
    msg = str(e.value)
    assert "merging 'b1' into 'b2'" in msg and "'b2' did ['update'], 'b1' did ['update']" in msg


def test_zarr_rename_onto_another_array_is_an_error(tmp_path):
    # before: rename={"state": "action"} imported, and column 'action' held the states
    zarr = pytest.importorskip("zarr")
    buffer = zarr.create_group(str(tmp_path / "b.zarr"), zarr_format=2)
    buffer.create_array("data/state", data=np.zeros((4, 5), np.float32))
    buffer.create_array("data/action", data=np.ones((4, 2), np.float32))
    buffer.create_array("meta/episode_ends", data=np.array([4]))
    robots = td.Client(str(tmp_path / "root"), create=True).project("robotics")
    with pytest.raises(td.SchemaMismatch, match=r"data/action and data/state both become"):
        td.importers.zarr(str(tmp_path / "b.zarr"), robots, "z", rename={"state": "action"},
                          progress=False)  # fmt: skip
    assert _tables(robots) == []


@pytest.mark.parametrize("fmt", ["hdf5", "zarr", "ros2"])
def test_an_infinite_fps_is_a_named_error(tmp_path, fmt):
    # before: ros2 raised OverflowError; hdf5/zarr stored fps=inf on a table with no camera
    with pytest.raises(ValueError, match=r"fps must be"):
        getattr(td.importers, fmt)(str(tmp_path / "nothing"), None, "t", fps=float("inf"),
                                   **({"topics": {"/a": "a"}} if fmt == "ros2" else {}))  # fmt: skip


def test_ros2_fps_may_be_a_numpy_float(bag, tmp_path):
    # before: "fps must be a number or a fraction", for np.float32(30) (a table's fps, say)
    result, _ = _ros2(bag, tmp_path, fps=np.float32(30))
    assert result.rows == 61


def test_ros2_an_unset_stamp_names_the_cli_option_too(tmp_path):
    # before: only the Python form stamp={'/joint_states': 'log'}, which a CLI user cannot type
    pytest.importorskip("rosbags")
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    joint_state, header = ts.types["sensor_msgs/msg/JointState"], ts.types["std_msgs/msg/Header"]
    unset = ts.types["builtin_interfaces/msg/Time"](sec=0, nanosec=0)
    with Writer(tmp_path / "b", version=9, storage_plugin=StoragePlugin.MCAP) as w:
        joints = w.add_connection("/joint_states", joint_state.__msgtype__, typestore=ts)
        for i in range(3):
            msg = joint_state(header=header(stamp=unset, frame_id=""), name=["a"], position=np.zeros(1),
                              velocity=np.zeros(0), effort=np.zeros(0))  # fmt: skip
            w.write(joints, 10**18 + i, ts.serialize_cdr(msg, joint_state.__msgtype__))
    with pytest.raises(td.CorruptData, match=r"\(--stamp /joint_states=log\)"):
        _ros2(tmp_path / "b", tmp_path, topics={"/joint_states": "j"})


def test_hdf5_files_of_different_rates_are_an_error(tmp_path):
    # before: the first file's control_freq (20) was the table's fps; the 10 Hz file's demos
    # were silently labelled 20 Hz
    h5py = pytest.importorskip("h5py")
    (tmp_path / "src").mkdir()
    for name, hz in (("a_task", 20), ("b_task", 10)):
        with h5py.File(tmp_path / "src" / f"{name}.hdf5", "w") as f:
            f["data/demo_0/actions"] = np.zeros((5, 2))
            f["data"].attrs["env_args"] = json.dumps({"env_kwargs": {"control_freq": hz}})
    robots = td.Client(str(tmp_path / "root"), create=True).project("robotics")
    with pytest.raises(td.SchemaMismatch, match=r"a_task.hdf5 names control_freq 20 and .*b_task"):
        td.importers.hdf5(str(tmp_path / "src"), robots, "h", progress=False)
    assert _tables(robots) == []
    td.importers.hdf5(str(tmp_path / "src"), robots, "h", fps=10, progress=False)  # said
    assert robots.branch("main").table("h").pin().fps == 10


def test_a_reserved_column_name_is_refused_on_every_write_path(grasps, tmp_path):
    # before: append, append_episode and every importer stored 'a_is_pad', which collides with
    # the pad mask of a column 'a' in a batch (add_column refused it already)
    before = grasps.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"table 'grasps'.*'x_is_pad'.*reserved"):
        grasps.append_episode({"x": np.zeros(2, np.float32), "x_is_pad": [0, 1]}, episode="r")
    with pytest.raises(td.SchemaMismatch, match=r"table 'grasps'.*'x_dim_mask'.*reserved"):
        grasps.append(
            {"episode": ["r", "r"], "frame": [0, 1], "x": [0.0, 1.0], "x_dim_mask": [1, 1]}
        )
    assert grasps.pin().version == before
    pytest.importorskip("zarr")
    from importer_fixtures import nothing_committed
    from robot_fixtures import make_replay_buffer

    path = make_replay_buffer(tmp_path / "pusht.zarr", lengths=(2, 3))
    project = td.Client(str(tmp_path / "root"), create=True).project("p")
    with pytest.raises(td.SchemaMismatch, match=r"table 't'.*'a_is_pad'.*pad"):
        td.importers.zarr(str(path), project, "t", images="decoded", rename={"state": "a_is_pad"})
    assert nothing_committed(project)


def test_import_progress_on_a_stderr_that_is_not_a_terminal_is_lines(tmp_path, capsys, monkeypatch):
    # before: nothing until the final JSON line (README: "one line per phase otherwise")
    pytest.importorskip("zarr")
    from robot_fixtures import make_replay_buffer
    from treadle.importers.import_progress import Progress

    path = make_replay_buffer(tmp_path / "pusht.zarr", lengths=(2, 3))
    argv = ["--root", str(tmp_path / "root"), "import", "zarr", str(path), "--project", "p"]
    monkeypatch.setattr(Progress, "LINE_EVERY_S", 0.0)  # a line at every update
    assert main([*argv, "--table", "t", "--images", "decoded"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert re.match(r"import zarr: started \(.* kB to read\)$", lines[0]) and "\r" not in "".join(
        lines
    )
    assert len([s for s in lines if re.match(r"import zarr: \d", s)]) >= 2  # per episode
    assert re.match(r"import zarr: done: .* in \d+\.\d s$", lines[-1])
    assert main([*argv, "--table", "u", "--images", "decoded", "--no-progress"]) == 0
    assert "import zarr" not in capsys.readouterr().err


def test_an_error_in_add_columns_fn_names_the_table_the_column_and_the_rows(grasps):
    # before: the bare ZeroDivisionError, naming neither the table nor the rows
    before = grasps.pin().version
    with pytest.raises(td.TreadleError) as e:
        grasps.add_column("a", fn=lambda b: 1 / 0, columns=["x"], batch_rows=2, progress=False)
    msg = str(e.value)
    assert "table 'grasps'" in msg and "column 'a'" in msg and "rows 0..1" in msg
    assert "ZeroDivisionError" in msg and isinstance(e.value.__cause__, ZeroDivisionError)
    assert grasps.pin().version == before and "a" not in grasps.pin().schema.names


def test_dropping_every_data_column_is_refused(tmp_path):
    # before: drop_columns(["x"]) left a table of episode and frame only
    t = td.Client(str(tmp_path), create=True).project("p").branch("main").table("one")
    t.append_episode({"x": np.arange(3, dtype=np.float32)}, episode="e")
    before = t.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"table 'one'.*\['x'\].*no data column"):
        t.drop_columns(["x"])
    assert t.pin().version == before and "x" in t.pin().schema.names


def test_ros2_a_field_of_an_unread_type_names_the_topic_the_field_and_the_type(bag, tmp_path):
    # before: "field of type list is not read", naming no field
    with pytest.raises(td.SchemaMismatch) as e:
        _ros2(bag, tmp_path, topics={"/joint_states:name": "names", "/task": "task"})
    msg = str(e.value)
    assert "topic /joint_states (sensor_msgs/msg/JointState)" in msg
    assert "field 'name' has type list, which is not read" in msg


def test_annotate_without_spans_says_no_spans_were_given(grasps):
    # before: "every value is None: the column's type is unknown"
    before = grasps.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"column 'p': no spans were given \(\{\}\)"):
        grasps.annotate("p", {})
    with pytest.raises(td.SchemaMismatch, match=r"no spans were given"):
        grasps.annotate("p", {"g-0": []})
    assert grasps.pin().version == before


def test_zarr_import_of_a_file_says_it_is_a_file_and_suggests_hdf5(tmp_path, capsys):
    # before: "no Zarr store there (no files)", though the file is right there
    pytest.importorskip("zarr")
    (tmp_path / "lift_ph.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n")
    argv = ["--root", str(tmp_path / "root"), "import", "zarr", str(tmp_path / "lift_ph.hdf5")]
    assert main([*argv, "--project", "p", "--table", "t"]) == 1
    err = capsys.readouterr().err
    assert "lift_ph.hdf5: is a file, not a Zarr store" in err and "treadle import hdf5" in err


def test_import_progress_lines_count_in_plurals_and_say_done_without_a_total(capsys):
    # before: "started (3 episode to read)", "done: 3 episode/3 episode in 0.1 s", and for
    # bytes "done: 1.5 MB/1.6 MB" (a file-size estimate beside what was read: not "stopped")
    from treadle.importers.import_progress import Progress

    bar = Progress(3, "import lerobot", "episode", None)
    bar.update(1)
    bar.update(2)
    bar.close()
    bar = Progress(1, "import x", "sample", None)
    bar.close(ok=False)
    bar = Progress(1_600_000, "import hdf5", "B", None)
    bar.update(1_500_000)
    bar.close()
    lines = [re.sub(r"in \d+\.\d s", "in T", s) for s in capsys.readouterr().err.splitlines()]
    assert lines == [
        "import lerobot: started (3 episodes to read)",
        "import lerobot: done: 3 episodes in T",
        "import x: started (1 sample to read)",
        "import x: stopped (nothing committed) after 0/1 sample in T",
        "import hdf5: started (1.6 MB to read)",
        "import hdf5: done: 1.5 MB in T",
    ]

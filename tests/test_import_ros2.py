"""ROS bag import: bags written by rosbags (rosbag2 MCAP and SQLite, ROS 1) and mcap_ros2,
read back by rosbags' AnyReader; the alignment checked against a brute-force computation."""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from importer_fixtures import nothing_committed
from robot_fixtures import make_rosbag1, make_rosbag2
from treadle.catalog import Client
from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput
from treadle.importers import ros2 as import_ros2
from treadle.table.tensors import to_numpy

pytest.importorskip("rosbags")
from rosbags.highlevel import AnyReader  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

TOPICS = {
    "/joint_states": "joints",
    "/camera/image_raw": "cam",
    "/camera/compressed": "wrist",
    "/depth": "depth",
    "/gripper": "gripper",
    "/pose": "pose",
    "/imu:linear_acceleration": "acc",
    "/task": "task",
}
ALIGN = {"gripper": "next", "acc": "linear"}
MS = 1_000_000


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bags")
    make_rosbag2(folder / "ep_b", "sqlite3", seed=1)
    make_rosbag2(folder / "ep_a", "mcap", seed=0)
    return folder


def _column(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


def _import(src, tmp_path, **kw):
    client = Client(str(tmp_path / "store"), create=True)
    kw = {"topics": TOPICS, "fps": 30, "images": "decoded", "align": ALIGN, **kw}
    res = import_ros2(str(src), client.project("p"), "t", progress=False, **kw)
    return res, client.project("p").branch("main").table("t").pin()


def _raw(bag: Path, topic: str, value, stamp="header"):
    """(times, values) of a topic as rosbags reads it: header stamps (else log times),
    sorted by time, of equal times the last logged."""
    out = []
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as r:
        conns = [c for c in r.connections if c.topic == topic]
        for k, (c, log, raw) in enumerate(r.messages(connections=conns)):
            msg = r.deserialize(raw, c.msgtype)
            h = getattr(msg, "header", None)
            t = (
                h.stamp.sec * 10**9 + h.stamp.nanosec
                if h is not None and stamp == "header"
                else log
            )
            out.append((t, k, value(msg)))
    out.sort(key=lambda x: (x[0], x[1]))
    dedup = {}
    for t, _, v in out:
        dedup[t] = v
    return list(dedup), list(dedup.values())


def _ticks(firsts, lasts, fps: Fraction):
    t0, end, ticks = max(firsts), min(lasts), []
    k = 0
    while t0 + (k * 10**9 * fps.denominator) // fps.numerator <= end:
        ticks.append(t0 + (k * 10**9 * fps.denominator) // fps.numerator)
        k += 1
    return ticks


def _brute(times, values, ticks, align):
    """Per tick, the value and age (s) by the stated rule, the slow way."""
    out, ages = [], []
    for t in ticks:
        before = [i for i, x in enumerate(times) if x <= t]
        if align == "next":
            i = min(i for i, x in enumerate(times) if x > t)
            out.append(values[i])
            ages.append((t - times[i]) / 1e9)
            continue
        if not before:
            out.append(None)
            ages.append(float("nan"))
            continue
        i = before[-1]
        ages.append((t - times[i]) / 1e9)
        if align == "linear" and times[i] != t and i + 1 < len(times):
            w = (t - times[i]) / (times[i + 1] - times[i])
            out.append(
                np.asarray(values[i]) + w * (np.asarray(values[i + 1]) - np.asarray(values[i]))
            )
        else:
            out.append(values[i])
    return out, ages


def _joint_positions(msg):
    d = dict(zip(msg.name, msg.position))
    return np.array([d["j0"], d["j1"], d["j2"]])


READERS = {
    "/joint_states": ("joints_position", _joint_positions),
    "/gripper": ("gripper", lambda m: m.data),
    "/imu": (
        "acc",
        lambda m: np.array(
            [m.linear_acceleration.x, m.linear_acceleration.y, m.linear_acceleration.z]
        ),
    ),  # fmt: skip
    "/pose": (
        "pose",
        lambda m: np.array(
            [m.pose.position.x, m.pose.position.y, m.pose.position.z, 0.0, 0.0, 0.0, 1.0]
        ),
    ),  # fmt: skip
    "/task": ("task", lambda m: m.data),
}


def _check_alignment(t, bag: Path, episode: str, fps: Fraction, align: dict):
    raw = {topic: _raw(bag, topic, fn) for topic, (_, fn) in READERS.items()}
    raw["/camera/image_raw"] = _raw(bag, "/camera/image_raw", lambda m: 0)
    raw["/camera/compressed"] = _raw(bag, "/camera/compressed", lambda m: 0)
    raw["/depth"] = _raw(bag, "/depth", lambda m: 0)
    clocked = {k: v for k, v in raw.items() if len(v[0]) > 1}
    nexts = [
        v[0][-1] - 1 for k, v in clocked.items() if align.get(READERS.get(k, ("",))[0]) == "next"
    ]
    rest = [v[0][-1] for k, v in clocked.items() if align.get(READERS.get(k, ("",))[0]) != "next"]
    ticks = _ticks([v[0][0] for v in clocked.values()], rest + nexts, fps)
    eps = t.episodes()
    i = list(eps.names).index(episode)
    a, b = int(eps.starts[i]), int(eps.starts[i] + eps.lengths[i])
    assert b - a == len(ticks)
    np.testing.assert_array_equal(_column(t, "timestamp")[a:b], (np.array(ticks) - ticks[0]) / 1e9)
    for topic, (col, _) in READERS.items():
        base = col.removesuffix("_position")
        want, ages = _brute(*raw[topic], ticks, align.get(col, align.get(base, "hold")))
        if col == "task":
            got = t.to_arrow(["task"]).column(0).to_pylist()[a:b]
            assert got == want
        else:
            np.testing.assert_allclose(
                _column(t, col)[a:b], np.asarray(want, np.float64), rtol=0, atol=1e-12
            )
        np.testing.assert_allclose(_column(t, f"{base}_age_s")[a:b], ages, rtol=0, atol=1e-9)
    return raw, ticks


@pytest.mark.parametrize("fps", [30, "30000/1001", 7, 200])
def test_alignment_equals_brute_force(bags, tmp_path, fps):
    res, t = _import(bags, tmp_path, fps=fps)
    assert list(t.episodes().names) == ["ep_a", "ep_b"]  # bags in name order
    for ep in ("ep_a", "ep_b"):
        _check_alignment(t, bags / ep, ep, Fraction(str(fps)), ALIGN)
    assert res.episodes == 2 and t.fps == pytest.approx(float(Fraction(str(fps))))


def test_report_counts_messages_used(bags, tmp_path):
    res, t = _import(bags / "ep_a", tmp_path)
    rows = {r["topic"]: r for r in res.topics}
    raw, ticks = _check_alignment(t, bags / "ep_a", "ep_a", Fraction(30), ALIGN)
    times = np.array(raw["/joint_states"][0])
    used = np.bincount(np.searchsorted(times, ticks, side="right") - 1, minlength=times.size)
    r = rows["/joint_states"]
    assert r["messages"] == times.size and r["used_once"] == (used == 1).sum()
    assert r["never_used"] == (used == 0).sum() > r["used_once"]  # 100 Hz on a 30 Hz clock
    assert rows["/depth"]["used_more"] >= 3 and rows["/task"]["latched"]  # 10 Hz held ~3 times
    assert 95 < r["mean_rate_hz"] < 105 and 0.009 < r["largest_gap_s"] < 0.013
    json.dumps(res.topics)  # plain values
    cols = {"/camera/image_raw": "cam", "/camera/compressed": "wrist", "/depth": "depth"}
    for topic, (times, _) in raw.items():  # every topic's counts, the slow way
        align = ALIGN.get(cols.get(topic) or READERS[topic][0], "hold")
        counts = np.zeros(len(times), int)
        for tick in ticks:
            before = [i for i, x in enumerate(times) if x <= tick]
            if align == "next":
                counts[min(i for i, x in enumerate(times) if x > tick)] += 1
                continue
            if before:
                counts[before[-1]] += 1
            if (
                align == "linear"
                and before
                and times[before[-1]] != tick
                and before[-1] + 1 < len(times)
            ):
                counts[before[-1] + 1] += 1
        got = rows[topic]
        assert got["messages"] == len(times), topic
        want = ((counts == 1).sum(), (counts > 1).sum(), (counts == 0).sum())
        assert (got["used_once"], got["used_more"], got["never_used"]) == want, topic


def test_cameras_depth_and_encoded_bytes(bags, tmp_path):
    res, t = _import(bags / "ep_a", tmp_path, images="encoded")
    jpegs = t.to_arrow(["wrist"]).column(0).to_pylist()
    times, data = _raw(bags / "ep_a", "/camera/compressed", lambda m: bytes(m.data))
    assert set(jpegs) <= set(data) and jpegs[0][:2] == b"\xff\xd8"  # the message's bytes
    depth = _column(t, "depth")
    assert depth.dtype == np.uint16 and depth.shape[1:] == (8, 8, 1)
    _, raw_depth = _raw(bags / "ep_a", "/depth", lambda m: np.frombuffer(bytes(m.data), "<u2"))
    assert all(any(np.array_equal(d.reshape(-1), r) for r in raw_depth) for d in depth)
    wrist = next(c for c in res.cameras if c["column"] == "wrist")
    assert wrist["stored_as"] == "encoded" and wrist["stored_bytes"] == sum(map(len, jpegs))


def test_video_reports_psnr(bags, tmp_path):
    res, t = _import(bags / "ep_a", tmp_path, images="video")
    assert sorted(t.video_columns) == ["cam", "wrist"]
    assert {c["column"] for c in res.cameras} == {"cam", "wrist"}
    assert all(c["psnr_min_db"] > 20 and c["stored_as"] == "video" for c in res.cameras)
    assert _column(t, "depth").dtype == np.uint16  # depth is never video


@pytest.mark.parametrize("compression", [None, "bz2", "lz4"])
def test_rosbag1_file(tmp_path, compression):
    bag = make_rosbag1(tmp_path / "run1.bag", compression=compression)
    topics = {"/joint_states": "joints", "/gripper": "gripper", "/task": "task"}
    res, t = _import(bag, tmp_path, topics=topics, align={}, stamp={"/gripper": "log"})
    assert list(t.episodes().names) == ["run1"] and res.rows == t.num_moments > 10
    times, values = _raw(bag, "/joint_states", _joint_positions)
    gtimes, gvalues = _raw(bag, "/gripper", lambda m: m.data, stamp="log")
    ticks = _ticks([times[0], gtimes[0]], [times[-1], gtimes[-1]], Fraction(30))
    want, _ = _brute(times, values, ticks, "hold")
    np.testing.assert_array_equal(_column(t, "joints_position"), np.asarray(want))
    np.testing.assert_array_equal(_column(t, "gripper"), _brute(gtimes, gvalues, ticks, "hold")[0])


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_mcap_file_from_mcap_ros2_writer(tmp_path, compression):
    from mcap.writer import CompressionType
    from mcap_ros2.writer import Writer

    path = tmp_path / "cmds.mcap"
    with open(path, "wb") as f:  # chunks of 200 bytes: they inflate through the capped path
        w = Writer(f, chunk_size=200, compression=CompressionType[compression.upper()])
        schema = w.register_msgdef("std_msgs/msg/Float64", "float64 data")
        tschema = w.register_msgdef("std_msgs/msg/String", "string data")
        w.write_message("/task", tschema, {"data": "wipe"}, log_time=10**9, publish_time=10**9)
        for i in range(20):
            t = 10**9 + i * 50_000_000
            w.write_message("/cmd", schema, {"data": i * 0.5}, log_time=t, publish_time=t)
        w.finish()
    res, t = _import(path, tmp_path, topics={"/cmd": "cmd", "/task": "task"}, align={}, fps=10)
    assert list(t.episodes().names) == ["cmds"]
    np.testing.assert_array_equal(_column(t, "cmd"), np.arange(10) * 1.0)  # every other one
    assert set(t.to_arrow(["task"]).column(0).to_pylist()) == {"wipe"}
    assert res.topics[0]["never_used"] == 10


def _bag_with(tmp_path, name, messages):
    """A tiny rosbag2 (MCAP) from ``(topic, msgtype, log ns, builder(ts))``."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    ts = get_typestore(Stores.ROS2_HUMBLE)
    path = tmp_path / name
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns = {}
        for topic, msgtype, log, build in messages:
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts)
            if build is not None:
                w.write(conns[topic], log, ts.serialize_cdr(build(ts), msgtype))
    return path


def _float(v):
    return lambda ts: ts.types["std_msgs/msg/Float64"](data=v)


def _compressed_depth(ts):
    from robot_fixtures import _header

    return ts.types["sensor_msgs/msg/CompressedImage"](
        header=_header(ts, 10**9), format="16UC1; compressedDepth png", data=np.zeros(4, np.uint8)
    )


def _unstamped(ts):
    from robot_fixtures import _header

    g = ts.types
    pose = g["geometry_msgs/msg/Pose"](
        position=g["geometry_msgs/msg/Point"](x=0.0, y=0.0, z=0.0),
        orientation=g["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
    )
    return g["geometry_msgs/msg/PoseStamped"](header=_header(ts, 0), pose=pose)


def _header_only(ts):
    from robot_fixtures import _header

    return _header(ts, 10**9)


@pytest.mark.parametrize(
    ("topics", "extra", "kw", "error", "match"),
    [
        ({"/nope": "x"}, [], {}, NotFound, r"no topic '/nope' in the bag"),
        ({"/a:nofield": "x"}, [], {}, SchemaMismatch, "has no field 'nofield'"),
        ({"/a": "a", "/empty": "e"}, [("/empty", "std_msgs/msg/Float64", 10**9, None)], {},
         CorruptData, "topic /empty .* has no message"),
        ({"/a": "a", "/d": "d"}, [("/d", "sensor_msgs/msg/CompressedImage", 10**9,
                                   _compressed_depth)], {}, SchemaMismatch, "compressedDepth"),
        ({"/a": "a", "/p": "p"}, [(("/p", "geometry_msgs/msg/PoseStamped", 30 * 10**9 + k, _unstamped))
                                  for k in range(2)], {}, CorruptData, r"stamp=\{'/p': 'log'\}"),
        ({"/a": "a", "/i": "i"}, [("/i", "std_msgs/msg/Int32", 10**9 + k,
                                   lambda ts: ts.types["std_msgs/msg/Int32"](data=1))
                                  for k in range(2)], {"align": {"i": "linear"}}, SchemaMismatch,
         "interpolates floats only"),
        ({"/a": "a", "/h": "h"}, [("/h", "std_msgs/msg/Header", 10**9 + k,
                                   _header_only) for k in range(2)],
         {}, SchemaMismatch, "std_msgs/msg/Header is not read"),
    ],
)  # fmt: skip
def test_named_errors_and_nothing_committed(tmp_path, topics, extra, kw, error, match):
    base = [("/a", "std_msgs/msg/Float64", 10**9 + k * 10**8, _float(k)) for k in range(5)]
    bag = _bag_with(tmp_path, "bad", base + extra)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(error, match=match):
        import_ros2(str(bag), client.project("p"), "t", topics=topics, fps=10, images="decoded",
                    progress=False, **kw)  # fmt: skip
    assert nothing_committed(client.project("p"))


def _joint_state(names, values):
    def build(ts):
        from robot_fixtures import _header

        return ts.types["sensor_msgs/msg/JointState"](
            header=_header(ts, 10**9), name=names, position=np.array(values, np.float64),
            velocity=np.zeros(0), effort=np.zeros(0))  # fmt: skip

    return build


def test_joint_order_is_the_first_bags_in_every_bag(tmp_path):
    folder = tmp_path / "bags"
    folder.mkdir()
    for name, names in (("a", ["x", "y"]), ("b", ["y", "x"])):
        msgs = [("/j", "sensor_msgs/msg/JointState", 10**9 + k * 100 * MS,
                 _joint_state(names, [k if n == "x" else -k for n in names])) for k in range(4)]  # fmt: skip
        _bag_with(folder, name, msgs)
    client = Client(str(tmp_path / "store"), create=True)
    import_ros2(str(folder), client.project("p"), "t", topics={"/j": "j"}, fps=10, stamp="log",
                progress=False)  # fmt: skip
    t = client.project("p").branch("main").table("t").pin()
    pos = _column(t, "j_position")
    np.testing.assert_array_equal(pos[:, 0], -pos[:, 1])  # x then y in both bags
    assert pos[:, 0].tolist() == [0, 1, 2, 3] * 2
    assert t.metadata == {"joint_names": {"j": ["x", "y"]}}
    assert t.column_metadata("j_position") == {"joint_names": ["x", "y"]}
    assert "j_velocity" not in t.schema.names  # no velocities sent: no column
    assert t.column_metadata("j_age_s") == {}
    # a second import with the same joint order appends; another order is refused by name
    more = _bag_with(tmp_path / "more", "c", [("/j", "sensor_msgs/msg/JointState", 10**9 + k * 100 * MS,
                     _joint_state(["x", "y"], [k, -k])) for k in range(3)])  # fmt: skip
    import_ros2(str(more), client.project("p"), "t", topics={"/j": "j"}, fps=10, stamp="log",
                progress=False)  # fmt: skip
    assert client.project("p").branch("main").table("t").num_episodes == 3
    head = client.project("p").branch("main").commit_id
    other = _bag_with(tmp_path / "other", "d", [("/j", "sensor_msgs/msg/JointState", 10**9 + k * 100 * MS,
                      _joint_state(["y", "x"], [k, -k])) for k in range(3)])  # fmt: skip
    with pytest.raises(SchemaMismatch, match=r"'j_position' has joint_names \['x', 'y'\] in the "
                       r"table, \['y', 'x'\] in this write"):  # fmt: skip
        import_ros2(str(other), client.project("p"), "t", topics={"/j": "j"}, fps=10, stamp="log",
                    progress=False)  # fmt: skip
    assert client.project("p").branch("main").commit_id == head


def test_joint_names_are_in_every_joint_columns_metadata(bags, tmp_path):
    _, t = _import(bags / "ep_a", tmp_path, topics={"/joint_states": "joints"}, align={})
    for col in ("joints_position", "joints_velocity"):
        assert t.column_metadata(col) == {"joint_names": ["j0", "j1", "j2"]}
    meta = t.schema.field("joints_position").metadata
    assert json.loads(meta[b"treadle:meta:joint_names"]) == ["j0", "j1", "j2"]
    assert meta[b"treadle:shape"] == b"[3]"  # still a tensor [3]


def test_a_gap_over_five_periods_is_named(tmp_path, caplog):
    times = [0, 10, 20, 30, 200, 210]  # ms: a 170 ms gap on a 50 Hz clock
    msgs = [("/a", "std_msgs/msg/Float64", 10**9 + t * MS, _float(t)) for t in times]
    bag = _bag_with(tmp_path, "gappy", msgs)
    client = Client(str(tmp_path / "store"), create=True)
    with caplog.at_level("WARNING", logger="treadle"):
        res = import_ros2(str(bag), client.project("p"), "t", topics={"/a": "a"}, fps=50,
                          progress=False)  # fmt: skip
    assert "topic /a has a gap of 0.170 s" in caplog.text
    assert res.topics[0]["largest_gap_s"] == pytest.approx(0.17) and res.rows == 11


def test_bad_options_and_sources(tmp_path):
    client = Client(str(tmp_path / "store"), create=True)
    bag = _bag_with(
        tmp_path, "ok", [("/a", "std_msgs/msg/Float64", 10**9 + k, _float(k)) for k in range(3)]
    )
    for kw, match in [
        ({"topics": {}, "fps": 10}, "at least one topic"),
        ({"topics": {"/a": "a"}, "fps": 0}, "fps must be positive"),
        ({"topics": {"/a": "a"}, "fps": 10, "align": {"b": "linear"}}, "no topic gives"),
        ({"topics": {"/a": "a"}, "fps": 10, "align": {"a": "cubic"}}, "must be one of"),
        ({"topics": {"/a": "a"}, "fps": 10, "stamp": "wall"}, "'header' or 'log'"),
    ]:
        with pytest.raises(ValueError, match=match):
            import_ros2(str(bag), client.project("p"), "t", progress=False, **kw)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound, match="no ROS bags"):
        import_ros2(str(tmp_path / "empty"), client.project("p"), "t", topics={"/a": "a"}, fps=1)
    (tmp_path / "junk.mcap").write_bytes(b"not a bag")
    with pytest.raises(CorruptData, match="cannot be read as a ROS bag"):
        import_ros2(
            str(tmp_path / "junk.mcap"), client.project("p"), "t", topics={"/a": "a"}, fps=1
        )
    assert nothing_committed(client.project("p"))


def test_only_the_images_the_clock_uses_are_converted(bags, tmp_path, monkeypatch):
    from treadle.importers.ros2 import ros2_messages

    calls = []
    real = ros2_messages.image_pixels
    monkeypatch.setattr(ros2_messages, "image_pixels", lambda m, w: calls.append(w) or real(m, w))
    res, t = _import(
        bags / "ep_a",
        tmp_path,
        fps=4,
        topics={"/joint_states": "j", "/camera/image_raw": "cam"},
        align={},
    )
    cam = next(r for r in res.topics if r["topic"] == "/camera/image_raw")
    used = cam["messages"] - cam["never_used"]
    assert t.num_moments == 2 and used == 2 and cam["messages"] == 16
    assert len(calls) == used  # the first message's encoding is read, not its pixels


def test_a_bag_over_max_episode_bytes_is_refused(bags, tmp_path):
    with pytest.raises(CorruptData, match="over 3000 bytes"):  # SQLite: counted as read
        _import(bags / "ep_b", tmp_path, max_episode_bytes=3000)
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))
    # MCAP: its one chunk (every topic), refused from the index before it is read
    with pytest.raises(UnsafeInput, match="over 3,000 bytes of its MCAP chunks inflated at once"):
        _import(bags / "ep_a", tmp_path / "a", max_episode_bytes=3000)


def _mcap_bomb(path: Path, inflated: int) -> Path:
    """An MCAP file of one zstd chunk of ``inflated`` zero bytes (stated as such): a few KB."""
    import struct

    from backports import zstd

    def record(op, body):
        return bytes([op]) + struct.pack("<Q", len(body)) + body

    def string(text):
        return struct.pack("<I", len(text)) + text.encode()

    z = zstd.ZstdCompressor()
    data = b"".join(z.compress(bytes(1 << 20)) for _ in range(inflated >> 20)) + z.flush()
    chunk = struct.pack("<QQQI", 0, 0, inflated, 0) + string("zstd")
    chunk += struct.pack("<Q", len(data)) + data
    magic = b"\x89MCAP0\r\n"
    path.write_bytes(
        magic + record(1, string("ros2") + string("bomb")) + record(6, chunk)
        + record(0x0F, bytes(4)) + record(2, bytes(20)) + magic
    )  # fmt: skip
    return path


def test_a_compressed_chunk_inflates_only_to_max_episode_bytes(tmp_path):
    # rosbags inflates a chunk whole: a bag of a few KB could take any amount of memory
    bomb = _mcap_bomb(tmp_path / "bomb.mcap", 64 << 20)
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(UnsafeInput, match=r"bomb.mcap: an MCAP zstd chunk inflates past "
                       r"max_episode_bytes \(16,777,216 bytes"):  # fmt: skip
        _import(bomb, tmp_path, topics={"/cmd": "cmd"}, align={}, max_episode_bytes=16 << 20)
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


def test_a_sqlite_bag_of_compressed_messages_inflates_through_the_cap(tmp_path):
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.rosbag2.enums import CompressionFormat, CompressionMode

    ts = get_typestore(Stores.ROS2_HUMBLE)
    f64 = ts.types["std_msgs/msg/Float64"]
    path = tmp_path / "zmsgs"
    w = Writer(path, version=9, storage_plugin=StoragePlugin.SQLITE3)
    w.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
    u8 = "std_msgs/msg/UInt8MultiArray"
    with w:
        conn = w.add_connection("/cmd", "std_msgs/msg/Float64", typestore=ts)
        for i in range(20):
            raw = ts.serialize_cdr(f64(data=float(i)), "std_msgs/msg/Float64")
            w.write(conn, 10**9 + i * 10**8, raw)
        zeros = ts.types[u8](layout=ts.types["std_msgs/msg/MultiArrayLayout"](dim=[],
                             data_offset=0), data=np.zeros(1 << 16, np.uint8))  # fmt: skip
        w.write(w.add_connection("/z", u8, typestore=ts), 10**9, ts.serialize_cdr(zeros, u8))
    kw = {"topics": {"/cmd": "cmd"}, "fps": 10, "align": {}, "stamp": {"/cmd": "log"}}
    with pytest.raises(UnsafeInput, match="zmsgs: a zstd-compressed message inflates past"):
        small = {**kw, "topics": {"/cmd": "cmd", "/z:data": "z"}}  # 64 KiB in a few bytes
        _import(path, tmp_path / "small", max_episode_bytes=1 << 12, **small)
    _, t = _import(path, tmp_path, **kw)
    np.testing.assert_array_equal(_column(t, "cmd"), np.arange(20.0))


@pytest.mark.parametrize("storage", ["SQLITE3", "MCAP"])
def test_a_file_compressed_bag_inflates_to_a_capped_temporary_file(tmp_path, monkeypatch, storage):
    """A rosbag2 bag in "file" compression (each storage file zstd-compressed whole) was
    inflated to a temporary file with no bound: a few KB could fill the disk. It inflates to
    at most 4 x max_episode_bytes (the file holds topics the import leaves out too); past
    that, an UnsafeInput naming the bag and its file, and the temporary file is gone."""
    import tempfile

    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.rosbag2.enums import CompressionFormat, CompressionMode

    ts = get_typestore(Stores.ROS2_HUMBLE)
    f64, u8 = "std_msgs/msg/Float64", "std_msgs/msg/UInt8MultiArray"
    path = tmp_path / "zfile"
    w = Writer(path, version=9, storage_plugin=StoragePlugin[storage])
    w.set_compression(CompressionMode.FILE, CompressionFormat.ZSTD)
    with w:
        conn = w.add_connection("/cmd", f64, typestore=ts)
        big = w.add_connection("/big", u8, typestore=ts)  # a topic the import leaves out
        for i in range(20):
            w.write(conn, 10**9 + i * 10**8, ts.serialize_cdr(ts.types[f64](data=float(i)), f64))
        zeros = ts.types[u8](layout=ts.types["std_msgs/msg/MultiArrayLayout"](dim=[],
                             data_offset=0), data=np.zeros(4 << 20, np.uint8))  # fmt: skip
        w.write(big, 10**9, ts.serialize_cdr(zeros, u8))
    assert sum(f.stat().st_size for f in path.iterdir()) < 64 << 10
    temp = tmp_path / "temp"  # where rosbags makes its temporary folder
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    kw = {"topics": {"/cmd": "cmd"}, "fps": 10, "align": {}, "stamp": {"/cmd": "log"}}
    with pytest.raises(UnsafeInput, match=r"zfile: its file zfile\.\w+\.zstd inflates "
                       r"past 4 x max_episode_bytes \(4,194,304 bytes"):  # fmt: skip
        _import(path, tmp_path / "small", max_episode_bytes=1 << 20, **kw)
    assert list(temp.iterdir()) == []
    assert nothing_committed(Client(str(tmp_path / "small" / "store")).project("p"))
    _, t = _import(path, tmp_path, **kw)
    np.testing.assert_array_equal(_column(t, "cmd"), np.arange(20.0))
    assert list(temp.iterdir()) == []


def test_rerun_is_a_no_op_and_cli(bags, tmp_path, capsys):
    from treadle.cli import main

    root = str(tmp_path / "store")
    argv = ["--root", root, "import", "ros2", str(bags / "ep_a"), "--project", "p", "--table", "t",
            "--fps", "30000/1001", "--topic", "/joint_states=joints", "--topic",
            "/imu:linear_acceleration=acc", "--align", "acc=linear", "--stamp", "/imu=log",
            "--images", "decoded"]  # fmt: skip
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["episodes"] == 1 and {r["topic"] for r in first["topics"]} == {
        "/joint_states",
        "/imu",
    }
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["already_imported"]


@pytest.mark.s3
def test_from_and_into_s3(bags, s3_server, s3_root, tmp_path):
    from treadle.storage import Store

    opts = s3_server.storage_options()
    url = s3_server.url(f"src-ros2-{tmp_path.name}")
    store = Store.open(url, opts)
    for p in sorted(bags.rglob("*")):
        if p.is_file():
            store.put(str(p.relative_to(bags)), p.read_bytes())
    root, root_opts = s3_root
    client = Client(root, root_opts)
    res = import_ros2(url, client.project("p"), "t", topics=TOPICS, fps=30, images="decoded",
                      align=ALIGN, source_options=opts, progress=False)  # fmt: skip
    t = client.project("p").branch("main").table("t").pin()
    assert res.episodes == 2
    _check_alignment(t, bags / "ep_b", "ep_b", Fraction(30), ALIGN)


def _camera_message(kind, stamp):
    """A CompressedImage (JPEG) or an rgb8 Image of frames(1, 16, 16), stamped ``stamp``."""

    def build(ts):
        from PIL import Image

        from robot_fixtures import _header, frames

        f = frames(1, 16, 16)[0]
        if kind == "raw":
            return ts.types["sensor_msgs/msg/Image"](
                header=_header(ts, stamp), height=16, width=16, encoding="rgb8",
                is_bigendian=0, step=48, data=f.reshape(-1))  # fmt: skip
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="JPEG", quality=90)
        return ts.types["sensor_msgs/msg/CompressedImage"](
            header=_header(ts, stamp), format="jpeg", data=np.frombuffer(buf.getvalue(), np.uint8))  # fmt: skip

    return build


@pytest.fixture(scope="module")
def latched_bags(tmp_path_factory):
    """Per camera kind, a bag whose camera publishes once 250 ms after the clock starts
    ("late") and one whose camera publishes once before it ("early"); /a at 10 Hz."""
    folder = tmp_path_factory.mktemp("latched")
    base = [("/a", "std_msgs/msg/Float64", 10**9 + k * 100 * MS, _float(k)) for k in range(6)]
    out = {}
    for kind, typ in (
        ("jpeg", "sensor_msgs/msg/CompressedImage"),
        ("raw", "sensor_msgs/msg/Image"),
    ):
        for when, t in (("late", 10**9 + 250 * MS), ("early", 10**9 - 50 * MS)):
            msg = [("/cam", typ, t, _camera_message(kind, t))]
            out[kind, when] = _bag_with(
                folder, f"{kind}_{when}", sorted(base + msg, key=lambda m: m[2])
            )
    return out


@pytest.mark.parametrize("kind", ["jpeg", "raw"])
def test_a_latched_camera(latched_bags, tmp_path, kind):
    from PIL import Image

    from robot_fixtures import frames

    topics = {"/a": "a", "/cam": "cam"}
    late = latched_bags[kind, "late"]
    for images in ("video", "decoded"):  # no null in a video or an array: a named error
        client = Client(str(tmp_path / images), create=True)
        with pytest.raises(SchemaMismatch, match=r"column 'cam': topic /cam \(sensor_msgs/msg/"
                           r".*is latched and its one message comes after 3 of the episode's 6 "
                           r"moments.*images='encoded'"):  # fmt: skip
            import_ros2(str(late), client.project("p"), "t", topics=topics, fps=10, images=images,
                        progress=False)  # fmt: skip
        assert nothing_committed(client.project("p"))
    _, t = _import(late, tmp_path / "enc", topics=topics, fps=10, images="encoded", align={})
    cam = t.to_arrow(["cam"]).column(0).to_pylist()
    assert cam[:3] == [None] * 3 and len(set(cam[3:])) == 1  # null before, then held
    np.testing.assert_array_equal(np.isnan(_column(t, "cam_age_s")), [True] * 3 + [False] * 3)
    pixels = np.asarray(Image.open(io.BytesIO(cam[3])).convert("RGB"))
    if kind == "raw":  # raw pixels as lossless PNG
        np.testing.assert_array_equal(pixels, frames(1, 16, 16)[0])
    else:  # the message's bytes as they are
        _, sent = _raw(late, "/cam", lambda m: bytes(m.data))
        assert cam[3] == sent[0]
    # td.Video reads it where it has an image (the plan finds the first one)
    windows = td.Windows({"cam": td.Video(range(2))})
    comp = td.Component(t, windows, where="cam IS NOT NULL")
    batch = next(iter(td.TrainLoader(td.Recipe(seed=0, batch_size=2, components=[comp]), steps=1)))
    assert tuple(batch["cam"].shape) == (2, 2, 16, 16, 3)
    # published before the clock starts: held at every moment, any images= works
    res, t = _import(latched_bags[kind, "early"], tmp_path / "early", topics=topics, fps=10,
                     images="video", align={})  # fmt: skip
    assert t.video_columns == ["cam"] and t.num_moments == 6
    assert next(r for r in res.topics if r["topic"] == "/cam")["latched"]

"""ROS bag import: every message type of the docs' table, and the rules at their edges
(the 10 s header-stamp rule, the 1 s reorder window, linear refused by kind). Bags are
written by rosbags' Writer; each type's value is compared with what was sent."""

from __future__ import annotations

import io

import numpy as np
import pytest

from importer_fixtures import nothing_committed
from treadle.catalog import Client
from treadle.errors import CorruptData, SchemaMismatch
from treadle.importers import ros2 as import_ros2
from treadle.table.tensors import to_numpy

pytest.importorskip("rosbags")
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

TS = get_typestore(Stores.ROS2_HUMBLE)
G = TS.types
MS = 1_000_000
T0 = 10**9


def _header(t):
    return G["std_msgs/msg/Header"](
        stamp=G["builtin_interfaces/msg/Time"](sec=t // 10**9, nanosec=t % 10**9), frame_id=""
    )


def _v3(x, y, z):
    return G["geometry_msgs/msg/Vector3"](x=float(x), y=float(y), z=float(z))


def _image(t, enc, arr):
    arr = np.ascontiguousarray(arr)
    h, w = arr.shape[:2]
    return G["sensor_msgs/msg/Image"](
        header=_header(t), height=h, width=w, encoding=enc, is_bigendian=0,
        step=arr.nbytes // h, data=arr.view(np.uint8).reshape(-1))  # fmt: skip


def _png(k):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_rgb(k)).save(buf, format="PNG")
    return buf.getvalue()


def _rgb(k):
    return (np.arange(4 * 6 * 3).reshape(4, 6, 3) * 5 + k).astype(np.uint8)


def _joints(t, k):
    return G["sensor_msgs/msg/JointState"](
        header=_header(t), name=["b", "a"], position=np.array([k, -k], np.float64),
        velocity=np.array([2.0 * k, 0.0]), effort=np.array([0.5, 0.25 * k]))  # fmt: skip


#: topic -> (type, builder(time, k)); every topic publishes at T0 + k * 100 ms, k = 0..4
MESSAGES = {
    "/bgr": ("sensor_msgs/msg/Image", lambda t, k: _image(t, "bgr8", _rgb(k)[..., ::-1])),
    "/mono": ("sensor_msgs/msg/Image", lambda t, k: _image(t, "mono8", _rgb(k)[..., 0])),
    "/f32": ("sensor_msgs/msg/Image", lambda t, k: _image(t, "32FC1", np.full((2, 3), k / 3, "<f4"))),
    "/m16": ("sensor_msgs/msg/Image", lambda t, k: _image(t, "mono16", np.full((2, 3), 60000 + k, "<u2"))),
    "/png": ("sensor_msgs/msg/CompressedImage", lambda t, k: G["sensor_msgs/msg/CompressedImage"](
        header=_header(t), format="png", data=np.frombuffer(_png(k), np.uint8))),
    "/ok": ("std_msgs/msg/Bool", lambda t, k: G["std_msgs/msg/Bool"](data=bool(k % 2))),
    "/i8": ("std_msgs/msg/Int8", lambda t, k: G["std_msgs/msg/Int8"](data=-k)),
    "/u16": ("std_msgs/msg/UInt16", lambda t, k: G["std_msgs/msg/UInt16"](data=65535 - k)),
    "/twist": ("geometry_msgs/msg/Twist", lambda t, k: G["geometry_msgs/msg/Twist"](
        linear=_v3(k, 1, 2), angular=_v3(3, 4, -k))),
    "/wrench": ("geometry_msgs/msg/WrenchStamped", lambda t, k: G["geometry_msgs/msg/WrenchStamped"](
        header=_header(t), wrench=G["geometry_msgs/msg/Wrench"](force=_v3(k, 0, 0), torque=_v3(0, 0, k)))),
    "/j": ("sensor_msgs/msg/JointState", _joints),
}  # fmt: skip


def _bag(path, messages, times=None):
    """A rosbag2 (MCAP): ``{topic: (type, build(stamp, k))}``, message k logged at
    ``T0 + k * 100 ms`` and stamped ``times(k)`` (default: its log time)."""
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conns = {t: w.add_connection(t, typ, typestore=TS) for t, (typ, _) in messages.items()}
        for k in range(5):
            log = T0 + k * 100 * MS
            for topic, (typ, build) in messages.items():
                stamp = log if times is None else times(topic, k, log)
                w.write(conns[topic], log, TS.serialize_cdr(build(stamp, k), typ))
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("types")
    bag = _bag(tmp / "every", MESSAGES)
    client = Client(str(tmp / "store"), create=True)
    topics = {t: t[1:] for t in MESSAGES}
    import_ros2(str(bag), client.project("p"), "t", topics=topics, fps=10, images="decoded",
                progress=False)  # fmt: skip
    return client.project("p").branch("main").table("t").pin()


def _col(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


def test_every_type_of_the_table(table):
    t, k = table, np.arange(5)
    assert t.num_moments == 5
    for name in ("bgr", "mono", "png"):  # cameras: RGB uint8 [H, W, 3]
        want = np.stack([_rgb(i) for i in k])
        if name == "mono":
            want = np.repeat(want[..., :1], 3, axis=3)
        np.testing.assert_array_equal(_col(t, name), want)
    f32, m16 = _col(t, "f32"), _col(t, "m16")
    assert f32.dtype == np.float32 and f32.shape == (5, 2, 3, 1) and m16.dtype == np.uint16
    np.testing.assert_array_equal(f32[:, 0, 0, 0], (k / 3).astype(np.float32))
    np.testing.assert_array_equal(m16[:, 1, 2, 0], 60000 + k)
    assert t.to_arrow(["ok"]).column(0).to_pylist() == [bool(i % 2) for i in k]
    np.testing.assert_array_equal(_col(t, "i8"), -k)
    np.testing.assert_array_equal(_col(t, "u16"), 65535 - k)
    np.testing.assert_array_equal(_col(t, "twist")[:, [0, 5]], np.stack([k, -k], 1))
    np.testing.assert_array_equal(_col(t, "wrench")[:, [0, 5]], np.stack([k, k], 1))
    assert _col(t, "twist").shape == _col(t, "wrench").shape == (5, 6)
    np.testing.assert_array_equal(_col(t, "j_position"), np.stack([k, -k], 1))  # b, a
    np.testing.assert_array_equal(_col(t, "j_effort"), np.stack([k * 0 + 0.5, 0.25 * k], 1))
    for part in ("position", "velocity", "effort"):
        assert t.column_metadata(f"j_{part}") == {"joint_names": ["b", "a"]}


def _import_bag(tmp_path, messages, times=None, **kw):
    bag = _bag(tmp_path / "bag", messages, times)
    client = Client(str(tmp_path / "store"), create=True)
    topics = {t: t[1:] for t in messages}
    kw = {"fps": 10, "images": "decoded", **kw}
    res = import_ros2(str(bag), client.project("p"), "t", topics=topics, progress=False, **kw)
    return res, client


def test_header_stamps_up_to_10_s_from_their_log_time(tmp_path):
    wrench = {"/wrench": MESSAGES["/wrench"]}
    res, _ = _import_bag(tmp_path / "ok", wrench, lambda topic, k, log: log - 10 * 10**9)
    assert res.rows == 5  # exactly 10 s: still the message's time
    with pytest.raises(
        CorruptData, match=r"/wrench .*is 10.0 s from its log time.*stamp=\{'/wrench': 'log'\}"
    ):
        _import_bag(tmp_path / "bad", wrench, lambda topic, k, log: log - 10 * 10**9 - 1)
    res, _ = _import_bag(tmp_path / "log", wrench, lambda topic, k, log: 0, stamp="log")
    assert res.rows == 5  # stamp="log" ignores the stamps


def test_messages_are_ordered_by_time_within_the_reorder_window(tmp_path):
    wrench = {"/wrench": MESSAGES["/wrench"]}
    # message 3 is stamped 50 ms, before messages 1 and 2: within the 1 s window
    stamps = lambda topic, k, log: log - (250 * MS if k == 3 else 0)  # noqa: E731
    res, client = _import_bag(tmp_path, wrench, stamps, align={"wrench": "next"})
    t = client.project("p").branch("main").table("t").pin()
    # ticks 0..300 ms; "next" takes the first message after each: 3 (50 ms), 2, 4, 4
    np.testing.assert_array_equal(_col(t, "wrench")[:, 0], [3, 2, 4, 4])
    np.testing.assert_allclose(_col(t, "wrench_age_s"), [-0.05, -0.1, -0.2, -0.1])
    assert res.topics[0]["never_used"] == 2 and res.topics[0]["used_more"] == 1


def test_of_two_messages_with_one_time_the_later_logged_wins(tmp_path):
    wrench = {"/wrench": MESSAGES["/wrench"]}
    stamps = lambda topic, k, log: log - (100 * MS if k == 2 else 0)  # noqa: E731 (1 and 2: 100 ms)
    res, client = _import_bag(tmp_path, wrench, stamps)
    t = client.project("p").branch("main").table("t").pin()
    np.testing.assert_array_equal(_col(t, "wrench")[:, 0], [0, 2, 2, 3, 4])
    row = res.topics[0]
    assert row["messages"] == 5 and (row["used_once"], row["used_more"], row["never_used"]) == (
        3,
        1,
        1,
    )


def _joints_missing(t, k):
    names = ["b", "a"] if k != 3 else ["b"]
    return G["sensor_msgs/msg/JointState"](
        header=_header(t), name=names, position=np.zeros(len(names)),
        velocity=np.zeros(0), effort=np.zeros(0))  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "times", "kw", "error", "match"),
    [
        ({"/wrench": MESSAGES["/wrench"]}, lambda topic, k, log: log - (2 * 10**9 if k == 3 else 0),
         {}, CorruptData, r"topic /wrench: message 3 is 1.900 s earlier than one logged before it "
         r"\(the reorder window is 1 s\)"),
        ({"/j": ("sensor_msgs/msg/JointState", _joints_missing)}, None, {}, CorruptData,
         r"topic /j .*JointState has no joint 'a' \(joints \['b', 'a'\]\)"),
        ({"/ok": MESSAGES["/ok"]}, None, {"align": {"ok": "linear"}}, SchemaMismatch,
         r"'ok' .*holds bool values: align='linear' interpolates floats only"),
        ({"/twist": MESSAGES["/twist"], "/s": ("std_msgs/msg/String", lambda t, k: G[
            "std_msgs/msg/String"](data="x"))}, None, {"align": {"s": "linear"}}, SchemaMismatch,
         "holds str values"),
        ({"/p": ("geometry_msgs/msg/Pose", lambda t, k: G["geometry_msgs/msg/Pose"](
            position=G["geometry_msgs/msg/Point"](x=0.0, y=0.0, z=0.0),
            orientation=G["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)))},
         None, {"align": {"p": "linear"}}, SchemaMismatch, r"an orientation \(quaternion\)"),
        ({"/png": MESSAGES["/png"]}, None, {"align": {"png": "linear"}}, SchemaMismatch,
         "holds image values"),
        ({"/bgr": MESSAGES["/bgr"]}, None, {"align": {"bgr": "linear"}}, SchemaMismatch,
         "holds camera values"),
    ],
)  # fmt: skip
def test_named_errors_at_the_edges(tmp_path, messages, times, kw, error, match):
    with pytest.raises(error, match=match):
        _import_bag(tmp_path, messages, times, **kw)
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


def test_a_latched_depth_topic_after_the_clock_starts_is_refused(tmp_path):
    path = tmp_path / "bag"
    depth = ("sensor_msgs/msg/Image", "/d")
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        a = w.add_connection("/ok", "std_msgs/msg/Bool", typestore=TS)
        d = w.add_connection("/d", depth[0], typestore=TS)
        for k in range(5):
            log = T0 + k * 100 * MS
            w.write(a, log, TS.serialize_cdr(MESSAGES["/ok"][1](log, k), "std_msgs/msg/Bool"))
            if k == 2:  # once, after the clock started
                w.write(d, log, TS.serialize_cdr(MESSAGES["/m16"][1](log, k), depth[0]))
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(SchemaMismatch, match=r"column 'd': topic /d \(sensor_msgs/msg/Image\) is "
                       r"latched .*after 2 of the episode's 5 moments: an exact depth column"):  # fmt: skip
        import_ros2(str(path), client.project("p"), "t", topics={"/ok": "ok", "/d": "d"}, fps=10,
                    images="encoded", progress=False)  # fmt: skip
    assert nothing_committed(client.project("p"))

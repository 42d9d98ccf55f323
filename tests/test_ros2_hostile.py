"""ROS bag import against hostile and damaged bags: rosbags' decompressors left as the
process had them, memory per message bounded relative to its size, and named errors (or the
values rosbags' own reader gives) for damaged bags."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from importer_fixtures import nothing_committed
from treadle.catalog import Client
from treadle.errors import UnsafeInput
from treadle.importers import ros2 as import_ros2
from treadle.table.tensors import to_numpy

pytest.importorskip("rosbags")
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.rosbag2.enums import CompressionFormat, CompressionMode  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

TS = get_typestore(Stores.ROS2_HUMBLE)
G = TS.types
F64 = "std_msgs/msg/Float64"
MS = 1_000_000


def _bag(path: Path, storage="MCAP", compression=None, n=20, extra=()):
    """A rosbag2 bag of ``/cmd`` (Float64 ``i``, logged at 1 s + i x 100 ms) and the
    ``extra`` messages ``(topic, type, log ns, message)``."""
    w = Writer(path, version=9, storage_plugin=StoragePlugin[storage])
    if compression is not None:
        w.set_compression(CompressionMode[compression], CompressionFormat.ZSTD)
    with w:
        conns = {"/cmd": w.add_connection("/cmd", F64, typestore=TS)}
        for i in range(n):
            w.write(
                conns["/cmd"], 10**9 + i * 100 * MS, TS.serialize_cdr(G[F64](data=float(i)), F64)
            )
        for topic, typ, log, msg in extra:
            if topic not in conns:
                conns[topic] = w.add_connection(topic, typ, typestore=TS)
            w.write(conns[topic], log, TS.serialize_cdr(msg, typ))
    return path


def _import(src, root, **kw):
    client = Client(str(root), create=True)
    kw = {"topics": {"/cmd": "cmd"}, "fps": 10, "stamp": "log", "images": "encoded", **kw}
    res = import_ros2(str(src), client.project("p"), "t", progress=False, **kw)
    return res, client.project("p").branch("main").table("t").pin()


def _col(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


def _decompressors():
    from rosbags.rosbag1 import reader as bag1
    from rosbags.rosbag2 import reader as bag2
    from rosbags.rosbag2 import storage_mcap as mcap

    return dict(mcap.DECOMPRESSORS), dict(bag1.decompressors), bag2.zstd


def test_rosbags_decompressors_are_put_back_after_an_import(tmp_path):
    """treadle swapped rosbags' module-level decompressors (MCAP's and ROS 1's tables, the
    rosbag2 reader's zstd module) for capped ones once, for the whole process, for good."""
    before = _decompressors()
    bag = _bag(tmp_path / "zmsgs", "SQLITE3", "MESSAGE")
    _, t = _import(bag, tmp_path / "store")
    np.testing.assert_array_equal(_col(t, "cmd"), np.arange(20.0))
    after = _decompressors()
    assert after[0] == before[0] and after[1] == before[1] and after[2] is before[2]


def test_a_decompressor_the_process_swaps_in_later_is_capped_too(tmp_path):
    """A zstd chunk decompressor replaced after treadle's first import (another library's
    fix, say) is capped in the next import; before, the replacement went uncapped."""
    from backports import zstd
    from rosbags.rosbag2 import storage_mcap as mcap

    from test_import_ros2 import _mcap_bomb

    _import(_bag(tmp_path / "ok"), tmp_path / "first")
    theirs = mcap.DECOMPRESSORS["zstd"]
    mcap.DECOMPRESSORS["zstd"] = mine = lambda data, size: zstd.decompress(data)
    try:
        bomb = _mcap_bomb(tmp_path / "bomb.mcap", 64 << 20)
        with pytest.raises(UnsafeInput, match=r"bomb.mcap: an MCAP zstd chunk inflates past"):
            _import(bomb, tmp_path / "store", max_episode_bytes=16 << 20)
        assert nothing_committed(Client(str(tmp_path / "store")).project("p"))
        assert mcap.DECOMPRESSORS["zstd"] is mine  # left as the process set it
    finally:
        mcap.DECOMPRESSORS["zstd"] = theirs


def test_threads_reading_bags_at_once_keep_their_own_caps(tmp_path):
    """Imports in two threads (one capped small, one not) and a plain rosbags read in a
    third: each gets its own cap (or none), and the last one out restores rosbags."""
    from rosbags.highlevel import AnyReader

    before = _decompressors()
    big = _bag(tmp_path / "big", "SQLITE3", "MESSAGE", extra=[
        ("/blob", "std_msgs/msg/UInt8MultiArray", 10**9, G["std_msgs/msg/UInt8MultiArray"](
            layout=G["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0),
            data=np.zeros(1 << 20, np.uint8)))])  # fmt: skip
    start = threading.Barrier(3)
    got: dict[str, object] = {}

    def run(name, fn):
        start.wait()
        try:
            got[name] = fn()
        except Exception as e:  # compared below
            got[name] = e

    def plain():
        with AnyReader([big], default_typestore=TS) as r:
            conns = [c for c in r.connections if c.topic == "/blob"]
            return sum(len(raw) for _, _, raw in r.messages(connections=conns))

    kw = {"topics": {"/blob:data": "blob", "/cmd": "cmd"}}
    threads = [
        threading.Thread(target=run, args=("small", lambda: _import(
            big, tmp_path / "s", max_episode_bytes=1 << 16, **kw)))]  # fmt: skip
    threads += [
        threading.Thread(target=run, args=("ok", lambda: _import(big, tmp_path / "o", **kw))),
        threading.Thread(target=run, args=("plain", plain)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert isinstance(got["small"], UnsafeInput), got["small"]
    assert "a zstd-compressed message inflates past" in str(got["small"])
    assert not isinstance(got["ok"], Exception), got["ok"]
    assert got["plain"] > 1 << 20
    after = _decompressors()
    assert after[0] == before[0] and after[1] == before[1] and after[2] is before[2]


BIG = 3 << 20  # bytes of the one big message


def _big_bag(path: Path, kind: str, storage: str, compression: str | None) -> Path:
    """``/cmd`` at 10 Hz and one big message on ``/big`` (an rgb8 Image, a CompressedImage,
    a LaserScan of 8 ranges and :data:`BIG` bytes of intensities) of about :data:`BIG` bytes."""
    header = G["std_msgs/msg/Header"](stamp=G["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                      frame_id="")  # fmt: skip
    data = np.full(BIG, 7, np.uint8)
    typ, msg = {
        "image": ("sensor_msgs/msg/Image", lambda: G["sensor_msgs/msg/Image"](
            header=header, height=BIG // 3072, width=1024, encoding="rgb8", is_bigendian=0,
            step=3072, data=data)),
        "jpeg": ("sensor_msgs/msg/CompressedImage", lambda: G["sensor_msgs/msg/CompressedImage"](
            header=header, format="jpeg", data=data)),
        "scan": ("sensor_msgs/msg/LaserScan", lambda: G["sensor_msgs/msg/LaserScan"](
            header=header, angle_min=0.0, angle_max=1.0, angle_increment=0.1, time_increment=0.0,
            scan_time=0.1, range_min=0.0, range_max=9.0, ranges=np.arange(8, dtype=np.float32),
            intensities=np.full(BIG // 4, 0.5, np.float32))),
    }[kind]  # fmt: skip
    return _bag(path, storage, compression, extra=[("/big", typ, 10**9, msg())])


@pytest.mark.parametrize("kind", ["image", "jpeg", "scan"])
@pytest.mark.parametrize(
    ("storage", "compression"),
    [("MCAP", None), ("MCAP", "STORAGE"), ("SQLITE3", None), ("SQLITE3", "MESSAGE")],
)
def test_memory_per_message_is_bounded_by_its_size(tmp_path, kind, storage, compression):
    """Reading a bag of one message of N bytes peaked at about 5 N (MCAP) or 3 N (SQLite):
    rosbags copied each message once more to deserialize it (a slice of ``bytes``), a topic's
    first image was converted only to learn its kind, and pixels were copied once more to
    the dtype they had; a numeric field kept the whole message it was a view of. What is
    left is rosbags' own reading (an MCAP chunk is held as read, inflated, and split into
    messages)."""
    import tracemalloc

    from treadle.importers.ros2.ros2_bags import TopicSpec, load_values, read_bag

    bag = _big_bag(tmp_path / "bag", kind, storage, compression)
    field = "ranges" if kind == "scan" else None
    specs = [
        TopicSpec("/big", field, "big", "hold", "log"),
        TopicSpec("/cmd", None, "cmd", "hold", "log"),
    ]
    limit = 1 << 30
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        data = read_bag(str(bag), specs, "bag", limit)
        kept, first = (m - base for m in tracemalloc.get_traced_memory())
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        load_values(str(bag), data, [{0}, set()], "bag", limit)
        second = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # rosbags' own peak: an MCAP chunk as read, as split up, and the message; a SQLite row
    # (and the inflating of a zstd-compressed one)
    rosbags = 1 if (storage, compression) == ("SQLITE3", None) else 3
    assert first < (rosbags + 0.25) * BIG  # nothing converted in the first pass
    assert second < (rosbags + 1.25) * BIG  # a CompressedImage's bytes copied out once
    if kind == "scan":  # 8 ranges kept, not the message they were a view of
        assert kept < BIG / 4
        np.testing.assert_array_equal(data[0].values[0][""], np.arange(8, dtype=np.float32))
    else:
        assert len(data[0].values[0][""]) * (1 if kind == "jpeg" else 3 * 1024) >= BIG


def _mixed(path: Path, storage: str) -> Path:
    """``/cmd`` and ``/b``, whose messages are Float64 and Int32 by turns (two connections)."""
    i32 = "std_msgs/msg/Int32"
    extra = [
        ("/b", i32, 10**9 + k * 100 * MS, G[i32](data=100 + k))
        if k % 2
        else ("/b", F64, 10**9 + k * 100 * MS, G[F64](data=k + 0.5))
        for k in range(10)
    ]
    w = Writer(path, version=9, storage_plugin=StoragePlugin[storage])
    with w:
        conns = {
            t: w.add_connection(t[0], t[1], typestore=TS) for t in {(e[0], e[1]) for e in extra}
        }
        conns[("/cmd", F64)] = w.add_connection("/cmd", F64, typestore=TS)
        for i in range(10):
            t = 10**9 + i * 100 * MS
            w.write(conns["/cmd", F64], t, TS.serialize_cdr(G[F64](data=float(i)), F64))
        for topic, typ, log, msg in extra:
            w.write(conns[topic, typ], log, TS.serialize_cdr(msg, typ))
    return path


@pytest.mark.parametrize("storage", ["MCAP", "SQLITE3"])
def test_a_topic_of_two_types_is_refused_by_name(tmp_path, storage):
    """A topic recorded with two message types (two connections, one topic) made one column
    of both types' values without a word ([0.5, 101.0, 2.5, 103.0, ...])."""
    from treadle.errors import SchemaMismatch

    bag = _mixed(tmp_path / "mixed", storage)
    with pytest.raises(SchemaMismatch, match=r"mixed: topic /b has messages of two types, "
                       r"std_msgs/msg/\w+ and std_msgs/msg/\w+"):  # fmt: skip
        _import(bag, tmp_path / "store", topics={"/cmd": "cmd", "/b": "b"})
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


def test_a_compressed_image_that_is_no_image_is_refused_under_encoded(tmp_path):
    """images='encoded' stored a CompressedImage's bytes unchecked: garbage (or a PNG header
    claiming a bomb's size) went into the table and failed only when a run read it."""
    from treadle.errors import CorruptData

    typ = "sensor_msgs/msg/CompressedImage"
    header = G["std_msgs/msg/Header"](stamp=G["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                      frame_id="")  # fmt: skip
    junk = G[typ](header=header, format="jpeg", data=np.frombuffer(b"garbage" * 9, np.uint8))
    bag = _bag(tmp_path / "junk", extra=[("/c", typ, 10**9, junk)])
    with pytest.raises(CorruptData, match=r"junk, column 'c' \(/c, a CompressedImage\): not a "
                       r"decodable image"):  # fmt: skip
        _import(bag, tmp_path / "store", topics={"/cmd": "cmd", "/c": "c"}, images="encoded")
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


def test_a_message_that_does_not_deserialize_names_its_topic(tmp_path):
    """A message whose bytes are shorter than its type says (a Float64 of 4 bytes) named
    the bag only; it names the topic, the type and the message's log time."""
    from treadle.errors import CorruptData

    path = tmp_path / "short"
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        a = w.add_connection("/cmd", F64, typestore=TS)
        b = w.add_connection("/short", F64, typestore=TS)
        for i in range(10):
            t = 10**9 + i * 100 * MS
            w.write(a, t, TS.serialize_cdr(G[F64](data=float(i)), F64))
            w.write(b, t, bytes(TS.serialize_cdr(G[F64](data=float(i)), F64))[:8])
    with pytest.raises(CorruptData, match=r"short, topic /short \(std_msgs/msg/Float64\): the "
                       r"message logged at 1.000000000 s cannot be deserialized"):  # fmt: skip
        _import(path, tmp_path / "store", topics={"/cmd": "cmd", "/short": "s"})


def _overlapping_chunks(path: Path) -> Path:
    """An MCAP file of a few KB: 6 zstd chunks of 3 messages of 2 MiB of zeros each, every
    chunk spanning 1 s .. 10 s (rosbags holds them all inflated at once)."""
    from mcap.writer import CompressionType
    from mcap_ros2.writer import Writer as McapWriter

    u8 = "std_msgs/msg/UInt8MultiArray"
    with open(path, "wb") as f:
        w = McapWriter(f, chunk_size=(4 << 20) + 1000, compression=CompressionType.ZSTD)
        schema = w.register_msgdef(u8, TS.generate_msgdef(u8)[0])
        blob = {"layout": {"dim": [], "data_offset": 0}, "data": bytes(2 << 20)}
        for i in range(8):
            for t in (10**9 + i, 10 * 10**9 - i):
                w.write_message("/big", schema, blob, log_time=t, publish_time=t)
        w.finish()
    return path


def test_mcap_chunks_overlapping_in_time_are_refused_before_they_inflate(tmp_path):
    """Each chunk inflated within the cap, but rosbags inflates every chunk whose first time
    has come and holds it to its last message: chunks that all span one interval were held at
    once (77 MB for this 4 KB file; any number of caps for a bigger one)."""
    import tracemalloc

    from treadle.importers.ros2.ros2_bags import TopicSpec, read_bag

    bag = _overlapping_chunks(tmp_path / "overlap.mcap")
    assert bag.stat().st_size < 16 << 10
    specs = [TopicSpec("/big", "data", "big", "hold", "log")]
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeInput, match=r"overlap.mcap: rosbags would hold over 16,777,216 "
                           r"bytes of its MCAP chunks inflated at once"):  # fmt: skip
            read_bag(str(bag), specs, f"bag {bag}", 16 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # refused from the index, before a chunk is inflated
    data = read_bag(str(bag), specs, "bag", 64 << 20)  # under a cap they fit: read in full
    assert len(data[0].times) == 16 and all(v[""].size == 2 << 20 for v in data[0].values)


@pytest.mark.parametrize(
    "later", [["a", "a", "b"], ["b", "a", "b"]], ids=["first message", "later message"]
)
def test_a_joint_named_twice_is_refused(tmp_path, later):
    """A JointState naming one joint twice put the first one's value in both places (the
    column for the first message's order, found by list.index), without a word."""
    from treadle.errors import CorruptData

    js = "sensor_msgs/msg/JointState"

    def joints(names, k):
        header = G["std_msgs/msg/Header"](
            stamp=G["builtin_interfaces/msg/Time"](sec=1, nanosec=k * 100 * MS), frame_id=""
        )
        pos = np.arange(len(names), dtype=np.float64) + k
        return G[js](header=header, name=names, position=pos, velocity=np.zeros(0),
                     effort=np.zeros(0))  # fmt: skip

    first = later if later[0] == later[1] else ["a", "b"]
    extra = [
        ("/j", js, 10**9 + k * 100 * MS, joints(first if k < 3 else later, k)) for k in range(6)
    ]
    bag = _bag(tmp_path / "twice", extra=extra)
    with pytest.raises(CorruptData, match=r"twice, topic /j .*JointState names joint '\w' twice"):
        _import(bag, tmp_path / "store", topics={"/cmd": "cmd", "/j": "j"})
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


@pytest.mark.parametrize("kind", ["image", "scan"])
def test_a_sqlite_message_over_the_cap_is_refused_before_it_is_read(tmp_path, kind):
    """SQLite reads a row whole: a message over max_episode_bytes was read (an Image, not
    counted in the first pass, even twice) before the count refused it."""
    import tracemalloc

    from treadle.importers.ros2.ros2_bags import TopicSpec, load_values, read_bag

    bag = _big_bag(tmp_path / "bag", kind, "SQLITE3", None)
    specs = [TopicSpec("/big", "ranges" if kind == "scan" else None, "big", "hold", "log"),
             TopicSpec("/cmd", None, "cmd", "hold", "log")]  # fmt: skip
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeInput, match=r"bag: a selected message holds 3,14\d,\d{3} bytes, "
                           r"over max_episode_bytes \(1,048,576 bytes"):  # fmt: skip
            data = read_bag(str(bag), specs, "bag", 1 << 20)
            load_values(str(bag), data, [{0}, set()], "bag", 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < BIG / 4


def test_a_damaged_mcap_chunk_that_rosbags_reads_short_is_refused(tmp_path):
    """64 zeroed bytes inside an MCAP chunk (no CRC: rosbags' writer writes none): rosbags
    stopped reading the chunk there without a word, after one garbage value, and the import
    stored the first 1384 of 2000 messages (the last a garbage 7.7e-306). Fewer messages than
    the index states is now a CorruptData naming the topic and both counts."""
    from rosbags.highlevel import AnyReader

    from treadle.errors import CorruptData

    path = tmp_path / "flip"
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        c = w.add_connection("/cmd", F64, typestore=TS)
        for k in range(2000):
            w.write(c, 10**9 + k * 10 * MS, TS.serialize_cdr(G[F64](data=float(k)), F64))
    f = path / "flip.mcap"
    data = bytearray(f.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    f.write_bytes(bytes(data))
    with AnyReader([path], default_typestore=TS) as r:  # rosbags reads it short, silently
        assert 0 < sum(1 for _ in r.messages()) < 2000
    with pytest.raises(CorruptData, match=r"flip: topic /cmd \(std_msgs/msg/Float64\) gave "
                       r"\d+ messages, its index states 2000"):  # fmt: skip
        _import(path, tmp_path / "store")
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


def test_compressed_images_that_decode_past_the_cap_are_refused_before_decoding(tmp_path):
    """A PNG of a few KB decodes to 12 MB; held at 20 moments, it was decoded at each and
    all were stacked: 480 MB for a bag of a few KB, whatever max_episode_bytes said. The
    headers now state the decoded size first; each message is decoded once."""
    import io

    from PIL import Image

    typ = "sensor_msgs/msg/CompressedImage"
    buf = io.BytesIO()
    Image.fromarray(np.zeros((2000, 2000, 3), np.uint8)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 64 << 10
    header = G["std_msgs/msg/Header"](stamp=G["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                      frame_id="")  # fmt: skip
    png = G[typ](header=header, format="png", data=np.frombuffer(buf.getvalue(), np.uint8))
    bag = _bag(tmp_path / "pngs", extra=[("/c", typ, 10**9, png)])
    kw = {"topics": {"/cmd": "cmd", "/c": "c"}, "images": "decoded"}
    with pytest.raises(UnsafeInput, match=r"pngs, column 'c': its 20 moments' images decode to "
                       r"240,000,000 bytes, over max_episode_bytes \(67,108,864"):  # fmt: skip
        _import(bag, tmp_path / "store", max_episode_bytes=64 << 20, **kw)
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))


@pytest.mark.parametrize("kind", ["image", "jpeg"])
def test_a_message_held_at_many_moments_is_bounded_by_the_cap(tmp_path, kind):
    """One 3 MB message held at the clock's 20 moments made a column of 60 MB (one frame or
    one copy of the bytes per moment) whatever max_episode_bytes said: a big image under a
    fast clock asked for moments x its size. The column's size is now checked first."""
    bag = _big_bag(tmp_path / "held", kind, "MCAP", None)
    kw = {
        "topics": {"/cmd": "cmd", "/big": "big"},
        "images": "encoded" if kind == "jpeg" else "decoded",
    }
    with pytest.raises(UnsafeInput, match=r"held, column 'big': its 20 moments hold 62,914,560 "
                       r"bytes, over max_episode_bytes \(33,554,432"):  # fmt: skip
        _import(bag, tmp_path / "store", max_episode_bytes=32 << 20, **kw)
    assert nothing_committed(Client(str(tmp_path / "store")).project("p"))

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

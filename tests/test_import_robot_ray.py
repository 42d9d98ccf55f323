"""HDF5, Zarr and ROS bag imports on Ray (one task per file, 16 episodes or bag) equal the
single-process import, row for row, with the same commit message (import id included)."""

from __future__ import annotations

import pytest

import treadle as td
from ray_helpers import local_ray
from robot_fixtures import make_libero, make_replay_buffer, make_rosbag2
from treadle import importers
from treadle.catalog import Client

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:lance is not fork-safe")]


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    with local_ray() as ray:
        yield ray


def _same(client, one, res):
    assert res.rows == one.rows > 0 and res.episodes == one.episodes
    assert res.commit.message == one.commit.message
    a = client.project("one").branch("main").table("t").pin()
    b = client.project("ray").branch("main").table("t").pin()
    assert b.schema.equals(a.schema, check_metadata=True)
    assert b.to_arrow().equals(a.to_arrow())
    assert b.metadata == a.metadata and b.episode_sets() == a.episode_sets()


@pytest.mark.parametrize("fmt", ["hdf5", "zarr", "ros2"])
def test_on_ray_equals_one_process(tmp_path, local_root, ray_cluster, fmt):
    pytest.importorskip({"hdf5": "h5py", "zarr": "zarr", "ros2": "rosbags"}[fmt])
    client = Client(local_root)
    if fmt == "hdf5":
        src, fn, kw = make_libero(tmp_path / "libero"), importers.hdf5, {"images": "decoded"}
    elif fmt == "zarr":
        src, fn, kw = (
            make_replay_buffer(tmp_path / "b.zarr", [2] * 20),
            importers.zarr,
            {"images": "decoded"},
        )
    else:
        make_rosbag2(tmp_path / "bags" / "a", "mcap", seed=0)
        make_rosbag2(tmp_path / "bags" / "b", "sqlite3", seed=1)
        topics = {"/joint_states": "joints", "/depth": "depth", "/imu:linear_acceleration": "acc"}
        src, fn = tmp_path / "bags", importers.ros2
        kw = {"topics": topics, "fps": 30, "align": {"acc": "linear"}, "images": "decoded"}
    one = fn(str(src), client.project("one"), "t", progress=False, **kw)
    res = fn(str(src), client.project("ray"), "t", executor=td.RayExecutor(), **kw)
    _same(client, one, res)

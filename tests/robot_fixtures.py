"""Robot-data sources written by each format's own writer (h5py, zarr, rosbags), tiny."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np


def frames(n: int, h: int = 32, w: int = 32, seed: int = 0) -> np.ndarray:
    """Smooth moving gradients (compress well, so video PSNR is high)."""
    y, x = np.mgrid[0:h, 0:w]
    out = np.empty((n, h, w, 3), np.uint8)
    for t in range(n):
        out[t, ..., 0] = (x * 4 + t * 3 + seed * 10) % 256
        out[t, ..., 1] = (y * 4 + t * 2) % 256
        out[t, ..., 2] = ((x + y) * 2 + seed * 40) % 256
    return out


def make_robomimic(path: Path, lengths=None, *, images: bool = True) -> Path:
    """robomimic's layout: data/demo_<n>/{obs/*, next_obs/*, actions, rewards, dones,
    states}, data attrs env_args (JSON) and total, mask/{train,valid} of byte strings."""
    import h5py

    lengths = lengths or [5 + (i % 3) for i in range(12)]  # demo_0..demo_11
    rng = np.random.default_rng(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        env_args = {"env_name": "Lift", "type": 1, "env_kwargs": {"control_freq": 20}}
        data.attrs["env_args"] = json.dumps(env_args)
        data.attrs["total"] = int(sum(lengths))
        for i, n in enumerate(lengths):
            g = data.create_group(f"demo_{i}")
            g.attrs["num_samples"] = n
            g.attrs["ep_meta"] = json.dumps({"layout_id": i, "lang": f"task {i}"})  # RoboCasa
            g.create_dataset("actions", data=rng.standard_normal((n, 7)))
            g.create_dataset("rewards", data=np.arange(n, dtype=np.float64) / 10)
            g.create_dataset("dones", data=(np.arange(n) == n - 1).astype(np.int64))
            g.create_dataset("states", data=rng.standard_normal((n, 10)))
            for key in ("obs", "next_obs"):
                o = g.create_group(key)
                o.create_dataset(
                    "robot0_eef_pos", data=rng.standard_normal((n, 3)).astype(np.float32)
                )
                o.create_dataset("object", data=rng.standard_normal((n, 4)))
                if images:
                    o.create_dataset("agentview_image", data=frames(n, seed=i))
        mask = f.create_group("mask")
        names = [f"demo_{i}" for i in range(len(lengths))]
        mask.create_dataset("train", data=np.array(names[:-2], dtype="S"))
        mask.create_dataset("valid", data=np.array(names[-2:], dtype="S"))
    return path


def make_libero(
    folder: Path, tasks=("pick up the bowl", "open the drawer"), demos: int = 2
) -> Path:
    """LIBERO's layout: one file per task, each with its own demo_0..; agentview_rgb and
    eye_in_hand_rgb cameras; data attrs problem_info (JSON with language_instruction)."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    for k, task in enumerate(tasks):
        stem = task.replace(" ", "_") + "_demo"
        with h5py.File(folder / f"{stem}.hdf5", "w") as f:
            data = f.create_group("data")
            data.attrs["problem_info"] = json.dumps(
                {"problem_name": "libero", "domain_name": "kitchen", "language_instruction": task}
            )
            data.attrs["env_name"] = "Libero_Kitchen"
            for d in range(demos):
                n = 4 + d
                g = data.create_group(f"demo_{d}")
                g.attrs["num_samples"] = n
                g.create_dataset("actions", data=rng.standard_normal((n, 7)))
                o = g.create_group("obs")
                o.create_dataset("agentview_rgb", data=frames(n, seed=k * 10 + d))
                o.create_dataset("joint_states", data=rng.standard_normal((n, 7)))
                o.create_dataset("gripper_states", data=rng.standard_normal((n, 2)))
    return folder


def make_aloha(folder: Path, episodes: int = 2) -> Path:
    """ALOHA's layout: episode_<i>.hdf5 with /action, /observations/{qpos, qvel, images/top}."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for e in range(episodes):
        n = 6 + e
        with h5py.File(folder / f"episode_{e}.hdf5", "w") as f:
            f.attrs["sim"] = True
            f.create_dataset("action", data=rng.standard_normal((n, 14)))
            obs = f.create_group("observations")
            obs.create_dataset("qpos", data=rng.standard_normal((n, 14)))
            obs.create_dataset("qvel", data=rng.standard_normal((n, 14)))
            obs.create_group("images").create_dataset("top", data=frames(n, seed=e))
    return folder


#: ALOHA's recorder lists its cameras in this order (not h5py's, which is by name)
ALOHA_CAMERAS = ("cam_high", "cam_low", "cam_left_wrist")


def make_aloha_compressed(path: Path, n: int = 6, *, lengths: bool = True) -> Path:
    """An ALOHA file as its recorder writes it with COMPRESS=True: each frame
    ``cv2.imencode(".jpg", frame, [IMWRITE_JPEG_QUALITY, 50])``, zero-padded to the longest
    frame of any camera, ``/observations/images/<cam>`` ``uint8 [n, padded]``, the root
    attribute ``compress`` and ``/compress_len`` ``[cameras, n]`` (float32, h5py's default,
    rows in the recorder's camera order)."""
    import cv2
    import h5py

    rng = np.random.default_rng(5)
    jpegs = {
        cam: [cv2.imencode(".jpg", f, [int(cv2.IMWRITE_JPEG_QUALITY), 50])[1].tobytes()
              for f in frames(n, 24, 40, seed=3 * k)]
        for k, cam in enumerate(ALOHA_CAMERAS)
    }  # fmt: skip
    padded = max(len(b) for v in jpegs.values() for b in v)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["sim"] = False
        f.attrs["compress"] = True
        obs = f.create_group("observations")
        images = obs.create_group("images")
        for cam in ALOHA_CAMERAS:
            arr = np.zeros((n, padded), np.uint8)
            for i, b in enumerate(jpegs[cam]):
                arr[i, : len(b)] = np.frombuffer(b, np.uint8)
            images.create_dataset(cam, data=arr, chunks=(1, padded))
        obs.create_dataset("qpos", data=rng.standard_normal((n, 14)))
        f.create_dataset("action", data=rng.standard_normal((n, 14)))
        if lengths:
            table = f.create_dataset("compress_len", (len(ALOHA_CAMERAS), n))
            table[...] = [[len(b) for b in jpegs[cam]] for cam in ALOHA_CAMERAS]
    return path


def make_replay_buffer(
    path: Path, lengths=(5, 3, 7), *, zarr_format: int = 2, zip: bool = False
) -> Path:
    """Diffusion Policy's ReplayBuffer, as its ``ReplayBuffer.create_empty_zarr`` +
    ``add_episode`` leave it: data/{img, state, action} chunked along time, meta/episode_ends."""
    import zarr

    n = int(sum(lengths))
    rng = np.random.default_rng(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    store = zarr.storage.ZipStore(path, mode="w") if zip else str(path)
    root = zarr.create_group(store, zarr_format=zarr_format, attributes={"source": "pusht"})
    data = root.create_group("data")
    data.create_array("img", data=frames(n, 24, 24), chunks=(4, 24, 24, 3))
    data.create_array("state", data=rng.standard_normal((n, 5)).astype(np.float32), chunks=(4, 5))
    data.create_array("action", data=rng.standard_normal((n, 2)).astype(np.float32), chunks=(4, 2))
    data.create_array("n_contacts", data=rng.integers(0, 4, (n, 1)).astype(np.float32))
    meta = root.create_group("meta")
    meta.create_array("episode_ends", data=np.cumsum(lengths).astype(np.int64))
    if zip:
        store.close()
    return path


def make_umi_zip(path: Path, lengths=(2, 4)) -> Path:
    """A UMI-style ``.zarr.zip``: zarr format 2 in a zip store, camera frames one per chunk
    compressed with JPEG XL (imagecodecs' numcodecs codec, as UMI's ``Jpegxl``)."""
    import zarr
    from imagecodecs.numcodecs import Jpegxl

    n = int(sum(lengths))
    rng = np.random.default_rng(7)
    path.parent.mkdir(parents=True, exist_ok=True)
    store = zarr.storage.ZipStore(path, mode="w")
    root = zarr.create_group(store, zarr_format=2)
    data = root.create_group("data")
    data.create_array("camera0_rgb", data=frames(n, 16, 24), chunks=(1, 16, 24, 3),
                      compressors=Jpegxl(level=80))  # fmt: skip
    pos = rng.standard_normal((n, 3)).astype(np.float32)
    data.create_array("robot0_eef_pos", data=pos, chunks=(n, 3))
    meta = root.create_group("meta")
    meta.create_array("episode_ends", data=np.cumsum(lengths).astype(np.int64))
    store.close()
    return path


# -- ROS bags -------------------------------------------------------------------------------

T0 = 1_700_000_000 * 10**9  # a bag's first header stamp (ns)


def _stamp(ts, t):
    Time = ts.types["builtin_interfaces/msg/Time"]
    return Time(sec=int(t // 10**9), nanosec=int(t % 10**9))


def _header(ts, t, ros1=False):
    Header = ts.types["std_msgs/msg/Header"]
    if ros1:
        return Header(seq=0, stamp=_stamp(ts, t), frame_id="")
    return Header(stamp=_stamp(ts, t), frame_id="")


def ros_messages(seed: int = 0, seconds: float = 0.5):
    """``(topic, msgtype, header stamp ns, builder(ts, ros1) -> message)`` in log order, with
    jittered stamps: joints at 100 Hz, a raw camera at 30 Hz, a JPEG camera at 15 Hz, 16-bit
    depth at 10 Hz, a gripper command at 10 Hz, a pose at 20 Hz, an IMU at 50 Hz, a task once."""
    rng = np.random.default_rng(seed)
    out = []

    def every(topic, msgtype, hz, build, start=0):
        n = int(seconds * hz) + 1
        for i in range(n):
            t = T0 + start + int(i * 1e9 / hz) + int(rng.integers(0, 2_000_000))
            out.append((topic, msgtype, t, partial_build(build, i, t)))

    def partial_build(build, i, t):
        return lambda ts, ros1=False: build(ts, i, t, ros1)

    def joints(ts, i, t, ros1):
        names = ["j0", "j1", "j2"] if i % 7 != 3 else ["j2", "j0", "j1"]  # order varies
        pos = {"j0": i * 0.01, "j1": np.sin(i / 10), "j2": -i * 0.02}
        return ts.types["sensor_msgs/msg/JointState"](
            header=_header(ts, t, ros1), name=names,
            position=np.array([pos[n] for n in names]),
            velocity=np.array([pos[n] * 2 for n in names]), effort=np.zeros(0),
        )  # fmt: skip

    def raw(ts, i, t, ros1):
        f = frames(1, 16, 16, seed=i)[0]
        return ts.types["sensor_msgs/msg/Image"](
            header=_header(ts, t, ros1), height=16, width=16, encoding="rgb8", is_bigendian=0,
            step=48, data=f.reshape(-1),
        )  # fmt: skip

    def jpeg(ts, i, t, ros1):
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(frames(1, 16, 16, seed=100 + i)[0]).save(buf, format="JPEG", quality=95)
        return ts.types["sensor_msgs/msg/CompressedImage"](
            header=_header(ts, t, ros1), format="rgb8; jpeg compressed bgr8",
            data=np.frombuffer(buf.getvalue(), np.uint8),
        )  # fmt: skip

    def depth(ts, i, t, ros1):
        d = (np.arange(8 * 8, dtype=np.uint16).reshape(8, 8) * 1000 + i).astype("<u2")
        return ts.types["sensor_msgs/msg/Image"](
            header=_header(ts, t, ros1), height=8, width=8, encoding="16UC1", is_bigendian=0,
            step=16, data=d.view(np.uint8).reshape(-1),
        )  # fmt: skip

    def gripper(ts, i, t, ros1):
        return ts.types["std_msgs/msg/Float64"](data=float(i % 2) + i * 0.1)

    def pose(ts, i, t, ros1):
        g = ts.types
        p = g["geometry_msgs/msg/Pose"](
            position=g["geometry_msgs/msg/Point"](x=i * 1.0, y=2.0, z=3.0),
            orientation=g["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
        )
        return g["geometry_msgs/msg/PoseStamped"](header=_header(ts, t, ros1), pose=p)

    def imu(ts, i, t, ros1):
        g = ts.types
        v3 = g["geometry_msgs/msg/Vector3"]
        zeros = np.zeros(9)
        kw = dict(header=_header(ts, t, ros1),
                  orientation=g["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
                  orientation_covariance=zeros, angular_velocity=v3(x=0.0, y=0.0, z=i * 1.0),
                  angular_velocity_covariance=zeros,
                  linear_acceleration=v3(x=i * 0.5, y=0.0, z=9.8),
                  linear_acceleration_covariance=zeros)  # fmt: skip
        return g["sensor_msgs/msg/Imu"](**kw)

    def task(ts, i, t, ros1):
        return ts.types["std_msgs/msg/String"](data="stack the cups")

    every("/joint_states", "sensor_msgs/msg/JointState", 100, joints)
    every("/camera/image_raw", "sensor_msgs/msg/Image", 30, raw, start=3_000_000)
    every("/camera/compressed", "sensor_msgs/msg/CompressedImage", 15, jpeg, start=5_000_000)
    every("/depth", "sensor_msgs/msg/Image", 10, depth, start=1_000_000)
    every("/gripper", "std_msgs/msg/Float64", 10, gripper, start=7_000_000)
    every("/pose", "geometry_msgs/msg/PoseStamped", 20, pose)
    every("/imu", "sensor_msgs/msg/Imu", 50, imu)
    out.append(("/task", "std_msgs/msg/String", T0 + 150_000_000, partial_build(task, 0, 0)))
    # log times a few ms after the stamps; written in log order
    logged = [(m[2] + 3_000_000 + int(rng.integers(0, 3_000_000)), k, m) for k, m in enumerate(out)]
    logged.sort()
    return [(m[0], m[1], m[2], log, m[3]) for log, _, m in logged]


def make_rosbag2(path: Path, storage: str = "mcap", seed: int = 0) -> Path:
    """A rosbag2 folder written by rosbags' Writer (MCAP or SQLite storage)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    path.parent.mkdir(parents=True, exist_ok=True)
    with Writer(path, version=9, storage_plugin=plugin) as w:
        conns = {}
        for topic, msgtype, _, log, build in ros_messages(seed):
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts)
            w.write(conns[topic], log, ts.serialize_cdr(build(ts), msgtype))
    return path


def make_rosbag1(path: Path, seed: int = 0, compression: str | None = None) -> Path:
    """A ROS 1 .bag written by rosbags' rosbag1 Writer (joints, gripper and task only),
    its chunks compressed when ``compression`` is ``"bz2"`` or ``"lz4"``."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS1_NOETIC)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = ("/joint_states", "/gripper", "/task")
    w = Writer(path)
    if compression is not None:
        w.set_compression(Writer.CompressionFormat[compression.upper()])
    with w:
        conns = {}
        for topic, msgtype, _, log, build in ros_messages(seed):
            if topic not in keep:
                continue
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts)
            w.write(conns[topic], log, ts.serialize_ros1(build(ts, True), msgtype))
    return path

"""Robot-data sources written by each format's own writer (h5py, zarr, rosbags), tiny."""

from __future__ import annotations

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

"""Shared by the loader tests and their subprocesses: a small robotics project, hashes."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

import treadle as td

WINDOWS = {"cam": td.Video(range(4)), "action": td.Rows(range(4))}


def make_project(
    root: str,
    episodes: int = 3,
    frames: int = 24,
    seed: int = 0,
    storage_options: dict | None = None,
    streams: dict | None = None,
) -> td.Branch:
    """Two time-indexed tables with an H.264 camera (32x32) and a 7-d action.

    ``streams`` (a dict shared between calls) encodes each episode once and stores those
    bytes in every project made with it: x264 does not always give the same bytes for the
    same frames (seen on a busy machine), so two projects compared frame for frame share
    their encodes."""
    rng = np.random.default_rng(seed)
    client = td.Client(root, storage_options=storage_options, create=storage_options is None)
    branch = client.project("robotics").branch()
    with branch.transaction("demo data") as tx:
        for name in ("failed", "nominal"):
            for e in range(episodes):
                video = rng.integers(0, 255, (frames, 32, 32, 3), dtype=np.uint8)
                cam = td.VideoFrames(video, fps=30)
                if streams is not None:
                    from treadle.video.encode import encode_value

                    cam = streams.setdefault(hashlib.sha256(video).hexdigest(), encode_value(cam))
                tx.table(name).append_episode(
                    {
                        "cam": cam,
                        "action": rng.random((frames, 7), dtype=np.float32),
                    },
                    episode=f"{name}-{e}",
                )
    return branch


def recipe(branch: td.Branch, batch_size: int = 8, seed: int = 2048) -> td.Recipe:
    w = td.Windows(WINDOWS)
    return td.Recipe(
        seed=seed,
        batch_size=batch_size,
        components=[
            td.Component(branch.table("failed"), w, weight=0.3),
            td.Component(branch.table("nominal"), w, weight=0.7),
        ],
    )


def same_batches(got: list[dict], want: list[dict]) -> None:
    """Assert two runs' batches hold the same keys and equal values, batch by batch."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def sample_hashes(batch: dict) -> list[str]:
    """One content hash per sample of a batch (every tensor's bytes of that sample)."""
    n = len(batch["_moment"])
    out = []
    for i in range(n):
        h = hashlib.sha256()
        for k in sorted(batch):
            h.update(k.encode())
            h.update(batch[k][i].contiguous().numpy().tobytes())
        out.append(h.hexdigest()[:16])
    return out


def batch_hash(batch: dict) -> str:
    return hashlib.sha256("".join(sample_hashes(batch)).encode()).hexdigest()[:16]


def emit(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


if __name__ == "__main__":  # pragma: no cover - used by subprocess tests
    print("helpers", file=sys.stderr)

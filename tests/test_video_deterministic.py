"""An encode is a function of its frames: the same frames give the same bytes (media key)."""

from __future__ import annotations

import numpy as np

import treadle as td


def test_the_same_frames_encode_to_the_same_stream_every_time(tmp_path):
    """Before the fix (libx264 with frame threads: FFmpeg's automatic count) an encode of
    the same frames gave other bytes now and then on a busy machine (1 in 15 to 1 in 10):
    two writes of one episode stored two streams, and an az:// table read back other
    frames than the same recipe written locally."""
    from concurrent.futures import ThreadPoolExecutor

    from treadle.video.encode import encode_frames

    # x264's frame threads made different choices when the cores were busy: encode
    # concurrently so that they are
    with ThreadPoolExecutor(4) as pool:
        for seed in range(6):
            frames = np.random.default_rng(seed).integers(0, 255, (16, 32, 32, 3), np.uint8)
            keys = set(pool.map(lambda _, f=frames: encode_frames(f, fps=30).sha256, range(16)))
            assert len(keys) == 1, f"seed {seed}: {len(keys)} encodes of the same frames"
    # two tables written with the same episode share one media object
    frames = np.random.default_rng(7).integers(0, 255, (24, 48, 48, 3), dtype=np.uint8)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for name in ("a", "b", "c", "d"):
        branch.table(name).append_episode({"cam": td.VideoFrames(frames, fps=30)}, episode="e")
    media = branch.project.client.store.list("projects/p/media")
    assert len({k.rsplit("/", 1)[-1] for k in media}) == 1, media

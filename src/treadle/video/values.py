"""Values a user puts into a video column: raw frames or an already-encoded file."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from treadle.errors import VideoError

_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
)


def check_frames(frames: object) -> np.ndarray:
    """``frames`` as a ``uint8 [T, H, W, 3]`` array with even ``H``/``W``, else :class:`VideoError`."""
    if not isinstance(frames, np.ndarray):
        raise VideoError(f"video frames must be a numpy array, got {type(frames).__name__}")
    if frames.dtype != np.uint8:
        raise VideoError(f"video frames must be uint8, got {frames.dtype}")
    if frames.ndim != 4 or frames.shape[3] != 3:
        raise VideoError(f"video frames must have shape [T, H, W, 3] (RGB), got {frames.shape}")
    t, h, w, _ = frames.shape
    if t < 1:
        raise VideoError("video has no frames (T=0)")
    if h < 2 or w < 2 or h % 2 or w % 2:
        raise VideoError(
            f"video frame size {h}x{w} (HxW) must be even in both dimensions (H.264 with "
            "4:2:0 chroma needs it); crop or pad the frames"
        )
    return frames


def check_fps(fps: object) -> float:
    try:
        f = float(fps)
    except (TypeError, ValueError):
        raise VideoError(f"fps must be a number, got {fps!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise VideoError(f"fps must be positive and finite, got {fps!r}")
    return f


def check_encoder(gop: object, crf: object, preset: object) -> tuple[int, int, str]:
    if isinstance(gop, bool) or not isinstance(gop, int) or gop < 1:
        raise VideoError(f"gop (keyframe interval) must be an integer >= 1, got {gop!r}")
    if isinstance(crf, bool) or not isinstance(crf, int) or not 0 <= crf <= 51:
        raise VideoError(f"crf must be an integer in 0..51, got {crf!r}")
    if preset not in _PRESETS:
        raise VideoError(f"preset must be one of {_PRESETS}, got {preset!r}")
    return gop, crf, str(preset)


@dataclass(frozen=True, eq=False)
class VideoFrames:
    """Raw RGB frames ``uint8 [T, H, W, 3]`` to encode as H.264.

    ``gop`` is the fixed keyframe interval (30-60 is the sweet spot for 90-frame windows),
    ``crf`` the x264 quality (lower is better, 0 is lossless luma/chroma *after* the
    RGB->YUV 4:2:0 conversion, which is itself lossy), ``preset`` the x264 speed preset.
    Height and width must be even.
    """

    frames: np.ndarray
    fps: float = 30.0
    gop: int = 30
    crf: int = 23
    preset: str = "medium"

    def __post_init__(self) -> None:
        check_frames(self.frames)
        object.__setattr__(self, "fps", check_fps(self.fps))
        check_encoder(self.gop, self.crf, self.preset)

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


@dataclass(frozen=True, eq=False)
class VideoFile:
    """An already-encoded video (MP4, MKV, ... as a path or the file's bytes).

    H.264 is remuxed to Annex-B without re-encoding; any other codec FFmpeg can decode
    (AV1, VP9, HEVC, MPEG-4, ...) is decoded and re-encoded to H.264 with ``gop``,
    ``crf`` and ``preset`` (one stored codec keeps one decode path, CPU and GPU).
    ``fps`` overrides the file's frame rate (a raw ``.h264`` stream has none).
    """

    source: str | os.PathLike[str] | bytes
    fps: float | None = None
    gop: int = 30
    crf: int = 23
    preset: str = "medium"

    def __post_init__(self) -> None:
        if isinstance(self.source, (bytes, bytearray, memoryview)):
            if len(self.source) == 0:
                raise VideoError("video file bytes are empty")
            object.__setattr__(self, "source", bytes(self.source))
        elif isinstance(self.source, (str, os.PathLike)):
            if not os.path.isfile(self.source):
                raise VideoError(f"video file {os.fspath(self.source)!r} does not exist")
        else:
            raise VideoError(f"VideoFile takes a path or bytes, got {type(self.source).__name__}")
        if self.fps is not None:
            object.__setattr__(self, "fps", check_fps(self.fps))
        check_encoder(self.gop, self.crf, self.preset)

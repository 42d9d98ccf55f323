"""Camera columns of imported robot data: ``images="video" | "encoded" | "decoded"``, and PSNR.

The robot-data importers (HDF5, Zarr, ROS 2) hand each episode's frames to
:func:`camera_value`, which turns them into what ``append_episode`` stores:

- ``"video"``: H.264 (``td.VideoFrames`` settings ``gop`` 30, ``crf`` 23), encoded here so the
  frames the table will deliver are decoded once and compared with the source's: the
  column's PSNR goes into the import's report (:class:`CameraReport`), lossy by design;
- ``"encoded"``: one image file per moment. Bytes that already are an image file (a ROS
  ``CompressedImage``) are kept as they are; raw pixels (HDF5 datasets, Zarr arrays) become
  lossless PNG, so every decoded pixel equals the source's;
- ``"decoded"``: the ``uint8 [T, H, W, C]`` array as it is (exact).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treadle.errors import SchemaMismatch
from treadle.importers.images import decode_image
from treadle.video import EncodedStream, encode_frames

#: the ``images`` values of the robot-data importers
CAMERA_MODES = ("video", "encoded", "decoded")
#: H.264 settings of ``images="video"`` (those of ``td.VideoFrames``)
VIDEO_GOP, VIDEO_CRF = 30, 23


def check_camera_mode(images: str) -> str:
    """``images``, or ``ValueError`` for anything but ``"video"``, ``"encoded"``, ``"decoded"``."""
    if images not in CAMERA_MODES:
        raise ValueError(f"images must be one of {CAMERA_MODES}, got {images!r}")
    return images


def is_camera(shape: Sequence[int], dtype: Any) -> bool:
    """A dataset of ``uint8 [N, H, W, 3]``: an RGB camera."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 4 and shape[-1] == 3


@dataclass
class CameraReport:
    """Squared error and pixel count per ``images="video"`` column, summed over episodes;
    ``topics``: what a ROS import reports of each bag's topics."""

    squared_error: dict[str, float] = field(default_factory=dict)
    values: dict[str, int] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    topics: list[dict[str, Any]] = field(default_factory=list)

    def add(self, episode: str, column: str, source: np.ndarray, decoded: np.ndarray) -> None:
        err = float(np.square(source.astype(np.float64) - decoded.astype(np.float64)).sum())
        self.squared_error[column] = self.squared_error.get(column, 0.0) + err
        self.values[column] = self.values.get(column, 0) + source.size
        self.rows.append(
            {
                "episode": episode,
                "column": column,
                "video": "encoded",
                "why": "raw frames encoded to H.264 (lossy)",
                "psnr_db": psnr(err, source.size),
            }
        )

    def psnr(self) -> dict[str, float]:
        """Per video column, the PSNR (dB) of all its frames against the source's."""
        return {c: psnr(e, self.values[c]) for c, e in self.squared_error.items()}


def psnr(squared_error: float, values: int) -> float:
    """Peak signal-to-noise ratio of 8-bit values (``inf`` when equal)."""
    if squared_error == 0 or values == 0:
        return math.inf
    return round(10 * math.log10(255.0**2 * values / squared_error), 3)


def camera_value(
    frames: np.ndarray,
    images: str,
    fps: float,
    episode: str,
    column: str,
    report: CameraReport | None,
) -> Any:
    """``uint8 [T, H, W, 3]`` frames as the value ``append_episode`` stores for ``images``."""
    if images == "decoded":
        return frames
    if images == "encoded":
        return [png_bytes(f) for f in frames]
    where = f"episode {episode!r}, camera {column!r}"
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise SchemaMismatch(
            f"{where}: frames of {frames.shape[1]}x{frames.shape[2]} cannot be H.264 video "
            "(odd size); import with images='encoded' or 'decoded'"
        )
    stream = encode_frames(frames, fps=fps, gop=VIDEO_GOP, crf=VIDEO_CRF)
    if report is not None:
        report.add(episode, column, frames, decode_stream(stream))
    return stream


def png_bytes(frame: np.ndarray) -> bytes:
    """One frame (``uint8 [H, W, 3]``, ``[H, W, 1]``, ``[H, W]``; ``uint16`` grey) as PNG."""
    from PIL import Image

    arr = frame[..., 0] if frame.ndim == 3 and frame.shape[-1] == 1 else frame
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def decode_stream(stream: EncodedStream) -> np.ndarray:
    """Every frame of ``stream`` as ``uint8 [T, H, W, 3]`` RGB (PyAV, display order)."""
    import av

    ctx = av.CodecContext.create("h264", "r")
    frames = []
    idx = stream.index
    for i in np.argsort(idx.decode, kind="stable"):
        start = int(idx.offset[i])
        frames.extend(ctx.decode(av.Packet(stream.data[start : start + int(idx.size[i])])))
    frames.extend(ctx.decode(None))
    return np.stack([f.to_ndarray(format="rgb24") for f in frames])


def encoded_image(data: bytes, images: str, where: str) -> Any:
    """One image file (JPEG/PNG bytes) kept (``"encoded"``) or decoded to pixels."""
    if images == "encoded":
        return bytes(data)
    return decode_image(data, "", where)

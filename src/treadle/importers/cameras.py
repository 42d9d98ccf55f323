"""Camera columns of imported robot data: ``images="video" | "encoded" | "decoded"``, and PSNR.

The robot-data importers (HDF5, Zarr, ROS 2) hand each episode's frames to
:func:`camera_value`, which turns them into what ``append_episode`` stores:

- ``"video"``: H.264 through :func:`~treadle.importers.camera_video.encode_camera` (treadle's
  encoder settings), decoded once again and compared with the source's frames: each
  column's bytes and PSNR go into ``ImportResult.cameras`` (:class:`Reports`), lossy by design;
- ``"encoded"``: one image file per moment. Bytes that already are an image file (a ROS
  ``CompressedImage``) are kept as they are; raw pixels (HDF5 datasets, Zarr arrays) become
  lossless PNG, so every decoded pixel equals the source's;
- ``"decoded"``: the ``uint8 [T, H, W, C]`` array as it is (exact).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treadle.errors import SchemaMismatch
from treadle.importers.camera_video import CameraReport, encode_camera
from treadle.importers.images import decode_image

#: the ``images`` values of the robot-data importers
CAMERA_MODES = ("video", "encoded", "decoded")


def check_camera_mode(images: str) -> str:
    """``images``, or ``ValueError`` for anything but ``"video"``, ``"encoded"``, ``"decoded"``."""
    if images not in CAMERA_MODES:
        raise ValueError(f"images must be one of {CAMERA_MODES}, got {images!r}")
    return images


def is_camera(shape: Sequence[int], dtype: Any) -> bool:
    """A dataset of ``uint8 [N, H, W, 3]``: an RGB camera."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 4 and shape[-1] == 3


@dataclass
class Reports:
    """What an import reports of its cameras (per column, :class:`CameraReport`: stored as
    what, bytes before and after, PSNR) and, for ROS bags, of each bag's topics."""

    images: str
    cameras: dict[str, CameraReport] = field(default_factory=dict)
    topics: list[dict[str, Any]] = field(default_factory=list)

    def camera(self, column: str) -> CameraReport:
        if column not in self.cameras:
            self.cameras[column] = CameraReport(column, stored_as=self.images)
        return self.cameras[column]

    def rows(self) -> list[dict[str, Any]]:
        """``ImportResult.cameras``: one row per camera column, in the order first seen."""
        return [r.as_dict() for r in self.cameras.values()]


def camera_value(
    frames: np.ndarray,
    images: str,
    fps: float,
    episode: str,
    column: str,
    report: Reports | None,
    source_bytes: int | None = None,
) -> Any:
    """``uint8 [T, H, W, 3]`` frames as the value ``append_episode`` stores for ``images``
    (``source_bytes``: what the frames took in the source; default their raw size)."""
    nbytes = frames.nbytes if source_bytes is None else source_bytes
    if images != "video":
        if report is not None:
            report.camera(column).add(nbytes, None, None)
        return frames if images == "decoded" else [png_bytes(f) for f in frames]
    where = f"episode {episode!r}, camera {column!r}"
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise SchemaMismatch(
            f"{where}: frames of {frames.shape[1]}x{frames.shape[2]} cannot be H.264 video "
            "(odd size); import with images='encoded' or 'decoded'"
        )
    stream, frame_psnr = encode_camera(frames, fps, where)
    if report is not None:
        report.camera(column).add(nbytes, stream, frame_psnr)
    return stream


def png_bytes(frame: np.ndarray) -> bytes:
    """One frame (``uint8 [H, W, 3]``, ``[H, W, 1]``, ``[H, W]``; ``uint16`` grey) as PNG."""
    from PIL import Image

    arr = frame[..., 0] if frame.ndim == 3 and frame.shape[-1] == 1 else frame
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def encoded_image(data: bytes, images: str, where: str) -> Any:
    """One image file (JPEG/PNG bytes) kept (``"encoded"``) or decoded to pixels."""
    if images == "encoded":
        return bytes(data)
    return decode_image(data, "", where)

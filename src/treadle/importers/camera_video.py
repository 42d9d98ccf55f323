"""Camera frames an importer turns into video: encoded to H.264 once, and how faithful it is.

Importers whose sources hold cameras as one encoded image per step (RLDS) store them, with
``images="video"``, as one H.264 stream per episode and camera
(:func:`~treadle.video.encode_frames`, treadle's own encoder settings). :func:`encode_camera`
also decodes that stream again and measures its PSNR against the frames it was given (the
source images' own decode); :class:`CameraReport` sums it up per camera for
``ImportResult.cameras``: bytes before (the source's encoded images) and after (the
stream), and the PSNR's mean and minimum over frames. Identical frames count as
:data:`PSNR_IDENTICAL` dB (a number JSON can hold, not infinity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from treadle.errors import VideoError
from treadle.video import EncodedStream, encode_frames

#: the PSNR reported for a frame stored without any loss
PSNR_IDENTICAL = 100.0


def decode_stream(stream: EncodedStream) -> np.ndarray:
    """An :class:`EncodedStream`'s frames, decoded in display order as RGB (``[T, H, W, 3]``)."""
    ctx: Any = av.CodecContext.create("h264", "r")
    idx = stream.index
    frames = []
    for d in np.argsort(idx.decode, kind="stable"):  # packets in decode order, by the index
        at, size = int(idx.offset[d]), int(idx.size[d])
        frames.extend(ctx.decode(av.Packet(stream.data[at : at + size])))
    frames.extend(ctx.decode(None))
    return np.stack([f.to_ndarray(format="rgb24") for f in frames])


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-frame PSNR (dB) of ``b`` against ``a`` (both ``uint8 [T, ...]``)."""
    diff = a.astype(np.int64) - b  # exact squares, no overflow at any frame size
    mse = np.einsum("ij,ij->i", diff.reshape(len(a), -1), diff.reshape(len(a), -1)) / (diff[0].size)
    with np.errstate(divide="ignore"):
        db = 10 * np.log10(255.0**2 / mse)
    return np.minimum(db, PSNR_IDENTICAL)


def encode_camera(frames: np.ndarray, fps: float, where: str) -> tuple[EncodedStream, np.ndarray]:
    """``frames`` (``uint8 [T, H, W, 3]``) as H.264 at ``fps``, and each frame's PSNR."""
    try:
        stream = encode_frames(frames, fps=fps)
    except VideoError as e:
        raise VideoError(f"{where}: {e}") from None
    decoded = decode_stream(stream)
    if decoded.shape != frames.shape:
        raise VideoError(
            f"{where}: the encoded stream decodes to {decoded.shape}, not {frames.shape}"
        )
    return stream, psnr(frames, decoded)


@dataclass
class CameraReport:
    """Per camera (column): bytes before and after, PSNR over every frame, episodes."""

    column: str
    source_bytes: int = 0
    stored_bytes: int = 0
    frames: int = 0
    episodes: int = 0
    psnr_sum: float = 0.0
    psnr_min: float = math.inf
    stored_as: str = "video"
    why: str = ""

    def add(self, source_bytes: int, stream: EncodedStream | None, frame_psnr: Any) -> None:
        """One episode of this camera: its source bytes, its stream and per-frame PSNR
        (``stream`` None when the images were kept as they are)."""
        self.source_bytes += source_bytes
        self.episodes += 1
        if stream is None:
            self.stored_bytes += source_bytes
            return
        self.stored_bytes += len(stream.data)
        self.frames += len(frame_psnr)
        self.psnr_sum += float(np.sum(frame_psnr))
        self.psnr_min = min(self.psnr_min, float(np.min(frame_psnr)))

    def as_dict(self) -> dict[str, Any]:
        """The ``ImportResult.cameras`` row (``psnr_*`` None when nothing was encoded)."""
        encoded = self.frames > 0
        return {
            "column": self.column,
            "stored_as": self.stored_as,
            "episodes": self.episodes,
            "source_bytes": self.source_bytes,
            "stored_bytes": self.stored_bytes,
            "psnr_mean_db": round(self.psnr_sum / self.frames, 3) if encoded else None,
            "psnr_min_db": round(self.psnr_min, 3) if encoded else None,
            **({"why": self.why} if self.why else {}),
        }

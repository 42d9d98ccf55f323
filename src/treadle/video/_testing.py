"""Helpers for video tests and benchmarks: synthetic clips, reference decodes, test MP4s."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np


def synthetic_frames(t: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """``uint8 [t, h, w, 3]``: moving gradients plus a little noise (P-frames carry data)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    ts = np.arange(t)[:, None, None]
    r = (x[None] * 2 + ts * 3) % 256
    g = (y[None] * 2 + ts * 5) % 256
    b = ((x + y)[None] + ts * 7) % 256
    frames = np.stack([r, g, b], axis=-1).astype(np.int16)
    frames += rng.integers(-8, 9, frames.shape, dtype=np.int16)
    return np.clip(frames, 0, 255).astype(np.uint8)


def reference_decode(data: bytes, fmt: str | None = None) -> np.ndarray:
    """Sequential decode of a whole file (FFmpeg demuxer + decoder), RGB, display order."""
    with av.open(io.BytesIO(data), format=fmt) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    return np.stack(frames)


def reference_frames(data: bytes, fmt: str | None = None) -> list[av.VideoFrame]:
    """Sequential decode, the frames themselves (for resize references)."""
    with av.open(io.BytesIO(data), format=fmt) as c:
        return list(c.decode(video=0))


def make_mp4(
    frames: np.ndarray,
    *,
    codec: str = "libx264",
    fps: int = 30,
    options: dict[str, str] | None = None,
    fmt: str = "mp4",
    first_pts: int = 0,
) -> bytes:
    """Mux ``frames`` into an MP4/MKV with ``codec`` (e.g. libx264 with B-frames, mpeg4).

    A negative ``first_pts`` makes the MP4 muxer write an edit list that hides those frames.
    """
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=Fraction(fps))
        s.width, s.height = frames.shape[2], frames.shape[1]
        s.pix_fmt = "yuv420p"
        if options:
            s.options = options
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = first_pts + i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


def store_stream(root: str, stream, table: str = "grasps", data: bytes | None = None):
    """Put ``stream`` (or other ``data`` in its place) under ``projects/p/`` of a new local
    store at ``root``, as a table write would; returns ``(store, key, index)``."""
    from treadle.storage import Store
    from treadle.video.column_layout import index_from_arrow, index_to_arrow

    store = Store.open(root, create=True)
    key = stream.media_key(table)
    store.put(f"projects/p/{key}", stream.data if data is None else data)
    _, index = index_from_arrow(index_to_arrow(key, stream))
    return store, key, index


def h264_filter(annexb: bytes, spec: str) -> bytes:
    """A raw Annex-B H.264 stream passed through FFmpeg bitstream filter ``spec`` (e.g.
    ``"h264_metadata=crop_left=2"``, which rewrites every SPS's crop fields)."""
    with av.open(io.BytesIO(annexb), format="h264") as c:
        stream = c.streams.video[0]
        bsf = av.BitStreamFilterContext(spec, in_stream=stream)
        out = [bytes(q) for p in c.demux(stream) if p.size for q in bsf.filter(p)]
        out += [bytes(q) for q in bsf.filter(None)]
    return b"".join(out)


def annexb_to_mp4(annexb: bytes, fps: int = 30, first_pts: int = 0) -> bytes:
    """A raw Annex-B H.264 stream without B-frames muxed into an MP4 as it is (stream copy),
    frame ``i`` at ``(first_pts + i) / fps`` s (a negative ``first_pts``: an edit list)."""
    buf = io.BytesIO()
    with av.open(io.BytesIO(annexb), format="h264") as c, av.open(buf, "w", format="mp4") as o:
        src = c.streams.video[0]
        dst = o.add_stream_from_template(src)
        dst.time_base = Fraction(1, fps)
        i = 0
        for p in c.demux(src):
            if not p.size:
                continue
            p.stream, p.time_base = dst, Fraction(1, fps)
            p.pts = p.dts = first_pts + i
            p.duration = 1
            o.mux(p)
            i += 1
    return buf.getvalue()

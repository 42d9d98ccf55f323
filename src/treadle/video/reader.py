"""Batch window reads: plan -> fetch (one coalesced ``get_ranges``) -> verify -> decode.

Decoding runs on a small thread pool with one decoder context per thread. PyAV 18
releases the GIL inside ``avcodec`` decode and ``sws_scale`` (measured: a pure-Python
thread keeps full speed during a long decode call), so window decodes of 224x224 and
larger frames run in parallel across threads when cores are free; for tiny frames the
per-packet Python work dominates and threads help little (``bench/video_windows.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treadle.errors import NotFound, StorageError, TreadleError, VideoError
from treadle.plan.windows import Video
from treadle.storage import RangeRequest, Store
from treadle.video.colour import window_tags
from treadle.video.decode import (
    Decoder,
    allocate,
    check_out,
    decode_window,
    finish_window,
    verify_window,
    where_text,
)
from treadle.video.stream import StreamIndex
from treadle.video.window import WindowPlan, plan_window


@dataclass(frozen=True, eq=False)
class WindowRequest:
    """One window: display ``frames`` (output order) of the stream at ``key``.

    ``key`` is the stream object's key relative to the reader's ``prefix`` (for a table
    column, the ``stream`` field, e.g. ``media/<table>/<sha>.h264``, with
    ``prefix="projects/<project>"``). ``index`` is the episode's whole index
    (:func:`treadle.video.layout.index_from_arrow`). ``where`` = (table, episode, column)
    names the window in errors. ``out``, when given, is filled in place (numpy array or
    CPU torch tensor of the spec's shape and dtype, e.g. a slice of the batch buffer).
    """

    key: str
    index: StreamIndex
    frames: np.ndarray | Sequence[int]
    spec: Video
    where: tuple[str, str, str] | str | None = None
    out: Any = None

    @classmethod
    def at(
        cls,
        key: str,
        index: StreamIndex,
        start: int,
        spec: Video,
        where: tuple[str, str, str] | str | None = None,
        out: Any = None,
    ) -> WindowRequest:
        """The window of ``spec`` at episode frame ``start``: frames ``start + spec.offsets``."""
        frames = int(start) + np.asarray(spec.offsets, dtype=np.int64)
        return cls(key, index, frames, spec, where, out)


@dataclass
class ReadStats:
    """Costs of one :meth:`VideoReader.read` call."""

    windows: int = 0
    bytes_read: int = 0
    packets_decoded: int = 0
    frames_out: int = 0
    fetch_s: float = 0.0
    decode_s: float = 0.0
    window_bytes: list[int] = field(default_factory=list)


class VideoReader:
    """Reads batches of video windows from a :class:`~treadle.storage.Store`.

    ``threads`` decode threads (each with its own H.264 context, reused and flushed
    between windows); ``decoder_threads`` is FFmpeg's own thread count per context.
    """

    def __init__(
        self, store: Store, *, threads: int = 1, prefix: str = "", decoder_threads: int = 1
    ):
        if threads < 1 or decoder_threads < 0:
            raise VideoError("VideoReader needs threads >= 1 and decoder_threads >= 0")
        self.store = store
        self.prefix = prefix.strip("/")
        self.threads = threads
        self.decoder_threads = decoder_threads
        self._local = threading.local()
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="treadle-video") if threads > 1 else None
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decoder(self) -> Decoder:
        dec = getattr(self._local, "decoder", None)
        if dec is None:
            dec = self._local.decoder = Decoder(self.decoder_threads)
        return dec

    def object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- stages -------------------------------------------------------------------------
    def plan(self, requests: Sequence[WindowRequest]) -> list[WindowPlan]:
        out = []
        for r in requests:
            try:
                out.append(plan_window(r.index, r.frames))
            except VideoError as e:
                raise VideoError(f"{where_text(r.where)}: {e}") from None
        return out

    def fetch(self, requests: Sequence[WindowRequest], plans: Sequence[WindowPlan]) -> list[bytes]:
        ranges = [
            RangeRequest(self.object_key(r.key), p.start, p.end) for r, p in zip(requests, plans)
        ]
        try:
            return self.store.get_ranges(ranges)
        except (NotFound, StorageError) as e:
            msg = str(e)
            named = [where_text(r.where) for r in requests if self.object_key(r.key) in msg] or [
                where_text(r.where) for r in requests[:1]
            ]
            raise type(e)(f"{named[0]}: {msg}") from None

    def _one(self, req: WindowRequest, plan: WindowPlan, data: bytes) -> Any:
        where = where_text(req.where)
        verify_window(data, plan, req.index, where, len(req.index))
        t = len(plan.wanted)
        spec = req.spec
        out = req.out
        if out is not None:
            check_out(out, req.index, spec, t, where)
        else:
            out = allocate(req.index, spec, t)
        size = spec.size if spec.size else (req.index.height, req.index.width)
        direct = spec.layout == "THWC" and spec.dtype == "uint8"
        if direct:
            frames = out.numpy() if isinstance(out, torch.Tensor) else out
        else:
            frames = np.empty((t, size[0], size[1], 3), dtype=np.uint8)
        tags = window_tags(req.index, data, where)
        decode_window(self._decoder(), data, plan, size, frames, where, tags, req.key)
        if not direct:
            finish_window(frames, spec, out)
        return out

    # -- API ----------------------------------------------------------------------------
    def read(self, requests: Sequence[WindowRequest]) -> list[Any]:
        """Decode every window; returns one array per request (``out`` when given).

        Arrays are numpy (``[T,H,W,3]`` or ``[T,3,H,W]``, uint8/float32/float16), or torch
        tensors for ``bfloat16``. Errors: :class:`~treadle.errors.CorruptData` (checksum,
        truncation, undecodable bytes), :class:`~treadle.errors.NotFound` (missing object),
        :class:`~treadle.errors.VideoError` (bad request), each naming the window.
        """
        return self.read_with_stats(requests)[0]

    def read_with_stats(self, requests: Sequence[WindowRequest]) -> tuple[list[Any], ReadStats]:
        """:meth:`read`, plus what it cost (bytes read, packets decoded, time per stage)."""
        stats = ReadStats(windows=len(requests))
        if not requests:
            return [], stats
        plans = self.plan(requests)
        t0 = time.perf_counter()
        datas = self.fetch(requests, plans)
        t1 = time.perf_counter()
        if self._pool is None or len(requests) == 1:
            outs = [self._one(r, p, d) for r, p, d in zip(requests, plans, datas)]
        else:
            futures = [
                self._pool.submit(self._one, r, p, d) for r, p, d in zip(requests, plans, datas)
            ]
            outs = []
            first_error: BaseException | None = None
            for f in futures:
                try:
                    outs.append(f.result())
                except TreadleError as e:  # report the first failing window in request order
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
        stats.fetch_s = t1 - t0
        stats.decode_s = time.perf_counter() - t1
        stats.window_bytes = [p.nbytes for p in plans]
        stats.bytes_read = sum(stats.window_bytes)
        stats.packets_decoded = sum(p.num_packets for p in plans)
        stats.frames_out = sum(len(p.wanted) for p in plans)
        return outs, stats

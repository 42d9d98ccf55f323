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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from treadle.concurrency import submit
from treadle.errors import TreadleError, VideoError
from treadle.storage import Store
from treadle.video.cpu_decode import Decoder, decode_fetched
from treadle.video.fetch import FetchedWindow, ReadStats, WindowFetcher, WindowRequest

__all__ = ["ReadStats", "VideoReader", "WindowRequest"]


class VideoReader:
    """Reads batches of video windows from a :class:`~treadle.storage.Store`.

    ``threads`` decode threads (each with its own H.264 context, reused and flushed
    between windows); ``decoder_threads`` is FFmpeg's own thread count per context.
    """

    fetches_ahead = True  # a FetchingVideoReader (treadle.video.protocols)

    def __init__(
        self, store: Store, *, threads: int = 1, prefix: str = "", decoder_threads: int = 1
    ):
        if threads < 1 or decoder_threads < 0:
            raise VideoError("VideoReader needs threads >= 1 and decoder_threads >= 0")
        self.fetcher = WindowFetcher(store, prefix)
        self.store = store
        self.prefix = self.fetcher.prefix
        self.threads = threads
        self.decoder_threads = decoder_threads
        self._local = threading.local()
        # decodes of read() with one thread run on the caller's; submit() always uses the pool
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            threads, thread_name_prefix="treadle-video"
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

    def _one(self, window: FetchedWindow) -> Any:
        window.verify()
        return decode_fetched(self._decoder(), window, window.output())

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
        if not requests:
            return [], ReadStats()
        t0 = time.perf_counter()
        windows = self.fetch(requests)
        t1 = time.perf_counter()
        outs = self.decode(windows)
        return outs, ReadStats.of(windows, t1 - t0, time.perf_counter() - t1)

    def fetch(self, requests: Sequence[WindowRequest]) -> list[FetchedWindow]:
        """The first half of :meth:`read`: plan the windows and fetch their bytes (one
        coalesced ``get_ranges``). A caller may fetch the next batch while this one decodes."""
        return self.fetcher.fetch(requests)

    def decode(self, windows: Sequence[FetchedWindow]) -> list[Any]:
        """The second half of :meth:`read`: verify and decode fetched windows, one output per
        window, on the decode threads; the first failing window (in order) is raised."""
        if self.threads == 1 or len(windows) <= 1 or self._pool is None:
            return [self._one(w) for w in windows]
        return self.submit(windows)()

    def submit(self, windows: Sequence[FetchedWindow]) -> Callable[[], list[Any]]:
        """:meth:`decode`, started on the decode threads: returns the call that waits for
        the outputs (raising the first failing window, in order). Windows submitted later
        are decoded after these, so a caller that submits the next batch before waiting for
        this one keeps every decode thread busy across batches."""
        if self._pool is None:
            raise VideoError("VideoReader is closed")
        # longest first (packets to decode), so no thread is left with a long window while
        # the others wait at the end of the batch; results stay in request order
        futures: list[Any] = [None] * len(windows)
        for i in sorted(range(len(windows)), key=lambda i: -windows[i].plan.num_packets):
            futures[i] = submit(self._pool, self._one, windows[i])
        return lambda: _results(futures)


def _results(futures: Sequence[Future[Any]]) -> list[Any]:
    """Every future's result, in order; the first failing window (in order) raised once
    every window ended (any other exception at once)."""
    outs = []
    first_error: BaseException | None = None
    for f in futures:
        try:
            outs.append(f.result())
        except TreadleError as e:  # report the first failing window in request order
            first_error = first_error or e
    if first_error is not None:
        raise first_error
    return outs

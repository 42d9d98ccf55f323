"""The GPU video reader: fetched windows decoded by NVDEC into tensors on the device.

:class:`GpuVideoReader` starts from the stage :class:`treadle.video.VideoReader` starts
from (:class:`treadle.video.WindowFetcher`: one coalesced fetch per batch, crc32
verification), then decodes windows (:func:`treadle.gpu.nvdec_decode.decode_window_to`) on
``streams`` worker threads, each with its own decoder and CUDA stream, at most
``max_in_flight`` windows queued (a bounded queue), so several NVDEC sessions stay busy.
A window the GPU cannot take is decoded from the same fetched bytes by the CPU decoder
(:func:`treadle.video.cpu_decode.decode_fetched`) and copied to the device. When
:meth:`GpuVideoReader.read` returns, the outputs are complete and visible to every stream.

Nothing here imports CUDA, Triton or touches a GPU at import time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from treadle.concurrency import CONCURRENCY, submit
from treadle.errors import CorruptData, VideoError
from treadle.gpu.fallback import warn_once
from treadle.gpu.nvdec_decode import GPU_CODECS, NvdecDecoder, cpu_chroma_mode, decode_window_to
from treadle.video import cpu_decode as cpu
from treadle.video.colour_tags import window_tags
from treadle.video.fetch import FetchedWindow, ReadStats, WindowFetcher, WindowRequest

if TYPE_CHECKING:
    from treadle.storage import Store


class GpuVideoReader:
    """Reads batches of video windows into tensors on a CUDA device, decoding with NVDEC.

    Same requests as :class:`treadle.video.VideoReader` (:class:`treadle.video.WindowRequest`);
    ``request.out``, when given, is a tensor on ``device`` of the window's shape and dtype
    (e.g. ``batch[i]``), filled in place; otherwise one is allocated there.

    ``streams`` worker threads each own a decoder and a CUDA stream; :meth:`submit`
    blocks while ``max_in_flight`` windows are queued or decoding. ``hw=False`` decodes
    in software (tests; a device without NVDEC) and still converts with the kernel.
    """

    fetches_ahead = False  # read() fetches and decodes (treadle.video.protocols)

    def __init__(
        self,
        store: Store,
        *,
        device: torch.device | str = "cuda",
        prefix: str = "",
        streams: int = CONCURRENCY.nvdec_streams,
        max_in_flight: int | None = None,
        hw: bool = True,
        impl: str = "auto",
        chroma: str | None = None,
    ):
        if streams < 1:
            raise VideoError("GpuVideoReader needs streams >= 1")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.hw = hw
        self.impl = impl
        self.chroma = chroma  # None: follow the CPU path's scaler flags (cpu_chroma_mode)
        self.streams = streams
        self.fetcher = WindowFetcher(store, prefix)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(streams, thread_name_prefix="treadle-nvdec")
        self._slots = threading.BoundedSemaphore(max_in_flight or 2 * streams)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> GpuVideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per worker -----------------------------------------------------------------
    def _worker(self) -> tuple[NvdecDecoder, Any]:
        state = getattr(self._local, "state", None)
        if state is None:
            stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            state = self._local.state = (NvdecDecoder(self.device, hw=self.hw), stream)
        return state

    def _cpu_window(self, window: FetchedWindow, out: torch.Tensor) -> torch.Tensor:
        """Decode ``window`` on the CPU path (the same fetched bytes), copy it to ``out``."""
        dec = getattr(self._local, "cpu", None)
        if dec is None:
            dec = self._local.cpu = cpu.Decoder()
        host = cpu.decode_fetched(dec, window, window.allocate())
        out.copy_(torch.as_tensor(host))
        return out

    def _one(self, window: FetchedWindow) -> torch.Tensor:
        window.verify()
        req, where = window.request, window.where
        out = window.output(self.device)
        if req.index.codec not in GPU_CODECS:
            warn_once(
                f"codec-{req.index.codec}",
                f"{where}: codec {req.index.codec!r} is not decoded on the GPU; using the CPU path",
            )
            return self._cpu_window(window, out)
        decoder, stream = self._worker()
        args = (decoder, window.data, window.plan, out, window.frame, where)
        kw = dict(
            chroma=self.chroma or cpu_chroma_mode(),
            impl=self.impl,
            tags=window_tags(req.index, window.data, where),
        )
        try:
            if stream is None:
                decode_window_to(*args, **kw)
            else:
                # Worker threads start on device 0: launch on ours. out may have been
                # allocated or written on the default stream.
                with torch.cuda.device(self.device):
                    stream.wait_stream(torch.cuda.default_stream(self.device))
                    with torch.cuda.stream(stream):
                        decode_window_to(*args, **kw)
        except CorruptData as e:
            if not self.hw:
                raise
            # NVDEC refused bytes FFmpeg may still decode: the CPU path decides (and
            # raises CorruptData, naming the window, if the bytes really are bad).
            warn_once(
                "nvdec-window-error", f"{e}; NVDEC failed on a window, retrying on the CPU path"
            )
            return self._cpu_window(window, out)
        return out

    def _one_slot(self, window: FetchedWindow) -> torch.Tensor:
        try:
            return self._one(window)
        finally:
            self._slots.release()

    # -- API ----------------------------------------------------------------------------
    def submit(self, requests: Sequence[WindowRequest]) -> Future:
        """Plan, fetch and queue a batch of windows; a future of the list of outputs.

        Blocks while ``max_in_flight`` windows are in flight (bounded queue). The
        future's ``fetch_s`` attribute is the time spent planning and fetching.
        """
        t0 = time.perf_counter()
        windows = self.fetcher.fetch(requests)
        done: Future = Future()
        done.fetch_s = time.perf_counter() - t0
        done.windows = windows
        if not windows:
            done.set_result([])
            return done
        futures: list[Future] = []
        remaining = [len(windows)]
        lock = threading.Lock()

        def finished(_f: Future) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            outs, first_error = [], None
            for f in futures:
                e = f.exception()
                if e is not None:
                    first_error = first_error or e  # the first failing window in request order
                else:
                    outs.append(f.result())
            if first_error is not None:
                done.set_exception(first_error)
            else:
                done.set_result(outs)

        for w in windows:
            self._slots.acquire()
            futures.append(submit(self._pool, self._one_slot, w))
        for f in futures:  # callbacks after the list is complete
            f.add_done_callback(finished)
        return done

    def read(self, requests: Sequence[WindowRequest]) -> list[torch.Tensor]:
        """Decode every window; one tensor on ``device`` per request (``out`` when given).

        Errors are the CPU path's: :class:`~treadle.errors.CorruptData`,
        :class:`~treadle.errors.NotFound`, :class:`~treadle.errors.VideoError`.
        """
        return self.read_with_stats(requests)[0]

    def read_with_stats(
        self, requests: Sequence[WindowRequest]
    ) -> tuple[list[torch.Tensor], ReadStats]:
        """:meth:`read` plus a :class:`treadle.video.ReadStats` (fetch and decode time)."""
        t0 = time.perf_counter()
        fut = self.submit(requests)
        outs = fut.result()
        fetch_s = fut.fetch_s
        decode_s = time.perf_counter() - t0 - fetch_s
        return outs, ReadStats.of(fut.windows, fetch_s, decode_s)

"""GPU decode: NVDEC through PyAV's CUDA hwaccel, frames handed over by DLPack.

The GPU path consumes exactly what the CPU path consumes: the byte range of a planned
window (:class:`treadle.video.WindowPlan`, Annex-B packets in decode order starting at
a keyframe with SPS/PPS in-band), cut into packets by the index, output frames matched
by pts. Only the decoder and the conversion differ:

* :class:`NvdecDecoder` is one ``av.CodecContext("h264")`` opened with
  ``HWAccel("cuda", is_hw_owned=True)``: NVDEC decodes, frames stay on the GPU as NV12
  (``frame.format.name == "cuda"``) and their planes are exported with DLPack (no host
  copy). The context is created once per worker and flushed between windows (creating
  an NVDEC session costs milliseconds). If NVDEC cannot take a stream, FFmpeg falls back
  to its software decoder for it; such frames are uploaded and converted by the same
  kernel (and a one-time warning says so).
* :func:`decode_window_to` writes each wanted frame through the fused kernel
  (:func:`treadle.gpu.transform.convert`) straight into its slot of ``out``, a slice of
  the batch tensor on the device.
* :class:`GpuVideoReader` mirrors :class:`treadle.video.VideoReader`: one coalesced
  fetch per batch, crc32 verification, then windows decoded by ``streams`` worker
  threads, each with its own decoder and CUDA stream, at most ``max_in_flight`` windows
  queued (a bounded queue), so several NVDEC sessions stay busy.

Synchronisation: FFmpeg copies NVDEC output on CUDA's legacy default stream, so a
window is decoded first, then the worker's stream waits for the default stream, then
its frames are converted, and the window ends with the worker's stream synchronised
(the decoded frames go back to FFmpeg's pool only then): when
:meth:`GpuVideoReader.read` returns, the outputs are complete and visible to every
stream.

Nothing here imports CUDA, Triton or touches a GPU at import time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import av
import torch

from treadle.errors import CorruptData, VideoError
from treadle.gpu.colour import AVCHROMA_LOC_LEFT, colour_for, sps_from_annexb
from treadle.gpu.transform import OutputSpec, chroma_mode_for, convert

#: Codecs the GPU path decodes (the CPU path's stream format).
GPU_CODECS = ("h264",)


def _warn_once(key: str, message: str) -> None:
    from treadle.gpu.backend import warn_once

    warn_once(key, message)


class NvdecDecoder:
    """One H.264 decoder context, reused window after window (one per worker thread).

    ``hw=True``: NVDEC via ``HWAccel("cuda", device=index, is_hw_owned=True)``;
    ``hw=False``: FFmpeg's software decoder (the CPU fallback, and what tests use).
    """

    def __init__(self, device: torch.device | str = "cuda", *, hw: bool = True, codec="h264"):
        self.device = torch.device(device)
        self.hw = hw
        self.codec = codec
        self._ctx: Any = None

    def context(self) -> Any:
        if self._ctx is None:
            hwaccel = None
            if self.hw:
                from av.codec.hwaccel import HWAccel

                index = self.device.index if self.device.index is not None else 0
                hwaccel = HWAccel(
                    "cuda", device=str(index), allow_software_fallback=True, is_hw_owned=True
                )
            ctx: Any = av.CodecContext.create(self.codec, "r", hwaccel=hwaccel)
            ctx.thread_count = 1
            ctx.options = {"err_detect": "crccheck+bitstream+buffer+explode"}
            self._ctx = ctx
        return self._ctx

    def reset(self) -> None:
        """Drop the context (after an error its state is unknown)."""
        self._ctx = None

    def frames(self, data: bytes | memoryview, plan: Any) -> Iterator[Any]:
        """Decode ``plan``'s packets from ``data``; yields frames (any order), then flushes.

        Raises ``av.FFmpegError`` on undecodable bytes (the caller resets the decoder).
        """
        ctx = self.context()
        view = memoryview(data)
        for o, s, p in zip(plan.rel_offset.tolist(), plan.size.tolist(), plan.pts.tolist()):
            pkt = av.Packet(view[o : o + s])
            pkt.pts = p
            yield from ctx.decode(pkt)
        yield from ctx.decode(None)
        ctx.flush_buffers()


def _from_dlpack(plane: Any) -> torch.Tensor:
    # Call __dlpack__ ourselves: torch.from_dlpack(obj) would pass a CUDA stream, which
    # PyAV refuses; ordering is handled by the caller (see the module docstring).
    return torch.utils.dlpack.from_dlpack(plane.__dlpack__())


def frame_planes(
    frame: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(y, u, v, on_gpu) of a decoded frame as tensors on ``device``.

    CUDA frames (NV12) are zero-copy DLPack views (``u``/``v`` are strided views of the
    interleaved chroma plane); software frames (yuv420p, nv12) are wrapped zero-copy and
    uploaded; other formats go through FFmpeg's scaler to yuv420p first.
    """
    name = frame.format.name
    h, w = frame.height, frame.width
    hc, wc = (h + 1) // 2, (w + 1) // 2
    if name == "cuda":
        y = _from_dlpack(frame.planes[0])
        uv = _from_dlpack(frame.planes[1])
        return y[:h, :w], uv[:hc, :wc, 0], uv[:hc, :wc, 1], True
    if name not in ("yuv420p", "yuvj420p", "nv12"):
        frame = frame.reformat(format="yuv420p")
        name = "yuv420p"
    y = _from_dlpack(frame.planes[0])[:h, :w]
    if name == "nv12":
        uv = _from_dlpack(frame.planes[1])[:hc, :wc]
        u, v = uv[..., 0], uv[..., 1]
    else:
        u = _from_dlpack(frame.planes[1])[:hc, :wc]
        v = _from_dlpack(frame.planes[2])[:hc, :wc]
    if device.type != "cpu":
        y, u, v = (t.to(device, non_blocking=False) for t in (y, u, v))
    return y, u, v, False


def cpu_chroma_mode(video: Any) -> str:
    """The chroma mode matching the CPU path's scaler flags for this window spec.

    Uses ``treadle.video.decode.interpolation_for(spec)`` when the CPU path defines it
    (flags per spec, e.g. default flags at native size and ``SWS_PARITY_FLAGS`` when
    resizing), else its single ``RESIZE_INTERPOLATION``.
    """
    from treadle.video import decode as cpu

    per_spec = getattr(cpu, "interpolation_for", None)
    flags = per_spec(video) if per_spec is not None else cpu.RESIZE_INTERPOLATION
    return chroma_mode_for(flags)


def chroma_location(data: bytes | memoryview) -> int:
    """AVChromaLocation of the window's stream, from its first SPS (H.264 default: left)."""
    try:
        sps = sps_from_annexb(bytes(data[:4096]))
    except (ValueError, IndexError):
        sps = None
    return sps.colour.chroma_loc if sps is not None else AVCHROMA_LOC_LEFT


def decode_window_to(
    decoder: NvdecDecoder,
    data: bytes | memoryview,
    plan: Any,
    out: torch.Tensor,
    spec: OutputSpec,
    where: str,
    *,
    chroma: str = "sws_default",
    impl: str = "auto",
    tags: tuple[int, int] | None = None,
) -> int:
    """Decode ``plan``'s window from ``data`` into ``out`` (``[T, ...]`` on the device).

    ``chroma`` is the chroma mode of the CPU path's scaler flags
    (:func:`treadle.gpu.transform.chroma_mode_for`). ``tags`` are the stream's
    (colorspace, color_range) (:func:`treadle.video.colour.window_tags`; ``None``: from
    the window's SPS), never the decoder's frame tags, which a reused context carries
    over from the previous stream. Returns packets decoded. Raises
    :class:`~treadle.errors.CorruptData` when the bytes do not decode or a wanted frame
    is missing.
    """
    slots: dict[int, list[int]] = {}
    for j, p in enumerate(plan.wanted_pts.tolist()):
        slots.setdefault(p, []).append(j)
    if tags is None:
        from treadle.video.colour import sps_tags

        tags = sps_tags(data, where)
    colour = colour_for(tags, chroma_location(data))
    # Decode the whole window first (NVDEC kept busy, one stream wait), then convert;
    # the wanted frames stay alive until the window's kernels ran.
    wanted: list[tuple[list[int], Any, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    any_gpu = False
    try:
        for frame in decoder.frames(data, plan):
            js = slots.pop(frame.pts, None)
            if js is None:
                continue  # warm-up frame before the window
            y, u, v, on_gpu = frame_planes(frame, out.device)
            any_gpu |= on_gpu
            if not on_gpu and decoder.hw:
                _warn_once(
                    "nvdec-software-frames",
                    f"{where}: NVDEC could not decode this stream; FFmpeg decoded it in "
                    "software and the frames were uploaded (slower)",
                )
            wanted.append((js, frame, y, u, v))
    except (av.FFmpegError, ValueError) as e:
        decoder.reset()
        raise CorruptData(f"{where}: video does not decode ({e})") from None
    except BaseException:
        decoder.reset()
        raise
    if slots:
        missing = sorted(int(plan.wanted[j]) for js in slots.values() for j in js)
        raise CorruptData(
            f"{where} frame {missing[0]}: decoder produced no picture for frame(s) {missing[:8]}"
        )
    if any_gpu:
        # FFmpeg copied the frames out of NVDEC on CUDA's legacy default stream.
        torch.cuda.current_stream(out.device).wait_stream(torch.cuda.default_stream(out.device))
    for js, _, y, u, v in wanted:
        j0 = js[0]
        convert(y, u, v, out[j0 : j0 + 1], spec, colour, chroma=chroma, impl=impl)
        for j in js[1:]:
            out[j].copy_(out[j0])
    if out.is_cuda:
        # The kernels read the decoded frames: done before they go back to FFmpeg's pool.
        torch.cuda.current_stream(out.device).synchronize()
    del wanted
    return plan.num_packets


class GpuVideoReader:
    """Reads batches of video windows into tensors on a CUDA device, decoding with NVDEC.

    Same requests as :class:`treadle.video.VideoReader` (:class:`treadle.video.WindowRequest`);
    ``request.out``, when given, is a tensor on ``device`` of the window's shape and dtype
    (e.g. ``batch[i]``), filled in place; otherwise one is allocated there.

    ``streams`` worker threads each own a decoder and a CUDA stream; :meth:`submit`
    blocks while ``max_in_flight`` windows are queued or decoding. ``hw=False`` decodes
    in software (tests; a device without NVDEC) and still converts with the kernel.
    """

    def __init__(
        self,
        store: Any,
        *,
        device: torch.device | str = "cuda",
        prefix: str = "",
        streams: int = 4,
        max_in_flight: int | None = None,
        hw: bool = True,
        impl: str = "auto",
        chroma: str | None = None,
    ):
        from treadle.video import VideoReader

        if streams < 1:
            raise VideoError("GpuVideoReader needs streams >= 1")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.hw = hw
        self.impl = impl
        self.chroma = chroma  # None: follow the CPU path's flags per spec (cpu_chroma_mode)
        self.streams = streams
        self._cpu = VideoReader(store, prefix=prefix)  # planning, fetching, CPU fallback
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(streams, thread_name_prefix="treadle-nvdec")
        self._slots = threading.BoundedSemaphore(max_in_flight or 2 * streams)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._cpu.close()

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

    def _allocate(self, req: Any, t: int) -> torch.Tensor:
        spec = OutputSpec.from_video(req.spec)
        shape = (t, *spec.frame_shape(req.index.height, req.index.width))
        return torch.empty(shape, dtype=spec.torch_dtype, device=self.device)

    def _check_out(self, req: Any, t: int, where: str) -> torch.Tensor:
        out = req.out
        if out is None:
            return self._allocate(req, t)
        spec = OutputSpec.from_video(req.spec)
        shape = (t, *spec.frame_shape(req.index.height, req.index.width))
        if (
            not isinstance(out, torch.Tensor)
            or out.device != self.device
            or out.dtype != spec.torch_dtype
            or tuple(out.shape) != shape
        ):
            got = (
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            raise VideoError(
                f"{where}: out is {got}, the window needs {shape} {spec.dtype} on {self.device}"
            )
        return out

    def _cpu_window(self, req: Any, out: torch.Tensor) -> torch.Tensor:
        host = self._cpu.read([dataclasses.replace(req, out=None)])[0]
        out.copy_(torch.as_tensor(host))
        return out

    def _one(self, req: Any, plan: Any, data: bytes) -> torch.Tensor:
        from treadle.video.colour import window_tags
        from treadle.video.decode import verify_window, where_text

        where = where_text(req.where)
        verify_window(data, plan, req.index, where, len(req.index))
        t = len(plan.wanted)
        out = self._check_out(req, t, where)
        if req.index.codec not in GPU_CODECS:
            _warn_once(
                f"codec-{req.index.codec}",
                f"{where}: codec {req.index.codec!r} is not decoded on the GPU; using the CPU path",
            )
            return self._cpu_window(req, out)
        decoder, stream = self._worker()
        spec = OutputSpec.from_video(req.spec)
        chroma = self.chroma or cpu_chroma_mode(req.spec)
        kw = dict(chroma=chroma, impl=self.impl, tags=window_tags(req.index, data, where))
        try:
            if stream is None:
                decode_window_to(decoder, data, plan, out, spec, where, **kw)
            else:
                # Worker threads start on device 0: launch on ours. out may have been
                # allocated or written on the default stream.
                with torch.cuda.device(self.device):
                    stream.wait_stream(torch.cuda.default_stream(self.device))
                    with torch.cuda.stream(stream):
                        decode_window_to(decoder, data, plan, out, spec, where, **kw)
        except CorruptData as e:
            if not self.hw:
                raise
            # NVDEC refused bytes FFmpeg may still decode: the CPU path decides (and
            # raises CorruptData, naming the window, if the bytes really are bad).
            _warn_once(
                "nvdec-window-error", f"{e}; NVDEC failed on a window, retrying on the CPU path"
            )
            return self._cpu_window(req, out)
        return out

    def _one_slot(self, req: Any, plan: Any, data: bytes) -> torch.Tensor:
        try:
            return self._one(req, plan, data)
        finally:
            self._slots.release()

    # -- API ----------------------------------------------------------------------------
    def submit(self, requests: Sequence[Any]) -> Future:
        """Plan, fetch and queue a batch of windows; a future of the list of outputs.

        Blocks while ``max_in_flight`` windows are in flight (bounded queue). The
        future's ``fetch_s`` attribute is the time spent planning and fetching.
        """
        t0 = time.perf_counter()
        plans = self._cpu.plan(requests)
        datas = self._cpu.fetch(requests, plans) if requests else []
        fetch_s = time.perf_counter() - t0
        done: Future = Future()
        done.fetch_s = fetch_s  # type: ignore[attr-defined]
        done.plans = plans  # type: ignore[attr-defined]
        if not requests:
            done.set_result([])
            return done
        futures: list[Future] = []
        remaining = [len(requests)]
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

        for r, p, d in zip(requests, plans, datas):
            self._slots.acquire()
            futures.append(self._pool.submit(self._one_slot, r, p, d))
        for f in futures:  # callbacks after the list is complete
            f.add_done_callback(finished)
        return done

    def read(self, requests: Sequence[Any]) -> list[torch.Tensor]:
        """Decode every window; one tensor on ``device`` per request (``out`` when given).

        Errors are the CPU path's: :class:`~treadle.errors.CorruptData`,
        :class:`~treadle.errors.NotFound`, :class:`~treadle.errors.VideoError`.
        """
        return self.read_with_stats(requests)[0]

    def read_with_stats(self, requests: Sequence[Any]) -> tuple[list[torch.Tensor], Any]:
        """:meth:`read` plus a :class:`treadle.video.ReadStats` (fetch and decode time)."""
        from treadle.video import ReadStats

        stats = ReadStats(windows=len(requests))
        t0 = time.perf_counter()
        fut = self.submit(requests)
        outs = fut.result()
        stats.fetch_s = fut.fetch_s  # type: ignore[attr-defined]
        stats.decode_s = time.perf_counter() - t0 - stats.fetch_s
        plans = fut.plans  # type: ignore[attr-defined]
        stats.window_bytes = [p.nbytes for p in plans]
        stats.bytes_read = sum(stats.window_bytes)
        stats.packets_decoded = sum(p.num_packets for p in plans)
        stats.frames_out = sum(int(o.shape[0]) for o in outs)
        return outs, stats

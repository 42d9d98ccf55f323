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
  (:func:`treadle.gpu.yuv_to_tensor.convert`) straight into its slot of ``out``, a slice of
  the batch tensor on the device.

:class:`treadle.gpu.nvdec_reader.GpuVideoReader` runs them on worker threads.

Synchronisation: FFmpeg copies NVDEC output on CUDA's legacy default stream, so a
window is decoded first, then the worker's stream waits for the default stream, then
its frames are converted, and the window ends with the worker's stream synchronised
(the decoded frames go back to FFmpeg's pool only then): when a window's decode returns,
its output is complete and visible to every stream.

Nothing here imports CUDA, Triton or touches a GPU at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import av
import torch

from treadle.errors import CorruptData
from treadle.gpu.fallback import warn_once
from treadle.gpu.yuv_colour import AVCHROMA_LOC_LEFT, colour_for, sps_from_annexb
from treadle.gpu.yuv_to_tensor import chroma_mode_for, convert_checked
from treadle.video import cpu_decode as cpu
from treadle.video.colour_tags import sps_tags
from treadle.video.frame_spec import FrameSpec
from treadle.video.outputs import WindowOutputs

#: Codecs the GPU path decodes (the CPU path's stream format).
GPU_CODECS = ("h264",)


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


def cpu_chroma_mode() -> str:
    """The chroma mode matching the CPU path's scaler flags
    (:data:`treadle.video.cpu_decode.RESIZE_INTERPOLATION`, read at each call)."""
    return chroma_mode_for(cpu.RESIZE_INTERPOLATION)


def chroma_location(data: bytes | memoryview) -> int:
    """AVChromaLocation of the window's stream, from its first SPS (H.264 default: left)."""
    try:
        sps = sps_from_annexb(bytes(data[:4096]))
    except (ValueError, IndexError):
        sps = None
    return sps.colour.chroma_loc if sps is not None else AVCHROMA_LOC_LEFT


_Wanted = tuple[list[int], Any, torch.Tensor, torch.Tensor, torch.Tensor]


def _decode_wanted(
    decoder: NvdecDecoder, data: bytes | memoryview, plan: Any, device: torch.device, where: str
) -> tuple[list[_Wanted], bool]:
    """Decode the window; (output slots, frame, y, u, v) per wanted frame, and whether any
    frame is on the GPU. Raises :class:`CorruptData` naming ``where``."""
    outputs = WindowOutputs(plan, where)
    wanted: list[_Wanted] = []
    any_gpu = False
    try:
        for frame in decoder.frames(data, plan):
            js = outputs.take(frame.pts)
            if js is None:
                continue  # warm-up
            y, u, v, on_gpu = frame_planes(frame, device)
            any_gpu |= on_gpu
            if not on_gpu and decoder.hw:
                warn_once(
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
    outputs.check_complete()
    return wanted, any_gpu


def decode_window_to(
    decoder: NvdecDecoder,
    data: bytes | memoryview,
    plan: Any,
    out: torch.Tensor,
    spec: FrameSpec,
    where: str,
    *,
    chroma: str = "sws_default",
    impl: str = "auto",
    tags: tuple[int, int] | None = None,
) -> int:
    """Decode ``plan``'s window from ``data`` into ``out`` (``[T, ...]`` on the device,
    of ``spec``'s shape and dtype: checked by the caller, :meth:`FrameSpec.check`).

    ``chroma`` is the chroma mode of the CPU path's scaler flags
    (:func:`treadle.gpu.yuv_to_tensor.chroma_mode_for`). ``tags`` are the stream's
    (colorspace, color_range) (:func:`treadle.video.colour_tags.window_tags`; ``None``: from
    the window's SPS), never the decoder's frame tags, which a reused context carries
    over from the previous stream. Returns packets decoded. Raises
    :class:`~treadle.errors.CorruptData` when the bytes do not decode or a wanted frame
    is missing.
    """
    colour = colour_for(tags or sps_tags(data, where), chroma_location(data))
    # Decode the whole window first (NVDEC kept busy, one stream wait), then convert;
    # the wanted frames stay alive until the window's kernels ran.
    wanted, any_gpu = _decode_wanted(decoder, data, plan, out.device, where)
    if any_gpu:
        # FFmpeg copied the frames out of NVDEC on CUDA's legacy default stream.
        torch.cuda.current_stream(out.device).wait_stream(torch.cuda.default_stream(out.device))
    for js, _, y, u, v in wanted:
        j0 = js[0]
        convert_checked(
            y[None], u[None], v[None], out[j0 : j0 + 1], spec, colour, chroma=chroma, impl=impl
        )
        for j in js[1:]:
            out[j].copy_(out[j0])
    if out.is_cuda:
        # The kernels read the decoded frames: done before they go back to FFmpeg's pool.
        torch.cuda.current_stream(out.device).synchronize()
    del wanted
    return plan.num_packets

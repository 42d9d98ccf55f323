"""Choosing where video is decoded: NVDEC on the GPU, or the CPU path.

``select_backend(device)`` is what the loader calls once. It returns:

* :class:`NvdecBackend` when ``device`` is CUDA, CUDA works, and a probe stream decodes
  through NVDEC into a CUDA frame: windows are decoded by NVDEC and converted by the
  fused kernel straight into the batch tensor on the device
  (:class:`treadle.gpu.nvdec_reader.GpuVideoReader`);
* :class:`CpuBackend` otherwise: the CPU path (:class:`treadle.video.VideoReader`),
  whose batches the loader copies to ``device``. When the caller asked for CUDA and the
  GPU path is unavailable, a :class:`GpuFallbackWarning` says why, once per reason per
  process.

Set ``TREADLE_VIDEO_DECODE=cpu`` (or ``prefer="cpu"``) to force the CPU path, ``nvdec``
to fail loudly instead of falling back. Importing this module touches no GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from treadle.concurrency import CONCURRENCY
from treadle.errors import TreadleError
from treadle.gpu.fallback import GpuFallbackWarning, warn_once

if TYPE_CHECKING:
    from treadle.gpu.nvdec_reader import GpuVideoReader
    from treadle.storage import Store
    from treadle.video.cpu_reader import VideoReader

__all__ = [
    "Backend",
    "CpuBackend",
    "GpuFallbackWarning",
    "GpuUnavailable",
    "NvdecBackend",
    "select_backend",
    "warn_once",
]


class GpuUnavailable(TreadleError, RuntimeError):
    """``prefer="nvdec"`` was asked for and the GPU video path cannot run here."""


# --- probes (module-level so tests can replace them) ----------------------------------


def cuda_unavailable(device: torch.device) -> str | None:
    """Why CUDA cannot be used for ``device``, or None."""
    try:
        if not torch.cuda.is_available():
            return f"CUDA is not available to torch {torch.__version__} (no GPU, or a CPU build)"
        count = torch.cuda.device_count()
    except Exception as e:  # a broken driver raises from inside torch
        return f"CUDA failed to initialise ({e})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        return f"{device} does not exist ({count} CUDA device(s))"
    return None


@functools.lru_cache(maxsize=16)
def nvdec_unavailable(index: int) -> str | None:
    """Why NVDEC cannot decode H.264 on CUDA device ``index``, or None (result cached).

    Decodes a probe stream through PyAV's CUDA hwaccel without software fallback and
    checks that a CUDA frame comes back and exports by DLPack.
    """
    try:
        import av
        from av.codec.hwaccel import HWAccel, hwdevices_available

        from treadle.video.encode import probe_stream
    except Exception as e:
        return f"PyAV has no hardware acceleration support ({e})"
    if "cuda" not in hwdevices_available():
        return "PyAV's FFmpeg was built without CUDA (NVDEC) support"
    try:
        hw = HWAccel("cuda", device=str(index), allow_software_fallback=False, is_hw_owned=True)
        ctx: Any = av.CodecContext.create("h264", "r", hwaccel=hw)
        frames = []
        for pkt in ctx.parse(probe_stream()):
            frames += ctx.decode(pkt)
        frames += ctx.decode(None)
    except Exception as e:
        return f"NVDEC could not be opened on cuda:{index} ({type(e).__name__}: {e})"
    if not frames:
        return "NVDEC produced no frame for the probe stream"
    if frames[0].format.name != "cuda":
        return f"NVDEC decoded to {frames[0].format.name!r} frames, not CUDA frames"
    try:
        from treadle.gpu.nvdec_decode import frame_planes

        y, _, _, on_gpu = frame_planes(frames[0], torch.device("cuda", index))
        if not (on_gpu and y.is_cuda):
            return "NVDEC frames did not export to CUDA tensors by DLPack"
    except Exception as e:
        return f"NVDEC frames did not export by DLPack ({type(e).__name__}: {e})"
    return None


def triton_unavailable() -> str | None:
    """Why the fused Triton kernel cannot be used, or None."""
    from treadle.gpu.yuv_to_tensor import triton_available

    return None if triton_available() else "triton is not installed"


# --- backends ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuBackend:
    """Decode on the CPU (FFmpeg via PyAV); the loader copies batches to ``device``.

    ``reason`` says why the GPU path is not used (None when the caller asked for CPU).
    """

    device: torch.device
    reason: str | None = None
    name: str = field(default="cpu", init=False)

    @property
    def on_device(self) -> bool:
        """True when readers write straight into tensors on :attr:`device`."""
        return False

    def video_reader(
        self,
        store: Store,
        *,
        prefix: str = "",
        threads: int = 1,
        streams: int = CONCURRENCY.nvdec_streams,
        **kw: Any,
    ) -> VideoReader:
        """A :class:`treadle.video.VideoReader` with ``threads`` decode threads (outputs
        in host memory; ``streams`` is the GPU backend's and ignored here)."""
        from treadle.video import VideoReader

        return VideoReader(store, prefix=prefix, threads=threads, **kw)


@dataclass(frozen=True)
class NvdecBackend:
    """Decode with NVDEC and convert with the fused kernel, into tensors on ``device``.

    ``transform`` is ``"triton"`` (the fused kernel) or ``"torch"`` (the reference ops,
    when Triton is missing).
    """

    device: torch.device
    transform: str = "triton"
    name: str = field(default="nvdec", init=False)

    @property
    def on_device(self) -> bool:
        return True

    def video_reader(
        self,
        store: Store,
        *,
        prefix: str = "",
        threads: int = 1,
        streams: int = CONCURRENCY.nvdec_streams,
        max_in_flight: int | None = None,
    ) -> GpuVideoReader:
        """A :class:`treadle.gpu.nvdec_reader.GpuVideoReader` writing into tensors on ``device``.

        ``streams`` NVDEC sessions (worker threads); ``threads`` is the CPU backend's
        and ignored here, so the loader can call both backends the same way.
        """
        from treadle.gpu.nvdec_reader import GpuVideoReader

        return GpuVideoReader(
            store,
            device=self.device,
            prefix=prefix,
            streams=streams,
            max_in_flight=max_in_flight,
            impl=self.transform,
        )


Backend = CpuBackend | NvdecBackend


def select_backend(
    device: torch.device | str | None = None, *, prefer: str | None = None
) -> Backend:
    """The video backend for batches that go to ``device`` (default: CPU).

    ``prefer``: ``"auto"`` (default; or ``$TREADLE_VIDEO_DECODE``): NVDEC when ``device``
    is CUDA and it works, else the CPU path with a one-time :class:`GpuFallbackWarning`
    naming the reason; ``"cpu"``: always the CPU path, silently; ``"nvdec"``: NVDEC or
    :class:`GpuUnavailable`. Never raises for a missing GPU under ``"auto"``.
    """
    dev = torch.device(device if device is not None else "cpu")
    prefer = (prefer or os.environ.get("TREADLE_VIDEO_DECODE") or "auto").lower()
    if prefer not in ("auto", "cpu", "nvdec"):
        raise ValueError(f"prefer must be auto, cpu or nvdec, got {prefer!r}")
    if dev.type != "cuda" or prefer == "cpu":
        return CpuBackend(dev)
    reason = cuda_unavailable(dev)
    if reason is None:
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", index)
        reason = nvdec_unavailable(index)
    if reason is not None:
        if prefer == "nvdec":
            raise GpuUnavailable(f"GPU video decode unavailable: {reason}")
        warn_once(
            f"backend:{reason}",
            f"treadle: decoding video on the CPU for device {device}: {reason}",
        )
        return CpuBackend(dev, reason)
    transform = "triton"
    why = triton_unavailable()
    if why is not None:
        transform = "torch"
        warn_once(
            f"transform:{why}",
            f"treadle: {why}; NV12 -> tensor conversion runs as torch ops (slower than the "
            "fused kernel). pip install triton to fuse it",
        )
    return NvdecBackend(dev, transform)

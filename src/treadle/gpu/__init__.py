"""treadle.gpu: NVDEC decode, the fused NV12 -> tensor kernel, and CPU fallback.

The loader calls :func:`select_backend` once with its device; the backend's
``video_reader(store, prefix=...)`` reads :class:`treadle.video.WindowRequest` batches,
either into tensors on the GPU (:class:`NvdecBackend`) or into host memory
(:class:`CpuBackend`). Importing this package needs no GPU, CUDA or Triton.
"""

from treadle.gpu.backend import CpuBackend, GpuUnavailable, NvdecBackend, select_backend
from treadle.gpu.fallback import GpuFallbackWarning, warn_once
from treadle.gpu.nvdec_decode import NvdecDecoder, decode_window_to
from treadle.gpu.nvdec_reader import GpuVideoReader
from treadle.gpu.yuv_colour import Colour, colour_from_annexb, parse_sps, sps_from_annexb
from treadle.gpu.yuv_to_tensor import (
    SWS_PARITY_FLAGS,
    chroma_mode_for,
    convert,
    nv12_convert,
    reference_convert,
)
from treadle.video.frame_spec import FrameSpec

__all__ = [
    "SWS_PARITY_FLAGS",
    "Colour",
    "CpuBackend",
    "FrameSpec",
    "GpuFallbackWarning",
    "GpuUnavailable",
    "GpuVideoReader",
    "NvdecBackend",
    "NvdecDecoder",
    "chroma_mode_for",
    "colour_from_annexb",
    "convert",
    "decode_window_to",
    "nv12_convert",
    "parse_sps",
    "reference_convert",
    "select_backend",
    "sps_from_annexb",
    "warn_once",
]

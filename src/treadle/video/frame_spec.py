"""What a window's decoded frames become: size, layout, dtype and normalisation.

:class:`FrameSpec` is the one description of a video output, shared by ``td.Video`` (its
``frame``), the CPU decoder (:mod:`treadle.video.cpu_decode`) and the GPU decoders
(:mod:`treadle.gpu`). It is a plain value: it says the shape of a window, allocates one,
checks a buffer handed in for one, and gives the float normalisation's constants. No I/O.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import VideoError

if TYPE_CHECKING:
    import torch

LAYOUTS = ("THWC", "TCHW")
#: Output dtypes by name: torch's and numpy's dtypes of the same name (numpy lacks
#: ``bfloat16``: those outputs are torch tensors).
DTYPES = ("uint8", "float32", "float16", "bfloat16")
#: A 16-bit image column's own type (depth maps): what ``dtype="uint8"`` delivers for it.
#: Not a ``td.Video`` dtype; the reader puts it in the column's frame spec.
RAW16 = "uint16"
CHANNELS = (1, 3)
_NUMPY_DTYPES = {n: np.dtype(n) for n in (*DTYPES, RAW16) if n != "bfloat16"}


def _norm(name: str, value: Any) -> tuple[float, float, float] | None:
    if value is None:
        return None
    try:
        t = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        raise VideoError(f"{name} must be 3 numbers (std > 0), got {value!r}") from None
    if len(t) != 3 or (name == "std" and any(x <= 0 for x in t)):
        raise VideoError(f"{name} must be 3 numbers (std > 0), got {value!r}")
    return t


@dataclass(frozen=True)
class FrameSpec:
    """The array a window's ``T`` frames become.

    ``size=(H, W)`` resizes (None: the stream's own size); ``layout`` is ``"THWC"`` or
    ``"TCHW"``; ``dtype`` is ``"uint8"`` or a float type (then pixels are ``x / 255``, and
    ``(x / 255 - mean) / std`` per channel when ``mean``/``std`` are given). ``channels``
    is 3 (RGB) or 1 (an image column's grey or 16-bit depth; no ``mean``/``std``), and
    ``dtype="uint16"`` is a 16-bit image column's raw values. Invalid values raise
    :class:`~treadle.errors.VideoError`.
    """

    size: tuple[int, int] | None = None
    layout: str = "THWC"
    dtype: str = "uint8"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    channels: int = 3

    def __post_init__(self) -> None:
        size = self.size
        if size is not None:
            try:
                h, w = (int(v) for v in size)
            except (TypeError, ValueError):
                raise VideoError(f"size must be (height, width), got {size!r}") from None
            if h <= 0 or w <= 0:
                raise VideoError(f"size must be positive, got {size!r}")
            object.__setattr__(self, "size", (h, w))
        if self.layout not in LAYOUTS:
            raise VideoError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.dtype not in (*DTYPES, RAW16):
            raise VideoError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if isinstance(self.channels, bool) or self.channels not in CHANNELS:
            raise VideoError(f"channels must be 3 (RGB) or 1 (grey, depth), got {self.channels!r}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is not None and self.dtype in ("uint8", RAW16):
                raise VideoError(f"{name} needs a float dtype")
            if value is not None and self.channels != 3:
                raise VideoError(f"{name} needs channels=3")
            object.__setattr__(self, name, _norm(name, value))

    @staticmethod
    def of(spec: Any) -> FrameSpec:
        """The frame spec of ``spec``: a :class:`FrameSpec`, or anything with one as its
        ``frame`` (``td.Video``)."""
        return spec if isinstance(spec, FrameSpec) else spec.frame

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # lazily: worker processes read host frames without torch

        return getattr(torch, self.dtype)

    @property
    def numpy_dtype(self) -> np.dtype | None:
        """The numpy dtype of a host output, None for ``bfloat16`` (a torch tensor)."""
        return _NUMPY_DTYPES.get(self.dtype)

    def size_for(self, height: int, width: int) -> tuple[int, int]:
        """Output (height, width) of a ``height x width`` stream."""
        return self.size if self.size is not None else (height, width)

    def shape(self, t: int, height: int, width: int) -> tuple[int, int, int, int]:
        """Shape of a window of ``t`` frames from a ``height x width`` stream."""
        h, w = self.size_for(height, width)
        c = self.channels
        return (t, h, w, c) if self.layout == "THWC" else (t, c, h, w)

    def allocate(
        self, t: int, height: int, width: int, *, batch: int | None = None, device: Any = None
    ) -> np.ndarray | torch.Tensor:
        """A fresh, uninitialised window (``[batch, ...]`` when ``batch`` is given).

        ``device=None``: host memory, a numpy array (a CPU torch tensor for ``bfloat16``);
        else a torch tensor on ``device``.
        """
        shape = self.shape(t, height, width)
        if batch is not None:
            shape = (batch, *shape)
        if device is None and self.numpy_dtype is not None:
            return np.empty(shape, dtype=self.numpy_dtype)
        import torch

        return torch.empty(shape, dtype=self.torch_dtype, device=device)

    def check(
        self, out: Any, t: int, height: int, width: int, where: str = "video", device: Any = None
    ) -> None:
        """Raise :class:`VideoError` naming ``where`` unless ``out`` can hold the window.

        ``device=None``: a numpy array of the dtype, or a CPU torch tensor; else a torch
        tensor on ``device``.
        """
        shape = self.shape(t, height, width)
        if _is_tensor(out):
            import torch

            want = torch.device("cpu" if device is None else device)
            ok = out.device == want and out.dtype == self.torch_dtype
        elif isinstance(out, np.ndarray) and device is None:
            if not out.flags.writeable:
                raise VideoError(f"{where}: out is read-only")
            ok = out.dtype == self.numpy_dtype
        else:
            kind = "a numpy array or a CPU torch tensor" if device is None else "a torch tensor"
            raise VideoError(f"{where}: out must be {kind}, got {type(out).__name__}")
        if ok and tuple(out.shape) == shape:
            return
        got = f"{tuple(out.shape)} {out.dtype}"
        if _is_tensor(out):
            got += f" on {out.device}"
        need = f"{shape} {self.dtype}" + ("" if device is None else f" on {device}")
        raise VideoError(f"{where}: out is {got}, the window needs {need}")

    def affine(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """(scale, shift) per channel with float output ~= ``q * scale + shift`` for uint8 ``q``.

        ``scale = 1 / (255 * std)`` (one uint8 level in output units) and ``shift =
        -mean / std``, computed in float64 and rounded to float32. An approximation for
        tolerances: the exact output is :meth:`levels`.
        """
        mean = np.array(self.mean or (0.0, 0.0, 0.0), dtype=np.float64)
        std = np.array(self.std or (1.0, 1.0, 1.0), dtype=np.float64)
        scale = (1.0 / (255.0 * std)).astype(np.float32).tolist()
        shift = (-mean / std).astype(np.float32).tolist()
        return tuple(scale), tuple(shift)

    def normalise_(self, x: torch.Tensor, channel_dim: int) -> torch.Tensor:
        """In place on float32 ``x`` holding integer levels 0..255: ``x / 255``, then
        ``(x - mean) / std`` per channel (float32, each op rounded once).

        The one definition of float output: with no mean/std it equals
        ``torch.tensor(q, dtype=torch.float32) / 255`` exactly (LeRobot's and torchvision's
        ``x / 255``), and with them torchvision's ``Normalize`` of that. Every decoder
        (CPU, workers, GPU reference, Triton kernel via :meth:`levels`) gives these values.
        """
        import torch

        x.div_(255)
        if self.mean is not None or self.std is not None:
            shape = [1] * x.dim()
            shape[channel_dim] = 3
            mean = torch.tensor(self.mean or (0.0, 0.0, 0.0), dtype=torch.float32)
            std = torch.tensor(self.std or (1.0, 1.0, 1.0), dtype=torch.float32)
            x.sub_(mean.view(shape)).div_(std.view(shape))
        return x

    def store_(self, src: torch.Tensor, dst: torch.Tensor, channel_dim: int) -> None:
        """Write uint8 frames ``src`` into ``dst`` as this spec's dtype says: copied for
        uint8, else as :meth:`normalise_` floats (in ``dst`` itself when it is float32)."""
        import torch

        if self.dtype == "uint8":
            dst.copy_(src)
        elif dst.dtype == torch.float32:
            dst.copy_(src)
            self.normalise_(dst, channel_dim)
        else:
            dst.copy_(self.normalise_(src.to(torch.float32), channel_dim))

    def levels(self) -> torch.Tensor:
        """float32 ``[3, 256]``: the float output of each uint8 level per channel
        (:meth:`normalise_` of ``0..255``, computed on the CPU)."""
        import torch

        q = torch.arange(256, dtype=torch.float32).repeat(3, 1)
        return self.normalise_(q, 0)


def _is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (none exists unless torch was imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def __getattr__(name: str) -> Any:
    if name == "TORCH_DTYPES":  # {dtype name: torch dtype}, made on first use (imports torch)
        import torch

        return {n: getattr(torch, n) for n in DTYPES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Seed-driven, vectorised video augmentations for ``TrainLoader(..., transform=...)``.

Every op draws its random numbers only from the per-sample ``seeds`` the loader passes
(``uint64 [b]``, a pure function of the run seed and each sample's global position), so an
augmented batch replays exactly after a restart and at any rank count. One draw per sample
and op: all frames of a sample's window get the same crop, flip and colour change.

Ops take a channels-last video ``[b, ..., H, W, C]`` (``uint8`` or float; numpy or torch)
and return the same layout and dtype (``uint8`` results are rounded and clamped). Costs are
per frame (one CPU thread, 224x224x3 uint8 frames, a busy 2-core machine; ``bench/
case_augment.py`` measures them inside a loader):

- :class:`RandomResizedCrop` — one bilinear resample (``grid_sample``): ~4 reads and 1
  write per output value, plus a float copy of the input frame: ~3-5 ms (to 196x196).
- :class:`HorizontalFlip` — one copy of the batch: ~0.6 ms.
- :class:`BrightnessContrast` — a per-sample mean, one multiply-add per value, a float
  copy and the rounding back to uint8: ~1.2 ms.

:class:`Augment` applies a list of ops to some columns of a batch; it is a plain class at
module level, so it pickles into ``workers > 0`` processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.permute import mix64

__all__ = ["Augment", "BrightnessContrast", "HorizontalFlip", "RandomResizedCrop", "uniforms"]

_53 = float(2**-53)


def uniforms(seeds: np.ndarray, salt: int, k: int = 1) -> np.ndarray:
    """``float64 [b, k]`` in ``[0, 1)``: ``k`` independent draws per seed for stream ``salt``."""
    s = np.asarray(seeds, np.uint64)
    with np.errstate(over="ignore"):
        z = s[:, None] ^ np.uint64(mix64(np.asarray([salt], np.uint64))[0])
        z = mix64(z + np.arange(1, k + 1, dtype=np.uint64)[None, :] * np.uint64(0x9E3779B97F4A7C15))
    return (z >> np.uint64(11)).astype(np.float64) * _53


def _as_torch(video: Any) -> tuple[torch.Tensor, bool]:
    if isinstance(video, np.ndarray):
        return torch.from_numpy(video), True
    if isinstance(video, torch.Tensor):
        return video, False
    raise PlanError(f"augmentations take a numpy array or torch tensor, got {type(video).__name__}")


def _back(out: torch.Tensor, like: torch.Tensor, was_numpy: bool) -> Any:
    if like.dtype == torch.uint8:
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    else:
        out = out.to(like.dtype)
    return out.numpy() if was_numpy else out


def _check(video: torch.Tensor, seeds: np.ndarray, op: str) -> None:
    if video.ndim < 4:
        raise PlanError(f"{op}: video must be [b, ..., H, W, C], got shape {tuple(video.shape)}")
    if len(seeds) != video.shape[0]:
        raise PlanError(f"{op}: {len(seeds)} seeds for a batch of {video.shape[0]} samples")


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random box (area ``scale`` of the frame, aspect ``ratio``), resize to ``size``
    ``(H, W)`` bilinearly. Vectorised: one ``grid_sample`` over all frames of the batch."""

    size: tuple[int, int]
    scale: tuple[float, float] = (0.5, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    salt: int = 1

    def __call__(self, video: Any, seeds: np.ndarray) -> Any:
        x, was_numpy = _as_torch(video)
        _check(x, seeds, "RandomResizedCrop")
        b, h, w, c = x.shape[0], x.shape[-3], x.shape[-2], x.shape[-1]
        u = uniforms(seeds, self.salt, 4)
        area = self.scale[0] + u[:, 0] * (self.scale[1] - self.scale[0])
        log_r = np.log(self.ratio[0]) + u[:, 1] * (np.log(self.ratio[1]) - np.log(self.ratio[0]))
        r = np.exp(log_r)
        # aspect ``r`` is in pixels (width / height); the box as fractions of the frame
        cw = np.clip(np.sqrt(area * r * h / w), 1e-6, 1.0)
        ch = np.clip(np.sqrt(area / r * w / h), 1e-6, 1.0)
        cx = (u[:, 2] * (1 - cw) + cw / 2) * 2 - 1  # box centre in [-1, 1]
        cy = (u[:, 3] * (1 - ch) + ch / 2) * 2 - 1
        theta = np.zeros((b, 2, 3), np.float32)
        theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = cw, cx, ch, cy
        frames = x.reshape(b, -1, h, w, c)
        t = frames.shape[1]
        inp = frames.reshape(b * t, h, w, c).permute(0, 3, 1, 2).float()
        th = torch.from_numpy(theta).to(x.device).repeat_interleave(t, dim=0)
        grid = torch.nn.functional.affine_grid(th, [b * t, c, *self.size], align_corners=False)
        out = torch.nn.functional.grid_sample(
            inp, grid, mode="bilinear", padding_mode="border", align_corners=False
        )
        out = out.permute(0, 2, 3, 1).reshape(*x.shape[:-3], *self.size, c)
        return _back(out, x, was_numpy)


@dataclass(frozen=True)
class HorizontalFlip:
    """Mirror left-right with probability ``p`` per sample."""

    p: float = 0.5
    salt: int = 2

    def __call__(self, video: Any, seeds: np.ndarray) -> Any:
        x, was_numpy = _as_torch(video)
        _check(x, seeds, "HorizontalFlip")
        flip = torch.from_numpy(uniforms(seeds, self.salt)[:, 0] < self.p).to(x.device)
        out = x.clone()
        out[flip] = x[flip].flip(-2)
        return out.numpy() if was_numpy else out


@dataclass(frozen=True)
class BrightnessContrast:
    """``x' = (x - m) * c + m + d`` per sample: contrast ``c`` in ``1 +- contrast`` around each
    frame's mean ``m``, brightness ``d`` in ``+- brightness`` of the full range (255 for
    uint8, 1 for floats)."""

    brightness: float = 0.2
    contrast: float = 0.2
    salt: int = 3

    def __call__(self, video: Any, seeds: np.ndarray) -> Any:
        x, was_numpy = _as_torch(video)
        _check(x, seeds, "BrightnessContrast")
        u = uniforms(seeds, self.salt, 2)
        full = 255.0 if x.dtype == torch.uint8 else 1.0
        shape = (len(seeds),) + (1,) * (x.ndim - 1)
        c = torch.from_numpy(1 + (2 * u[:, 0] - 1) * self.contrast).float().reshape(shape)
        d = torch.from_numpy((2 * u[:, 1] - 1) * self.brightness * full).float().reshape(shape)
        xf = x.to(torch.float32, copy=True)  # a copy even for float input: changed in place
        m = xf.mean(dim=(-3, -2, -1), keepdim=True)
        c = c.to(x.device)
        out = xf.mul_(c).add_(m * (1 - c) + d.to(x.device))  # (x - m) c + m + d, in place
        return _back(out, x, was_numpy)


class Augment:
    """``transform=Augment(["cam"], [RandomResizedCrop((96, 96)), HorizontalFlip()])``:
    apply ``ops`` in order to each named column of the batch (others pass through)."""

    def __init__(self, columns: Sequence[str] | str, ops: Sequence[Any]):
        self.columns = [columns] if isinstance(columns, str) else list(columns)
        self.ops = list(ops)

    def __call__(self, batch: dict[str, Any], seeds: np.ndarray) -> dict[str, Any]:
        out = dict(batch)
        for col in self.columns:
            if col not in out:
                raise PlanError(f"Augment: the batch has no column {col!r}; it has {sorted(out)}")
            for op in self.ops:
                out[col] = op(out[col], seeds)
        return out

    def __repr__(self) -> str:
        return f"Augment({self.columns!r}, {self.ops!r})"

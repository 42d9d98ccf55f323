"""The one numpy -> torch conversion of the delivery path."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def to_torch(
    arrays: dict[str, Any], device: torch.device | None = None, pin: bool = False
) -> dict[str, Any]:
    """numpy arrays -> tensors (zero copy when contiguous), moved to ``device`` when given.

    Lists (strings, variable-length lists) stay as they are; tensors already on ``device``
    (video NVDEC decoded there) are not copied. ``pin``: page-lock host tensors before a
    non-blocking copy to a CUDA ``device``.
    """
    out = {}
    for k, v in arrays.items():
        if isinstance(v, list):
            out[k] = v
            continue
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
        if device is not None and t.device != device:
            if pin and t.device.type == "cpu":
                t = t.pin_memory()
            t = t.to(device, non_blocking=True)
        out[k] = t
    return out

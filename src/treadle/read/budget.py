"""A batch too big for this machine is refused when the loader is made, not at step 0.

:func:`batch_bytes_floor` is a lower bound of one rank's batch in bytes, from what the plan
alone fixes: ``samples`` times the smallest sample any component gives (each fixed-width
column's values at one byte each, each video frame at its ``Video(size=...)`` and dtype, or
one pixel when the stream's own size is kept, and the four int64 sample ids). No store is
read. :func:`check_batch_fits` refuses a batch whose lower bound is over the machine's
physical memory: such a batch cannot be allocated, and would fail with ``MemoryError``
(or the kernel's OOM killer) at the first step.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from treadle.errors import PlanError
from treadle.read.columns import ColumnSpec, output_columns
from treadle.table.tensors import tensor_shape
from treadle.video.frame_spec import FrameSpec

if TYPE_CHECKING:
    from treadle.table.table import Table

_IDS = 4 * 8  # _component, _moment, _episode, _frame: int64 each
_ITEMSIZE = {"uint8": 1, "uint16": 2, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def physical_memory() -> int | None:
    """Bytes of physical memory (None where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _column_floor(cs: ColumnSpec, table: Table) -> int:
    t = 1 if cs.spec is None or cs.at_moment else len(cs.spec.offsets)
    if cs.video:
        frame = FrameSpec.of(cs.spec) if cs.spec is not None else FrameSpec()
        frame = cs.image.frame if cs.image is not None else frame  # uint16 for 16-bit images
        image = cs.image.first.size if cs.image is not None else None
        h, w = frame.size or image or (1, 1)
        return t * h * w * frame.channels * _ITEMSIZE.get(frame.dtype, 1)
    if cs.listed:
        return 0
    if cs.absent:  # an optional column this table lacks: not in its schema (0: a bound)
        return 0
    shape = tensor_shape(table.schema.field(cs.column))
    n = math.prod(shape) if shape else 1
    if shape and cs.pad_to is not None:  # the last dimension is zero-padded to pad_to
        n = n // shape[-1] * cs.pad_to
    return t * n


def batch_bytes_floor(plan: Any, samples: int) -> int:
    """A lower bound of the bytes of a batch of ``samples`` samples of ``plan``."""
    per_sample = min(
        _IDS + sum(_column_floor(cs, plan.table(c)) for cs in specs)
        for c, specs in enumerate(output_columns(plan))
    )
    return samples * per_sample


def check_batch_fits(plan: Any, samples: int, memory: int | None = None) -> None:
    """:class:`PlanError` when one batch of ``samples`` is surely over physical memory."""
    memory = physical_memory() if memory is None else memory
    if memory is None:
        return
    need = batch_bytes_floor(plan, samples)
    if need > memory:
        raise PlanError(
            f"one batch of {samples} samples needs at least {need / 2**30:.1f} GiB, more than "
            f"this machine's {memory / 2**30:.1f} GiB of memory: use a smaller batch_size "
            "(or more ranks) or a smaller Video(size=...)"
        )

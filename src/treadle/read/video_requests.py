"""Video windows of a batch: one :class:`~treadle.video.WindowRequest` per sample, each
decoding straight into its slice of a preallocated batch buffer.

:func:`video_requests` looks up each sample's stream index (:mod:`treadle.read.stream_index`),
allocates the column's ``[b, ...]`` buffer on its first sample (host memory, or tensors on
the device when NVDEC decodes there) and checks every window fits it. The
requests of a whole batch are then read together (coalesced byte ranges, many in flight)
by the backend's video reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.windows import Video
from treadle.read.buffers import BufferPool
from treadle.read.columns import ColumnSpec
from treadle.read.rows import IS_PAD, episode_bounds, padded_rows
from treadle.read.stream_index import StreamIndexes

if TYPE_CHECKING:
    import torch

    from treadle.table.table import Table


def video_requests(
    table: Table,
    cs: ColumnSpec,
    moments: np.ndarray,
    slots: np.ndarray,
    out: dict[str, Any],
    b: int,
    streams: StreamIndexes,
    device: torch.device | None = None,
    buffers: BufferPool | None = None,
) -> list[Any]:
    """The window reads of video column ``cs`` for the samples ``moments`` at ``slots`` of
    the ``b``-sample batch ``out`` (its buffer ``out[cs.name]`` is made on the first sample;
    padding is written here). ``device``: the buffers are tensors there (NVDEC output);
    ``buffers``: host buffers come from this pool (reused once nothing refers to them)."""
    from treadle.video import WindowRequest

    episodes = table.episodes()
    spec: Video = cs.spec
    offsets = np.asarray(spec.offsets, np.int64)
    reqs = []
    if spec.pad:
        grid, pad = padded_rows(table, moments, offsets)
        out[f"{cs.name}{IS_PAD}"][slots] = pad
    streams.load(table, cs.column, episode_bounds(table, moments)[0])  # one take for all
    for i, (slot, m) in enumerate(zip(slots, moments)):
        e = int(np.searchsorted(episodes.starts, m, side="right") - 1)
        key, index = streams.lookup(table, cs.column, e)
        frame = int(m - episodes.starts[e])
        # padded: the episode's edge frames, repeated (decoded once, copied per slot)
        frames = grid[i] - episodes.starts[e] if spec.pad else frame + offsets
        t, hw = len(offsets), (index.height, index.width)
        shape = spec.frame.shape(t, *hw)
        dest = out.get(cs.name)
        if dest is None:
            if buffers is not None and device is None:
                dest = buffers.allocate(spec.frame, t, *hw, batch=b)
            else:
                dest = spec.frame.allocate(t, *hw, batch=b, device=device)
            out[cs.name] = dest
        target = dest[slot]
        if tuple(target.shape) != shape:
            raise PlanError(
                f"column {cs.column!r}: episode {episodes.names[e]!r} of table "
                f"{table.name!r} decodes to {shape}, the batch holds {tuple(target.shape)}; "
                "give the Video spec a size=(H, W) to stack streams of different sizes"
            )
        where = (table.name, episodes.names[e], cs.column)
        reqs.append(WindowRequest(key=key, index=index, frames=frames, spec=spec, where=where,
                                  out=target))  # fmt: skip
    return reqs

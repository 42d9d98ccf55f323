"""Video windows of a batch: one :class:`~treadle.video.WindowRequest` per sample, each
decoding straight into its slice of a preallocated batch buffer.

:func:`window_requests` looks up each sample's stream index (:mod:`treadle.read.stream_index`)
and makes its request, with no output yet (a reader runs it ahead, with the fetch of the
windows' bytes); :func:`bind_requests` allocates the column's ``[b, ...]`` buffer on its
first sample (host memory, or tensors on the device when NVDEC decodes there), checks every
window fits it and points each request at its slice; :func:`video_requests` does both. The
requests of a whole batch are read together (coalesced byte ranges, many in flight) by the
backend's video reader.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Prepared:
    """A batch's video stage, run ahead of its decode: per video column the column, the
    samples' slots, how many of the requests are its and the padding flags (None unless
    padded); the window requests (no output yet: the batch's buffers are bound when it is
    assembled), and their fetched bytes (None when the video reader cannot fetch ahead:
    it then reads the requests while decoding); image columns' windows, bytes read."""

    columns: list[tuple[ColumnSpec, np.ndarray, int, np.ndarray | None]]
    requests: list[Any]
    fetched: list[Any] | None
    # image columns (read/image_requests.py): column, slots, windows (bytes read), padding
    images: list[tuple[ColumnSpec, np.ndarray, list[Any], np.ndarray | None]] = ()  # type: ignore[assignment]

    @property
    def nbytes(self) -> int:
        """Bytes of the fetched windows (images: their encoded bytes)."""
        images = sum(w.nbytes for _, _, ws, _ in self.images for w in ws)
        return images + sum(len(w.data) for w in self.fetched or ())

    def bind(
        self, out: dict[str, Any], b: int, device: Any = None, buffers: BufferPool | None = None
    ) -> list[Any]:
        """The batch's windows (fetched, or requests), each pointed at its slot of the
        batch's buffers in ``out`` (:func:`bind_requests`)."""
        items = self.fetched if self.fetched is not None else self.requests
        bound: list[Any] = []
        at = 0
        for cs, slots, n, pad in self.columns:
            bound += bind_requests(cs, items[at : at + n], slots, pad, out, b, device, buffers)
            at += n
        return bound


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
    ``buffers``: host buffers come from this pool (reused once nothing refers to them).
    :func:`window_requests` then :func:`bind_requests`."""
    reqs, pad = window_requests(table, cs, moments, streams)
    return bind_requests(cs, reqs, slots, pad, out, b, device, buffers)


def window_requests(
    table: Table, cs: ColumnSpec, moments: np.ndarray, streams: StreamIndexes
) -> tuple[list[Any], np.ndarray | None]:
    """The window reads of video column ``cs`` for the samples ``moments``, with no output
    yet (stream indexes looked up: a reader runs this ahead, with the fetch of the windows'
    bytes), and the padding flags of a padded ``Video`` (None otherwise)."""
    from treadle.video import WindowRequest

    episodes = table.episodes()
    spec: Video = cs.spec
    offsets = np.asarray(spec.offsets, np.int64)
    pad = None
    if spec.pad:
        grid, pad = padded_rows(table, moments, offsets)
    streams.load(table, cs.column, episode_bounds(table, moments)[0])  # one take for all
    reqs = []
    for i, m in enumerate(moments):
        e = int(np.searchsorted(episodes.starts, m, side="right") - 1)
        key, index = streams.lookup(table, cs.column, e)
        # padded: the episode's edge frames, repeated (decoded once, copied per slot)
        frames = grid[i] - episodes.starts[e] if spec.pad else int(m - episodes.starts[e]) + offsets
        where = (table.name, episodes.names[e], cs.column)
        reqs.append(WindowRequest(key=key, index=index, frames=frames, spec=spec, where=where))
    return reqs, pad


def bind_requests(
    cs: ColumnSpec,
    reqs: list[Any],
    slots: np.ndarray,
    pad: np.ndarray | None,
    out: dict[str, Any],
    b: int,
    device: torch.device | None = None,
    buffers: BufferPool | None = None,
) -> list[Any]:
    """``reqs`` (of :func:`window_requests`, or their fetched windows: anything with a
    ``request``) each writing into its slot of ``out[cs.name]``, made on the first;
    ``pad`` written to ``out``. Every window is checked to fit the batch's buffer."""
    spec: Video = cs.spec  # type: ignore[assignment]
    t = len(spec.offsets)
    if pad is not None:
        out[f"{cs.name}{IS_PAD}"][slots] = pad
    bound = []
    for slot, r in zip(slots, reqs):
        req = getattr(r, "request", r)
        hw = (req.index.height, req.index.width)
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
            table, episode, _ = req.where
            raise PlanError(
                f"column {cs.column!r}: episode {episode!r} of table {table!r} decodes to "
                f"{shape}, the batch holds {tuple(target.shape)}; give "
                f"{'ScanDataset' if cs.at_moment else 'the Video spec'} a size=(H, W) to "
                "stack streams of different sizes"
            )
        req = dataclasses.replace(req, out=target)
        bound.append(dataclasses.replace(r, request=req) if req is not r else req)
    return bound

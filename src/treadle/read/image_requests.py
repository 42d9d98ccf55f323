"""Image columns of a batch: each sample's encoded frames read with the batch's takes, and
decoded by Pillow on the reader's decode threads straight into the batch's buffer.

:func:`image_windows` (run ahead, like a video column's window fetch) reads the rows of a
sample's window from the binary column, once per column and batch (straight from the data
files: :mod:`treadle.read.cached_values`; else one Lance take);
:func:`bind_images` allocates the column's ``[b, ...]`` buffer and points each window at its
slot; :class:`ImageDecoder` decodes the windows on its threads, a few per task
(:func:`~treadle.video.image_decode.decode_frame`, then the frame spec's layout and dtype),
never on the thread that delivers the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.concurrency import submit
from treadle.errors import CorruptData, PlanError, TreadleError
from treadle.read.buffers import BufferPool
from treadle.read.cached_values import CachedValues
from treadle.read.columns import ColumnSpec
from treadle.read.rows import IS_PAD, padded_rows
from treadle.video.image_decode import decode_frame, write_frame

if TYPE_CHECKING:
    from treadle.plan.image_columns import ImageColumn
    from treadle.table.table import Table


@dataclass(frozen=True)
class ImageWindow:
    """One sample's frames of one image column: the encoded values (None for a null), the
    row of each (a padded window repeats its edge rows), and where its output goes."""

    values: list[Any]
    rows: np.ndarray
    first_row: int  # the episode's first row: a frame is ``row - first_row``
    where: tuple[str, str, str]  # table, episode, column
    image: ImageColumn
    out: Any = None

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.values if v is not None)


def image_windows(
    table: Table, cs: ColumnSpec, moments: np.ndarray, cached: CachedValues | None = None
) -> tuple[list[ImageWindow], np.ndarray | None]:
    """The windows of image column ``cs`` for the samples ``moments`` (their bytes read:
    one take, from ``cached``'s local copies where it has them), and the padding flags of a
    padded ``Video`` (None otherwise)."""
    spec = cs.spec
    offsets = np.asarray(spec.offsets, np.int64)
    moments = np.asarray(moments, np.int64)
    pad = None
    if spec.pad:
        rows, pad = padded_rows(table, moments, offsets)
    else:
        rows = moments[:, None] + offsets[None, :]
    uniq, inverse = np.unique(rows.reshape(-1), return_inverse=True)
    values = None if cached is None else cached.take(table, uniq, cs.column)
    if values is None:
        values = table.take(uniq, [cs.column]).column(cs.column).to_pylist()
    inverse = inverse.reshape(rows.shape)
    episodes = table.episodes()
    e = np.searchsorted(episodes.starts, moments, side="right") - 1
    out = []
    for i in range(len(moments)):
        where = (table.name, episodes.names[int(e[i])], cs.column)
        out.append(ImageWindow([values[k] for k in inverse[i].tolist()], rows[i],
                               int(episodes.starts[int(e[i])]), where, cs.image))  # fmt: skip
    return out, pad


def bind_images(
    items: list[tuple[ColumnSpec, np.ndarray, list[ImageWindow], np.ndarray | None]],
    out: dict[str, Any],
    b: int,
    buffers: BufferPool | None = None,
) -> list[ImageWindow]:
    """Every window of ``items`` (column, slots, windows, padding) pointed at its slot of
    ``out[column]`` (host memory; made on its first window), padding flags written."""
    bound = []
    for cs, slots, windows, pad in items:
        if pad is not None:
            out[f"{cs.name}{IS_PAD}"][slots] = pad
        for slot, w in zip(slots.tolist(), windows):
            frame, first = w.image.frame, w.image.first
            t = len(w.values)
            h, wd = frame.size_for(first.height, first.width)
            dest = out.get(cs.name)
            if dest is None:
                if buffers is not None:
                    dest = buffers.allocate(frame, t, h, wd, batch=b)
                else:
                    dest = frame.allocate(t, h, wd, batch=b)
                out[cs.name] = dest
            target = dest[slot]
            if tuple(target.shape) != frame.shape(t, h, wd):
                raise PlanError(
                    f"column {cs.column!r}: images of table {w.where[0]!r} decode to "
                    f"{frame.shape(t, h, wd)}, the batch holds {tuple(target.shape)}; give "
                    "the td.Video specs one size=(H, W) to stack tables of different sizes"
                )
            if str(getattr(target, "dtype", "")).split(".")[-1] != frame.dtype:
                raise PlanError(
                    f"column {cs.column!r}: table {w.where[0]!r} gives {frame.dtype} frames, "
                    f"the batch holds {target.dtype} (16-bit and 8-bit images do not stack)"
                )
            bound.append(dataclasses.replace(w, out=target))
    return bound


def decode_window(w: ImageWindow) -> Any:
    """Decode one window's frames into ``w.out`` (a frame repeated by padding is copied)."""
    frame, first = w.image.frame, w.image.first
    table, episode, column = w.where
    for j, data in enumerate(w.values):
        if j and w.rows[j] == w.rows[j - 1]:
            w.out[j] = w.out[j - 1]
            continue
        where = (f"table {table!r}, episode {episode!r}, column {column!r}, frame "
                 f"{int(w.rows[j]) - w.first_row}")  # fmt: skip
        if data is None:
            raise CorruptData(f"{where}: null image")
        write_frame(decode_frame(data, frame, first, where), frame, w.out[j])
    return w.out


class ImageDecoder:
    """Decodes image windows on ``threads`` threads (Pillow releases the GIL while it
    decodes and resizes, so threads run in parallel on free cores)."""

    def __init__(self, threads: int = 1, copy_objects: bool = True):
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max(1, int(threads)), thread_name_prefix="treadle-image"
        )
        self.cached = CachedValues(copy_objects)  # values from data files (or their copies)

    def windows(
        self, table: Table, cs: ColumnSpec, moments: np.ndarray
    ) -> tuple[list[ImageWindow], np.ndarray | None]:
        """:func:`image_windows`, read through this decoder's :class:`CachedValues`."""
        return image_windows(table, cs, moments, self.cached)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.cached.close()

    def submit(self, windows: Sequence[ImageWindow]) -> Callable[[], list[Any]]:
        """Start decoding ``windows``; the call returned waits for them (raising the first
        failing window, in order, once every window ended)."""
        if self._pool is None:
            raise TreadleError("the image decoder is closed")
        groups = [
            windows[i : i + WINDOWS_PER_TASK] for i in range(0, len(windows), WINDOWS_PER_TASK)
        ]
        futures = [submit(self._pool, _decode_group, g) for g in groups]
        return lambda: _results(futures)


#: Windows one decode task decodes in turn: a future per window cost ~4% of the GIL's time
#: (its result's lock and notify); the next batch's tasks are queued before a batch is
#: waited for, so the threads stay busy however a batch's tasks end.
WINDOWS_PER_TASK = 8


def _decode_group(windows: Sequence[ImageWindow]) -> tuple[list[Any], TreadleError | None]:
    """Each window decoded in order: their outputs, and the first error (the others are
    still decoded, as separate tasks would be)."""
    outs: list[Any] = []
    first: TreadleError | None = None
    for w in windows:
        try:
            outs.append(decode_window(w))
        except TreadleError as e:
            first = first or e
    return outs, first


def _results(futures: Sequence[Future[Any]]) -> list[Any]:
    outs: list[Any] = []
    first: BaseException | None = None
    for f in futures:
        try:
            got, err = f.result()
            outs += got
            first = first or err
        except TreadleError as e:
            first = first or e
    if first is not None:
        raise first
    return outs

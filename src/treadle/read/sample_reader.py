"""The reader: the batch of the samples it is handed, one stage at a time.

A :class:`SampleReader` holds no plan. It is given, per component, the pinned table and
what the component gives (:mod:`treadle.read.columns`), and is then handed samples —
``(component, moment)`` arrays, or objects with ``.component`` and ``.moment`` such as a
plan's :class:`~treadle.plan.plan.Batch` — and reads exactly those:

1. **Takes** (:mod:`treadle.read.takes`): per component, one Lance take per set of row
   columns with the same offsets. :meth:`SampleReader.read_many` runs the takes of the
   next batch it was handed ahead, on a bounded pool
   (:func:`treadle.read.prefetch.ordered_map`), while the current one is assembled.
2. **Video** (:mod:`treadle.read.video_requests`): a request per sample and video column, each
   decoding into its slice of the preallocated batch buffer; a batch's requests are read
   together by the video reader. :meth:`SampleReader.prepare` (stream indexes, buffers,
   the windows' bytes) runs ahead with the next batch's takes, so those reads overlap
   the current batch's decode; the decode itself runs when the batch is assembled.
3. **Assembly**: rows written at their slots, the moment-video time axis dropped, and the
   ids ``_component``, ``_moment``, ``_episode`` (index in its table) and ``_frame``
   (int64 ``[b]``).

The result is a dict of numpy arrays in slot order (strings and variable-length lists as
Python lists; device tensors for video an on-device backend decoded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np

from treadle import reaper
from treadle.concurrency import CONCURRENCY
from treadle.read import takes as _takes
from treadle.read.buffers import BufferPool
from treadle.read.columns import (
    ColumnSpec,
    mask_columns,
    pad_columns,
    present_columns,
    squeeze_moment_video,
)
from treadle.read.fixed import FixedReader
from treadle.read.image_requests import ImageDecoder, bind_images
from treadle.read.prefetch import ordered_map
from treadle.read.stream_index import StreamIndexes
from treadle.read.takes import Take, Taken, cheap, fixed_groups, run_take, take_groups, write_taken
from treadle.read.video_requests import Prepared, window_requests
from treadle.video.fetch import chunked_fetcher

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore
    from treadle.table.table import Table
    from treadle.video.protocols import FetchingVideoReader, VideoBackend, VideoWindowReader


class Samples(Protocol):
    """What the reader is handed: the samples of one batch, in slot order."""

    component: np.ndarray
    moment: np.ndarray


@dataclass(frozen=True)
class SampleArrays:
    """A plain :class:`Samples`: component index and moment row per slot."""

    component: np.ndarray
    moment: np.ndarray


S = TypeVar("S", bound=Samples)


@dataclass(frozen=True)
class _Planned:
    """End of one batch's takes in the read-ahead stream (runs as a no-op take)."""

    samples: Any


@dataclass(frozen=True)
class _Video:
    """A batch's video stage in the read-ahead stream: runs :meth:`SampleReader.prepare`."""

    samples: Any


class SampleReader:
    """Reads the batches of the samples it is handed. Drive it from one thread at a time.

    ``tables[c]`` and ``columns[c]`` are component ``c``'s pinned table and output columns
    (:func:`~treadle.read.columns.output_columns` of a plan, or one table's
    :func:`~treadle.read.columns.moment_columns`). ``backend`` is a
    :mod:`treadle.gpu` backend (its video reader decodes, into device tensors when it is
    on the device); None decodes on the CPU. ``ids=False`` gives only ``_moment``.
    Fixed-width row columns (numbers, tensors) are read through
    :class:`~treadle.read.fixed.FixedReader`; ``fixed_columns=False`` reads every row
    column with a Lance take (the reference path, compared in ``bench/take_paths.py``).
    ``read_ahead``: the batches whose takes and window bytes are read while one is
    assembled (None: 1 on a local store, ``CONCURRENCY.cloud_read_ahead`` on an object store),
    fewer while a batch's row values and window bytes times that exceed
    ``CONCURRENCY.read_ahead_bytes``. Decoded frames are never read ahead: a batch's frame
    buffers are taken when it is assembled. ``copy_objects``: on an object store, map wide
    fixed-width columns from copies of their data files in the local object cache
    (:mod:`treadle.storage.filecache`); False for a reader of a batch or two.
    ``chunks``: a chunk store whose chunks rows past the object cache, and video windows,
    are read from (a loader's ``lookahead``). ``resident_bytes``: how much of narrow
    fixed-width columns it may read whole into memory (None: :data:`~treadle.read.fixed.
    RESIDENT_BYTES`; 0: every one read by Lance takes, for a reader of one batch).
    """

    def __init__(
        self,
        tables: Sequence[Table],
        columns: list[list[ColumnSpec]],
        *,
        video_threads: int = 1,
        backend: VideoBackend | None = None,
        ids: bool = True,
        fixed_columns: bool = True,
        read_ahead: int | None = None,
        copy_objects: bool = True,
        resident_bytes: int | None = None,
        chunks: ChunkStore | None = None,
    ):
        self.tables = list(tables)
        self.columns = columns
        self.backend = backend
        self.ids = ids
        project = self.tables[0].project
        store, prefix = project.store, project.prefix
        self._video: VideoWindowReader
        if read_ahead is None:
            read_ahead = 1 if store.is_local else CONCURRENCY.cloud_read_ahead
        if int(read_ahead) < 1:
            raise ValueError(f"read_ahead must be at least 1 batch, not {read_ahead!r}")
        self.read_ahead = self._hold = self._depth = int(read_ahead)  # see hold_ahead, _adapt
        if backend is None:
            from treadle.video import VideoReader

            self._video = VideoReader(store, prefix=prefix, threads=video_threads)
        else:
            self._video = backend.video_reader(store, prefix=prefix, threads=video_threads)
        self._device = backend.device if backend is not None and backend.on_device else None
        self.streams = self._streams = StreamIndexes()
        self.media = chunked_fetcher(self._video, chunks)  # lookahead: windows from chunks
        self._buffers = BufferPool()
        keep: dict[str, Any] = {} if resident_bytes is None else {"resident_bytes": resident_bytes}
        if chunks is not None:  # lookahead: rows of files past the object cache from chunks
            keep["chunks"] = chunks
        self._fixed = FixedReader(copy_objects=copy_objects, **keep) if fixed_columns else None
        self.fixed = self._fixed
        self._groups = [fixed_groups(t, cs, self._fixed) for t, cs in zip(self.tables, columns)]
        self._pads = pad_columns(columns)
        self._masks = mask_columns(columns)
        self._present = present_columns(columns)
        self._all = [cs for specs in columns for cs in specs]
        # the takes of one batch at most (every component's groups) and its end marker
        self._starts: dict[int, np.ndarray] = {}  # per component: first row of each episode
        self._has_video = any(c.video for c in self._all)
        self._images = ImageDecoder(video_threads, copy_objects)  # threads: at the first batch
        self._per_batch = 1 + int(self._has_video) + sum(len(take_groups(cs)) for cs in columns)

    def close(self) -> None:
        """Stop the video reader (its threads and connections); unmap the row columns."""
        self._video.close()
        self._images.close()
        self._buffers.clear()
        if self._fixed is not None:
            self._fixed.close()

    def read(self, component: np.ndarray, moment: np.ndarray) -> dict[str, Any]:
        """The batch of these (component, moment) samples, in this order."""
        [(_, out)] = list(self.read_many([SampleArrays(component, moment)]))
        return out

    def read_many(self, samples: Iterable[S]) -> Iterator[tuple[S, dict[str, Any]]]:
        """``(samples, batch)`` for each item of ``samples``, in order. While a batch is
        assembled and decoded, the takes and the video stage (stream indexes, window bytes:
        :meth:`prepare`) of the next ``read_ahead`` items handed in run ahead; nothing is
        read that was not handed in."""

        def stream() -> Iterator[Take | _Video | _Planned]:
            for s in samples:
                yield from self.takes(s.component, s.moment)
                if self._has_video:
                    yield _Video(s)
                yield _Planned(s)

        # In flight: this batch's takes and the next read_ahead batches', never more (a
        # marker weighs 1, a take 0, and at most _depth markers beyond the one being
        # delivered are let through). Takes that read only memory, and the markers, run on
        # this thread (no handoff).
        depth = self.read_ahead
        threads = CONCURRENCY.take_threads
        if depth > 1:
            threads = min(
                CONCURRENCY.read_ahead_threads, max(threads, (self._per_batch - 1) * depth)
            )
        ahead = ordered_map(self._run, stream(), threads=threads,
                            ahead=(depth + 1) * self._per_batch + 1, weight=_is_end,
                            budget=lambda: self._depth, inline=_inline)  # fmt: skip
        taken: list[Taken] = []
        video: Prepared | None = None
        # a video batch's decode is started before the one before it is waited for and
        # handed out: the decode threads go on from one batch to the next without a gap
        last: tuple[S, Any] | None = None
        try:
            for r in ahead:
                if isinstance(r, _Planned):
                    s = r.samples
                    self._adapt(taken, video)
                    finish, started = self._start(s.component, s.moment, taken, video)
                    taken, video = [], None
                    if last is not None:
                        yield last[0], last[1]()
                        last = None
                    if started:
                        last = (s, finish)
                    else:
                        yield s, finish()
                elif isinstance(r, Prepared):
                    video = r
                else:
                    taken.append(r)
            if last is not None:
                batch, last = last, None
                yield batch[0], batch[1]()
        except GeneratorExit:  # maybe a finalizer, on any thread: the reaper waits
            if last is not None:
                reaper.reap(_quietly, last[1])
            raise
        except BaseException:  # stopped by a failure: its decode ends before its buffers go
            if last is not None:
                _quietly(last[1])
            raise

    def hold_ahead(self, batches: int | None) -> None:
        """Read at most ``batches`` ahead (None: ``read_ahead``, as _adapt allows it)."""
        self._hold = min(self.read_ahead, max(1, batches or self.read_ahead))
        self._depth = min(self._depth, self._hold)

    def _adapt(self, taken: list[Taken], video: Prepared | None) -> None:
        """Batches ahead: ``read_ahead`` (or :meth:`hold_ahead`'s), fewer while that many
        of this one's size would hold more than ``CONCURRENCY.read_ahead_bytes``."""
        if self.read_ahead == 1:
            return
        nbytes = sum(getattr(a, "nbytes", 0) for t in taken for a in t.arrays)
        nbytes += video.nbytes if video is not None else 0
        self._depth = max(1, min(self._hold, CONCURRENCY.read_ahead_bytes // max(1, nbytes)))

    def takes(self, component: np.ndarray, moment: np.ndarray) -> list[Take]:
        """Stage 1: the row takes of these samples, per component in order."""
        return _takes.component_takes(self.tables, self._groups, component, moment)

    def prepare(self, component: np.ndarray, moment: np.ndarray) -> Prepared:
        """Stage 2a: the batch's video requests (stream indexes looked up) and, when the
        video reader can, the windows' bytes fetched. No frame buffer is taken here."""
        columns: list[tuple[ColumnSpec, np.ndarray, int, np.ndarray | None]] = []
        requests: list[Any] = []
        images: list[Any] = []
        for c in np.unique(component):
            slots = np.flatnonzero(component == c)
            table, m = self.tables[int(c)], moment[slots]
            for cs in self.columns[int(c)]:
                if cs.image is not None and not cs.absent:
                    images.append((cs, slots, *self._images.windows(table, cs, m)))
                elif cs.video and not cs.absent:
                    reqs, pad = window_requests(table, cs, m, self._streams)
                    columns.append((cs, slots, len(reqs), pad))
                    requests += reqs
        fetched = None
        if self._video.fetches_ahead and requests:
            fetched = cast("FetchingVideoReader", self._video).fetch(requests)
        return Prepared(columns, requests, fetched, images)

    def assemble(
        self,
        component: np.ndarray,
        moment: np.ndarray,
        taken: list[Taken],
        video: Prepared | None = None,
    ) -> dict[str, Any]:
        """Stages 2b and 3: the batch from its finished takes and :meth:`prepare` (run here
        when not given), decoding its video windows into the batch's buffers."""
        return self._start(component, moment, taken, video)[0]()

    def _start(
        self, component: np.ndarray, moment: np.ndarray, taken: list[Taken],
        video: Prepared | None,
    ) -> tuple[Callable[[], dict[str, Any]], bool]:  # fmt: skip
        """:meth:`assemble` with its decode started on the decode threads when the video
        reader can submit: the call that waits for it and ends the batch, and whether the
        decode was started (False: it is done)."""
        if video is None:
            video = self.prepare(component, moment)
        b = len(moment)
        out: dict[str, Any] = {k: np.zeros((b, t), np.bool_) for k, t in self._pads.items()}
        self._flags(component, out, b)
        windows = video.bind(out, b, self._device, self._buffers)
        images = bind_images(video.images, out, b, self._buffers)
        write_taken(taken, out, b)
        absent_zeros(self.columns, component, out, b, self._device)
        wait: Callable[[], Any] = list
        if windows and video.fetched is not None:
            wait = cast("FetchingVideoReader", self._video).submit(windows)
        elif windows:
            self._video.read(windows)
        wait_images = self._images.submit(images) if images else list

        def finish() -> dict[str, Any]:
            wait()
            wait_images()
            squeeze_moment_video(out, self._all)
            self._write_ids(component, moment, out)
            return out

        return finish, wait is not list or wait_images is not list

    def _flags(self, component: np.ndarray, out: dict[str, Any], b: int) -> None:
        """``<column>_dim_mask`` and ``<column>_is_present`` of a batch (``Component(pad_to=)``,
        optional columns): per sample, from its component."""
        component = np.asarray(component, np.int64)
        for key, (size, real) in self._masks.items():
            out[key] = np.arange(size)[None, :] < np.asarray(real, np.int64)[component][:, None]
        for key, present in self._present.items():
            out[key] = np.asarray(present, np.bool_)[component]

    def _run(self, item: Take | _Video | _Planned) -> Taken | Prepared | _Planned:
        if isinstance(item, _Video):
            return self.prepare(item.samples.component, item.samples.moment)
        return item if isinstance(item, _Planned) else run_take(item)

    def _write_ids(self, component: np.ndarray, moment: np.ndarray, out: dict[str, Any]) -> None:
        moment = np.asarray(moment, np.int64)
        if not self.ids:
            out["_moment"] = moment
            return
        component = np.asarray(component, np.int64)
        episode = np.zeros(len(moment), np.int64)
        frame = np.zeros(len(moment), np.int64)
        for c in np.unique(component):
            slots = np.flatnonzero(component == c)
            m = moment[slots]
            starts = self._starts.get(int(c))
            if starts is None:  # a pinned table's episodes never change: look them up once
                starts = self._starts[int(c)] = np.asarray(
                    self.tables[int(c)].episodes().starts, np.int64
                )
            e = np.searchsorted(starts, m, side="right") - 1
            episode[slots], frame[slots] = e, m - starts[e]
        out["_component"] = component
        out["_moment"] = moment
        out["_episode"] = episode
        out["_frame"] = frame


def absent_zeros(
    columns: list[list[ColumnSpec]], component: np.ndarray, out: dict[str, Any], b: int,
    device: Any = None,
) -> None:  # fmt: skip
    """Zeros at the slots of the samples whose table lacks an optional column (buffers are
    reused, so every such slot is written; a column no sample has is allocated here)."""
    for c in np.unique(component):
        slots = np.flatnonzero(component == c)
        for cs in columns[int(c)]:
            if not cs.absent:
                continue
            dest = out.get(cs.name)
            if dest is None and cs.video:
                spec = cs.spec
                h, w = spec.size
                dest = spec.frame.allocate(len(spec.offsets), h, w, batch=b, device=device)
            elif dest is None:
                shape, dtype = cs.zeros
                dest = np.empty((b, *shape), dtype)
            out[cs.name] = dest
            if isinstance(dest, np.ndarray):
                dest[slots] = 0
            else:  # a device tensor (NVDEC output)
                import torch

                dest[torch.as_tensor(slots, device=dest.device)] = 0


def _is_end(item: Take | _Video | _Planned) -> int:
    return int(isinstance(item, _Planned))


def _inline(item: Take | _Video | _Planned) -> bool:
    return isinstance(item, _Planned) or (isinstance(item, Take) and cheap(item))


def _quietly(finish: Callable[[], Any]) -> None:
    """Wait for a batch nobody will take (its decode ends before its buffers go)."""
    with contextlib.suppress(Exception):
        finish()

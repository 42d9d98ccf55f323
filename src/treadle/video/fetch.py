"""Fetch and verify: the stage both video readers (CPU and GPU) start from.

A batch of :class:`WindowRequest` is planned (:func:`~treadle.video.window_plan.plan_window`),
its byte ranges are read with one coalesced ``get_ranges``, and each window comes out as
a :class:`FetchedWindow`: its request, plan and bytes. :meth:`FetchedWindow.verify`
checks the bytes' length and every packet's crc32 against the index; the readers call it
on their decode threads (``zlib.crc32`` releases the GIL), before any byte is decoded.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import CorruptData, NotFound, StorageError, VideoError
from treadle.storage import RangeRequest, Store
from treadle.storage.store_errors import ChangedObject, ShortObject
from treadle.video.frame_spec import FrameSpec
from treadle.video.stream import StreamIndex
from treadle.video.window_plan import WindowPlan, plan_window

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore, ObjectChunks


def where_text(where: tuple[str, str, str] | str | None) -> str:
    """A window's name in errors: ``table 't' episode 'e' column 'c'``."""
    if where is None:
        return "video"
    if isinstance(where, str):
        return where
    table, episode, column = where
    return f"table {table!r} episode {episode!r} column {column!r}"


@dataclass(frozen=True, eq=False)
class WindowRequest:
    """One window: display ``frames`` (output order) of the stream at ``key``.

    ``key`` is the stream object's key relative to the reader's ``prefix`` (for a table
    column, the ``stream`` field, e.g. ``media/<table>/<sha>.h264``, with
    ``prefix="projects/<project>"``). ``index`` is the episode's whole index
    (:func:`treadle.video.column_layout.index_from_arrow`). ``spec`` is a ``td.Video`` or a
    :class:`~treadle.video.frame_spec.FrameSpec`. ``where`` = (table, episode, column) names
    the window in errors. ``out``, when given, is filled in place (of the spec's shape
    and dtype, e.g. a slice of the batch buffer).
    """

    key: str
    index: StreamIndex
    frames: np.ndarray | Sequence[int]
    spec: Any
    where: tuple[str, str, str] | str | None = None
    out: Any = None

    @classmethod
    def at(
        cls,
        key: str,
        index: StreamIndex,
        start: int,
        spec: Any,
        where: tuple[str, str, str] | str | None = None,
        out: Any = None,
    ) -> WindowRequest:
        """The window of ``spec`` (a ``td.Video``) at episode frame ``start``: frames
        ``start + spec.offsets``."""
        frames = int(start) + np.asarray(spec.offsets, dtype=np.int64)
        return cls(key, index, frames, spec, where, out)


@dataclass(frozen=True, eq=False)
class FetchedWindow:
    """A window's request, plan and fetched bytes (``data`` is ``plan``'s byte range)."""

    request: WindowRequest
    plan: WindowPlan
    data: bytes = field(repr=False)
    where: str = field(init=False)  # the window's name in errors (where_text)
    frame: FrameSpec = field(init=False)  # the request's spec's FrameSpec

    def __post_init__(self) -> None:
        object.__setattr__(self, "where", where_text(self.request.where))
        object.__setattr__(self, "frame", FrameSpec.of(self.request.spec))

    @property
    def index(self) -> StreamIndex:
        return self.request.index

    def allocate(self, device: Any = None) -> Any:
        """A fresh output for this window (:meth:`FrameSpec.allocate`; ``device=None``:
        host memory)."""
        idx = self.index
        return self.frame.allocate(len(self.plan.wanted), idx.height, idx.width, device=device)

    def output(self, device: Any = None) -> Any:
        """The request's ``out``, checked (:meth:`FrameSpec.check`: the one shape check of
        a window), or a fresh output; ``device`` as for :meth:`allocate`."""
        out = self.request.out
        if out is None:
            return self.allocate(device)
        idx = self.index
        self.frame.check(out, len(self.plan.wanted), idx.height, idx.width, self.where, device)
        return out

    def verify(self) -> None:
        """Check the bytes' length and every packet's crc32 against the index."""
        data, plan, index, where = self.data, self.plan, self.index, self.where
        if len(data) != plan.nbytes:
            cut = np.flatnonzero(plan.rel_offset + plan.size > len(data))
            frame = int(plan.frames[cut[0]]) if len(cut) else int(plan.frames[-1])
            raise CorruptData(
                f"{where} frame {frame}: stream is truncated (read {len(data)} bytes of the "
                f"{plan.nbytes} the window needs)"
            )
        if index.crc is None:
            return
        view = memoryview(data)
        crc = index.crc
        for i, o, s in zip(plan.frames.tolist(), plan.rel_offset.tolist(), plan.size.tolist()):
            if zlib.crc32(view[o : o + s]) != int(crc[i]):
                raise CorruptData(
                    f"{where} frame {i} (of {len(index)}): packet checksum mismatch "
                    "(stored video bytes are corrupt)"
                )


class WindowFetcher:
    """Plans and fetches batches of windows from a :class:`~treadle.storage.Store`.

    ``chunks``: a chunk store (a loader's ``lookahead`` fetches the windows' stream chunks
    into it, :mod:`treadle.read.chunk_media`): a window whose bytes are all in present
    chunks is read from them, the others with range requests as without it."""

    def __init__(self, store: Store, prefix: str = "", chunks: ChunkStore | None = None):
        self.store = store
        self.prefix = prefix.strip("/")
        self.chunks = chunks

    def object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def media_object(self, key: str, index: StreamIndex) -> ObjectChunks:
        """The chunks of the stream at ``key`` (needs :attr:`chunks`): an object of the
        index's extent (the stream is content-addressed: one key, one extent)."""
        if self.chunks is None:
            raise ValueError("this WindowFetcher reads no chunks (chunks=None)")
        return self.chunks.object(self.store, self.object_key(key), index.extent, media=True)

    def fetch(self, requests: Sequence[WindowRequest]) -> list[FetchedWindow]:
        """Plan every window, then read all their byte ranges in one ``get_ranges``
        (those not in present chunks of :attr:`chunks`).

        Errors name the window: :class:`VideoError` (frames outside the episode),
        :class:`~treadle.errors.NotFound` / :class:`~treadle.errors.StorageError`.
        """
        plans = []
        for r in requests:
            try:
                plans.append(plan_window(r.index, r.frames))
            except VideoError as e:
                raise VideoError(f"{where_text(r.where)}: {e}") from None
        if not requests:
            return []
        datas: list[bytes | None] = [self._from_chunks(r, p) for r, p in zip(requests, plans)]
        todo = [i for i, d in enumerate(datas) if d is None]
        if self.chunks is not None:
            self.chunks.stats.windows_read += len(datas) - len(todo)
            self.chunks.stats.windows_fetched += len(todo)
        if todo:
            got = self._get([requests[i] for i in todo], [plans[i] for i in todo])
            for i, d in zip(todo, got):
                datas[i] = d
        return [FetchedWindow(r, p, d) for r, p, d in zip(requests, plans, datas)]  # type: ignore[arg-type]

    def _from_chunks(self, r: WindowRequest, p: WindowPlan) -> bytes | None:
        """The window's bytes from present chunks, or None (no chunk store, a stream the
        store has no files of, a chunk not present, or files not usable: then a range
        request reads them)."""
        if self.chunks is None or p.end > r.index.extent:
            return None
        try:
            key = self.object_key(r.key)
            obj = self.chunks.existing(self.store, key, r.index.extent, media=True)
            return None if obj is None else self.chunks.read(obj, p.start, p.end)
        except OSError:
            return None

    def _get(self, requests: Sequence[WindowRequest], plans: Sequence[WindowPlan]) -> list[Any]:
        """The windows' byte ranges in one ``get_ranges``; errors name the window."""
        ranges = [
            RangeRequest(self.object_key(r.key), p.start, p.end) for r, p in zip(requests, plans)
        ]
        try:
            return self.store.get_ranges(ranges)
        except ShortObject as e:
            raise _truncated(requests, plans, e, self.object_key) from None
        except ChangedObject as e:  # replaced since this store first read it: named too
            where = self._where(requests, lambda key, changed=e.key: key == changed)
            raise ChangedObject(f"{where}: {e}", e.key, e.first, e.now) from None
        except (NotFound, StorageError) as e:
            msg = str(e)
            raise type(e)(f"{self._where(requests, lambda key: key in msg)}: {msg}") from None

    def _where(self, requests: Sequence[WindowRequest], named: Callable[[str], bool]) -> str:
        """The window of the first request whose object key ``named`` says an error is
        about (else the first window)."""
        hit = next((r for r in requests if named(self.object_key(r.key))), requests[0])
        return where_text(hit.where)


def chunked_fetcher(video_reader: Any, chunks: ChunkStore | None) -> WindowFetcher | None:
    """Point ``video_reader``'s fetcher at ``chunks`` (windows read from present chunks);
    the fetcher, or None where there is nothing to do (no chunk store, a local store, a
    reader with no :class:`WindowFetcher`)."""
    fetcher = getattr(video_reader, "fetcher", None)
    if chunks is None or not isinstance(fetcher, WindowFetcher) or fetcher.store.is_local:
        return None
    fetcher.chunks = chunks
    return fetcher


def _truncated(
    requests: Sequence[WindowRequest], plans: Sequence[WindowPlan], e: ShortObject, key_of: Any
) -> CorruptData:
    """The first window frame whose bytes lie past the end of the cut-short object."""
    for r, p in zip(requests, plans):
        if key_of(r.key) != e.key:
            continue
        cut = np.flatnonzero(p.start + p.rel_offset + p.size > e.size)
        if len(cut):
            frame = int(p.frames[cut[0]])
            return CorruptData(f"{where_text(r.where)} frame {frame}: stream is truncated: {e}")
    return CorruptData(f"{where_text(requests[0].where)}: {e}")


@dataclass
class ReadStats:
    """Costs of one ``read_with_stats`` call of a video reader."""

    windows: int = 0
    bytes_read: int = 0
    packets_decoded: int = 0
    frames_out: int = 0
    fetch_s: float = 0.0
    decode_s: float = 0.0
    window_bytes: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, windows: Sequence[FetchedWindow], fetch_s: float, decode_s: float) -> ReadStats:
        """The stats of a batch of fetched (and decoded) windows."""
        plans = [w.plan for w in windows]
        sizes = [p.nbytes for p in plans]
        return cls(
            windows=len(windows),
            bytes_read=sum(sizes),
            packets_decoded=sum(p.num_packets for p in plans),
            frames_out=sum(len(p.wanted) for p in plans),
            fetch_s=fetch_s,
            decode_s=decode_s,
            window_bytes=sizes,
        )

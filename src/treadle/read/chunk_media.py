"""Video windows' stream bytes in the chunk store (:mod:`treadle.storage.chunkstore`).

A video window reads one byte range of its episode's stream: from the keyframe its first
frame needs to its last packet (:func:`treadle.video.window_plan.plan_window`). Which range
is a function of the plan and the pinned table's stream index only, so a loader's
``lookahead`` (:mod:`treadle.read.lookahead`) computes the ranges of the steps ahead with
the reader's own :func:`~treadle.read.video_requests.window_requests`, and has the chunks
they touch fetched with the rows' chunks (one round of coalesced range requests, evicted
by next use together). The reader's :class:`~treadle.video.fetch.WindowFetcher` then reads a
window from present chunks, and fetches the others with a range request, as without it.
Each stream is one object of the chunk store (its chunks: ``chunk_bytes`` of it), so with
``td.BlockShuffle`` an episode's stream is fetched once for all the samples its block
draws while its chunks stay cached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import VideoError
from treadle.read.video_requests import window_requests
from treadle.video.window_plan import plan_window

if TYPE_CHECKING:
    from treadle.read.sample_reader import SampleReader
    from treadle.read.step_chunks import StepTakes
    from treadle.storage.chunkstore import ObjectChunks
    from treadle.video.stream import StreamIndex

__all__ = ["media_chunks", "window_chunks"]


def window_chunks(reader: SampleReader | StepTakes, component: np.ndarray, moment: np.ndarray,
                  chunk_bytes: int) -> list[tuple[str, StreamIndex, np.ndarray, int]]:  # fmt: skip
    """Per video window the reader reads for these samples: ``(stream key, its index, the
    chunks of ``chunk_bytes`` its byte range touches, the range's bytes)``. A window the
    reader will refuse (frames outside its episode) asks for nothing: its read raises, as
    without ``lookahead``. ``treadle simulate`` counts the same chunks
    (:func:`treadle.read.simpages.media_windows`)."""
    out = []
    for c in np.unique(component):
        slots = np.flatnonzero(component == c)
        table, m = reader.tables[int(c)], moment[slots]
        for cs in reader.columns[int(c)]:
            if not cs.video or cs.absent or cs.image is not None:
                continue
            reqs, _ = window_requests(table, cs, m, reader.streams)
            for r in reqs:
                try:
                    p = plan_window(r.index, r.frames)
                except VideoError:
                    continue
                ids = np.arange(p.start // chunk_bytes, max(p.start, p.end - 1) // chunk_bytes + 1)
                out.append((r.key, r.index, ids, p.end - p.start))
    return out


def media_chunks(reader: SampleReader | StepTakes, component: np.ndarray, moment: np.ndarray
                 ) -> list[tuple[Any, ObjectChunks, np.ndarray]]:  # fmt: skip
    """``(store, stream object, chunk ids)`` of the video windows the reader reads for these
    samples (:func:`window_chunks`; none when the reader reads no window from chunks:
    ``reader.media`` is None). ``reader``: a loader's reader, or with ``workers=N`` the
    loader's :class:`~treadle.read.step_chunks.StepTakes` (its workers' readers read the
    windows)."""
    fetcher = getattr(reader, "media", None)
    if fetcher is None or fetcher.chunks is None:
        return []
    by_obj: dict[str, tuple[ObjectChunks, list[np.ndarray]]] = {}
    for key, index, ids, _ in window_chunks(reader, component, moment, fetcher.chunks.chunk_bytes):
        obj = fetcher.media_object(key, index)
        by_obj.setdefault(obj.name, (obj, []))[1].append(ids)
    return [(fetcher.store, o, np.unique(np.concatenate(v))) for o, v in by_obj.values()]

"""The stream index of an episode's video column, looked up once per reader.

:class:`StreamIndexes` caches, per (table, version, column, episode), the stream's key and
its :class:`~treadle.video.layout.StreamIndex` (built from the column's rows); the
column's Arrow rows are read once per table version. Used from the one thread that builds
a batch's video requests (a reader is driven from one thread), so it needs no lock.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


class StreamIndexes:
    """``lookup(table, column, episode) -> (stream key, StreamIndex)``, cached."""

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, int, str, int], Any] = {}
        self._video_cols: dict[tuple[str, int, str], pa.ChunkedArray] = {}

    def lookup(self, table: Any, column: str, episode: int) -> tuple[str, Any]:
        """The stream key and index of ``column`` in episode number ``episode`` of ``table``."""
        from treadle.video import index_from_arrow

        k = (table.name, table.version, column, episode)
        hit = self._indexes.get(k)
        if hit is not None:
            return hit
        col = self._video_cols.get(k[:3])
        if col is None:
            col = table.to_arrow([column]).column(column)
            self._video_cols[k[:3]] = col
        eps = table.episodes()
        start, n = int(eps.starts[episode]), int(eps.lengths[episode])
        hit = index_from_arrow(col.slice(start, n))
        self._indexes[k] = hit
        return hit

"""What a process asked of the chunk store (:mod:`treadle.storage.chunkstore`): its counters."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ChunkStats"]


@dataclass
class ChunkStats:
    """What this process asked of the store: chunk hits and misses, bytes and GETs fetched."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0  # as the store sent them: obstore's merged ranges, gaps included
    requests: int = 0  # HTTP requests: obstore's merged ranges
    bypassed: int = 0  # chunks not kept (no room for them: not fetched)
    rows_read: int = 0  # rows readers read from present chunks
    rows_taken: int = 0  # rows readers took another way (their chunks were not present)
    # of hits .. requests, what video streams took (ObjectChunks.media)
    media_hits: int = 0
    media_misses: int = 0
    media_fetched_bytes: int = 0
    media_requests: int = 0
    windows_read: int = 0  # video windows readers read from present chunks
    windows_fetched: int = 0  # video windows readers fetched with a range request

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 1.0

    def since(self, before: ChunkStats) -> ChunkStats:
        """What was counted after ``before`` (a copy taken earlier)."""
        return ChunkStats(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))

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

    def report(self, samples: int, seen: int) -> dict[str, float | None]:
        """A lookahead's report (:meth:`treadle.read.lookahead.Lookahead.report`) of these
        counts over ``samples`` read (``seen``: the samples, for the record)."""
        rows, asked = self.rows_read + self.rows_taken, self.hits + self.misses
        # None, not 1.0 or 0.0, where nothing was asked of the chunk cache (all cached whole)
        out = {"samples": seen, "chunks": asked,
               "hit_rate": round(self.hit_rate, 4) if asked else None,
               "rows_from_chunks": round(self.rows_read / rows, 4) if rows else None,
               "bytes_per_sample": round(self.fetched_bytes / samples, 1),
               "requests_per_sample": round(self.requests / samples, 4)}  # fmt: skip
        return out | self.media_report(samples) if self.media_hits + self.media_misses else out

    def media_report(self, samples: int) -> dict[str, float]:
        """The video streams' share of a lookahead's report (``samples`` read): their
        chunks' hit rate, bytes and requests per sample, and the windows read from chunks
        (the others were fetched with range requests, which these counts leave out)."""
        asked = max(1, self.media_hits + self.media_misses)
        windows = max(1, self.windows_read + self.windows_fetched)
        return {"media_hit_rate": round(self.media_hits / asked, 4),
                "windows_from_chunks": round(self.windows_read / windows, 4),
                "media_bytes_per_sample": round(self.media_fetched_bytes / samples, 1),
                "media_requests_per_sample": round(self.media_requests / samples, 4)}  # fmt: skip

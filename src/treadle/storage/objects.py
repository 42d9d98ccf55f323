"""What a store says of its objects, and what a ranged read asks of them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ObjectInfo:
    """Size and last-modified time (UTC, the store's clock) of one object, and its ETag
    where the store says (a listing does not)."""

    size: int
    modified: datetime
    etag: str | None = None


@dataclass(frozen=True)
class RangeRequest:
    """Bytes ``[start, end)`` of object ``key``; ``etag``: of that version of it (a read
    of another is :class:`~treadle.storage.store_errors.ChangedObject`), None: of the one
    the store's first read of ``key`` saw (:mod:`treadle.storage.ranged`)."""

    key: str
    start: int
    end: int
    etag: str | None = None

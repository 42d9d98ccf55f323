"""What a store says of its objects, and what a ranged read asks of them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ObjectInfo:
    """Size and last-modified time (UTC, the store's clock) of one object."""

    size: int
    modified: datetime


@dataclass(frozen=True)
class RangeRequest:
    """Bytes ``[start, end)`` of object ``key``."""

    key: str
    start: int
    end: int

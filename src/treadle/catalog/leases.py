"""What a running writer tells gc: "I started at S and am still alive", and "I reused X".

A writer stages objects (Lance data files, media streams) that no commit references
until it commits; gc must not take them. Two kinds of marker, both empty objects whose
only content is their mtime (the store's clock, the same clock as every other object's):

- **Lease** (``<project>/gc/writers/<id>/start`` and ``.../beat``): written before a
  transaction's first staged object and refreshed (``beat``) while it writes and just
  before it commits; deleted when it ends. gc treats a lease as live while its newest
  marker is younger than the grace, and then keeps every unreferenced object at least
  as new as the oldest live lease's ``start``: a transaction that runs longer than the
  grace loses nothing.
- **Used** (``<project>/gc/used/<object key>``): written when put-if-absent finds a
  content-addressed object already there (an orphan of a crashed writer, say), so the
  object's age counts from this reuse, not from its first write. gc deletes it with
  its object, or once it is stale and its object is referenced.

Markers are plain objects written with ``put``: they work the same on local disk and
every object store, and cost one small request each.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from treadle.storage import ObjectInfo, Store

WRITERS = "gc/writers"
USED = "gc/used"
_BEAT_S = 30.0


def used_key(prefix: str, key: str) -> str:
    """The "last used" marker of object ``key`` (a full key under ``prefix``)."""
    return f"{prefix}/{USED}/{key[len(prefix) + 1 :]}"


def mark_used(store: Store, prefix: str, key: str) -> None:
    """Record that ``key`` is in use from now on (its age restarts for gc)."""
    store.put(used_key(prefix, key), b"")


class Lease:
    """One transaction's lease; call :meth:`beat` before every staged write."""

    def __init__(self, store: Store, prefix: str):
        self.store = store
        self.base = f"{prefix}/{WRITERS}/{uuid.uuid4().hex}"
        self._last: float | None = None
        self._beaten = False

    def beat(self) -> None:
        """Take the lease (first call) or refresh it (at most every 30 s: one small put)."""
        now = time.monotonic()
        if self._last is None:
            self.store.put(f"{self.base}/start", b"")
        elif now - self._last >= _BEAT_S:
            self.store.put(f"{self.base}/beat", b"")
            self._beaten = True
        else:
            return
        self._last = now

    def release(self) -> None:
        """Drop the lease (the transaction committed or gave up)."""
        if self._beaten:
            self.store.delete(f"{self.base}/beat")
        if self._last is not None:
            self.store.delete(f"{self.base}/start")
        self._last, self._beaten = None, False


def live_since(leases: dict[str, ObjectInfo], alive_after: datetime) -> datetime | None:
    """The ``start`` of the oldest lease whose newest marker is after ``alive_after``.

    ``leases`` is the listing of ``<project>/gc/writers``.
    """
    by_id: dict[str, dict[str, datetime]] = {}
    for key, info in leases.items():
        lease, _, kind = key.rpartition("/")
        by_id.setdefault(lease, {})[kind] = info.modified
    starts = [
        marks["start"]
        for marks in by_id.values()
        if "start" in marks and max(marks.values()) >= alive_after
    ]
    return min(starts) if starts else None


def stale(leases: dict[str, ObjectInfo], alive_after: datetime) -> list[str]:
    """Marker keys of leases no longer alive (a writer that died without releasing)."""
    newest: dict[str, datetime] = {}
    for key, info in leases.items():
        lease = key.rpartition("/")[0]
        newest[lease] = max(newest.get(lease, info.modified), info.modified)
    return sorted(k for k in leases if newest[k.rpartition("/")[0]] < alive_after)

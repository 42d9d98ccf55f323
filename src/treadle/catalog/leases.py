"""What a running writer tells gc: "I started at S and am still alive", and "I reused X".

A writer stages objects (Lance data files, media streams) that no commit references
until it commits; gc must not take them, whatever its grace. Three kinds of marker,
all empty objects whose only content is their mtime (the store's clock, the same clock
as every other object's):

- **Lease** (``<project>/gc/writers/<id>/start`` and ``.../beat``): written before a
  transaction's first staged object, refreshed (``beat``) every 30 s by a background
  thread while the transaction is open, deleted when it ends. gc treats a lease as live
  while its newest marker is younger than the grace or than :data:`LEASE_TTL` (five
  minutes), whichever is longer, so a zero grace still honours every running writer,
  and it keeps every unreferenced object at least as new as the oldest live lease's
  ``start``: both times are the store's, so no clock is compared with another.
- **Used** (``<project>/gc/used/<object key>``): written when put-if-absent finds a
  content-addressed object already there (an orphan of a crashed writer, say), so the
  object's age counts from this reuse, not from its first write. gc deletes it with
  its object, or once it is stale and its object is referenced.
- **Sweep** (``<project>/gc/sweeps/<id>/start``): gc's own lease, held while it deletes.
  A writer that reused an object writes its "used" marker, then looks for a sweep;
  gc writes its sweep, then reads "used" markers. Of the two, one sees the other: gc
  keeps the object, or the writer stores its bytes again under a key of its own.

Markers are plain objects written with ``put``: they work the same on local disk and
every object store, and cost one small request each.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from contextlib import suppress
from datetime import UTC, datetime, timedelta

from treadle import layout
from treadle.errors import TreadleError
from treadle.storage import ObjectInfo, Store

WRITERS = layout.GC_WRITERS
USED = layout.GC_USED
SWEEPS = layout.GC_SWEEPS
_BEAT_S = 30.0
_log = logging.getLogger("treadle")
LEASE_TTL = timedelta(minutes=5)  # a lease whose newest marker is older is a dead writer's


def used_key(prefix: str, key: str) -> str:
    """The "last used" marker of object ``key`` (a full key under ``prefix``)."""
    return layout.under(layout.folder(prefix, USED), key[len(prefix) + 1 :])


def mark_used(store: Store, prefix: str, key: str) -> None:
    """Record that ``key`` is in use from now on (its age restarts for gc)."""
    store.put(used_key(prefix, key), b"")


class Lease:
    """One transaction's lease (or, under :data:`SWEEPS`, one gc's sweep).

    The first :meth:`beat` takes it; from then on a background thread refreshes it every
    30 s until :meth:`release`, so it stays live while its process does, whatever the
    writer is doing (encoding, user code) between staged writes.
    """

    def __init__(self, store: Store, prefix: str, kind: str = WRITERS):
        self.store = store
        self.id = uuid.uuid4().hex
        self.base = f"{layout.folder(prefix, kind)}/{self.id}"
        self._last: float | None = None
        self._beaten = False
        self._lock = threading.Lock()

    def beat(self) -> None:
        """Take the lease (first call) or refresh it (at most every 30 s: one small put)."""
        self._beat(take=True)

    def _beat(self, take: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if self._last is None:
                if not take:  # released meanwhile: the background beat takes nothing
                    return
                self.store.put(f"{self.base}/start", b"")
                _BEATER.hold(self)
            elif now - self._last >= _BEAT_S:
                self.store.put(f"{self.base}/beat", b"")
                self._beaten = True
            else:
                return
            self._last = now

    @property
    def held(self) -> bool:
        return self._last is not None

    def release(self) -> None:
        """Drop the lease (the transaction committed or gave up).

        Never raises: what it guarded is done (a commit landed, or failed with its own
        error), and a lease that cannot be deleted (a store refusing or failing the
        DELETE) expires by itself after :data:`LEASE_TTL`, as a crashed writer's does.
        An error here would tell the user a landed commit failed, and a retry append twice.
        """
        with self._lock:
            _BEATER.drop(self)
            beaten, held = self._beaten, self._last is not None
            self._last, self._beaten = None, False
            try:
                if beaten:
                    self.store.delete(f"{self.base}/beat")
                if held:
                    self.store.delete(f"{self.base}/start")
            except TreadleError as e:
                _log.warning(
                    "could not drop the gc lease %s (it expires by itself in %s): %s",
                    self.base, LEASE_TTL, e,
                )  # fmt: skip

    def _refresh(self) -> None:
        """The background beat (a held lease only)."""
        with suppress(Exception):  # a failed beat is retried; a dead store fails the write
            self._beat(take=False)


class Borrowed:
    """Another process's lease, staged under (a Ray task of an import, under its driver's).

    It takes no lease of its own, so a writer killed mid-write (a force-cancelled task)
    leaves no live lease behind to keep its orphans from gc for :data:`LEASE_TTL`. Before
    each write, :meth:`beat` checks that the holder's lease is still there, and raises
    :class:`~treadle.errors.TreadleError` once it is gone (the holder ended: a failed,
    cancelled or interrupted import writes nothing more). :meth:`release` does nothing:
    the holder releases its own lease.
    """

    def __init__(self, store: Store, base: str):
        self.store = store
        self.base = base  # the holder's lease: <project>/gc/writers/<id>
        self.id = uuid.uuid4().hex  # this writer's own id (a media copy's key suffix)

    def beat(self) -> None:
        """Raise unless the holder's lease is still held (one small request)."""
        if self.store.missing([f"{self.base}/start"]):
            raise TreadleError(
                f"the gc lease {self.base.rpartition('/')[2]} this writer stages under is "
                "gone (the import it works for ended: failed, cancelled or interrupted); "
                "nothing more is written"
            )

    @property
    def held(self) -> bool:
        return True

    def release(self) -> None:
        """Nothing: the holder releases its lease."""


class _Beater:
    """One daemon thread per process that beats every held lease."""

    def __init__(self) -> None:
        self._held: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: tuple[int, threading.Thread] | None = None  # (pid, thread)

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held.add(lease)
            if self._thread is None or self._thread[0] != os.getpid():  # none, or forked
                t = threading.Thread(target=self._run, name="treadle-lease", daemon=True)
                self._thread = (os.getpid(), t)
                t.start()

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.discard(lease)

    def _run(self) -> None:
        while True:
            time.sleep(max(_BEAT_S / 2, 0.5))
            with self._lock:
                held = list(self._held)
                if not held:
                    self._thread = None
                    return
            for lease in held:
                lease._refresh()


_BEATER = _Beater()


def alive_after(now: datetime, grace: timedelta) -> datetime:
    """Leases whose newest marker is at or after this are live (grace or TTL, the longer)."""
    return now - max(grace, LEASE_TTL)


def sweeping(store: Store, prefix: str) -> bool:
    """Whether some gc is deleting in project ``prefix`` now (a live sweep marker)."""
    since = alive_after(datetime.now(UTC), timedelta(0))
    return any(i.modified >= since for i in store.list_info(layout.folder(prefix, SWEEPS)).values())


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

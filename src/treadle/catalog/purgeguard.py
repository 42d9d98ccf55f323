"""A purge and a merge of the same table never overlap.

A merge writes a new Lance version from the versions it read (their fragments, or their
rows written again); a purge replaces the versions it found when it scanned the table.
Overlapping, a merge that read a head before the purge deleted an episode there, and
committed after the purge's scan, kept the episode's rows, unblanked, in a version the
purge never saw; one that committed after the whole purge copied its blanked rows as data.
So each holds a lease (:class:`~treadle.catalog.leases.Lease`, beaten while it runs):

- a **merge** takes ``<project>/running/merges/<id>`` before it reads a head, then reads
  the purges running: one of a table it would change is a :class:`CommitConflict`, and
  nothing is written;
- a **purge** takes ``<project>/running/purges/<table>/<id>`` before it scans the table,
  then waits while a merge holds its lease.

Each writes its own lease before it reads the other's: of two that overlap, the later
one sees the earlier (the merge refuses, or the purge waits for it to end and then scans
what it committed). A lease no longer beaten (its process died) is not waited for nor
refused after :data:`~treadle.catalog.leases.LEASE_TTL`; a dead purge did nothing more,
and the next run of it scans everything again.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta

from treadle import layout
from treadle.catalog.leases import Lease, alive_after
from treadle.catalog.place import ProjectPlace
from treadle.errors import CommitConflict, TreadleError

_POLL_S = 0.5
_WAIT_S = 3600.0  # a purge gives up waiting for merges after this long (nothing written)
_log = logging.getLogger("treadle")
_sleep = time.sleep  # tests pause here to see a purge wait


def merge_lease(place: ProjectPlace) -> Lease:
    """A running merge's lease, taken (release it once the branch moved or it gave up)."""
    lease = Lease(place.store, place.prefix, layout.MERGING)
    lease.beat()
    return lease


def purge_lease(place: ProjectPlace, table: str) -> Lease:
    """A running purge's lease of ``table``, taken (release it once its record is
    written); returns once no merge holds a live lease (:class:`CommitConflict` if some
    still do after an hour, and the lease is released)."""
    lease = Lease(place.store, place.prefix, f"{layout.PURGING}/{table}")
    lease.beat()
    try:
        _wait_for_merges(place, table)
    except BaseException:
        lease.release()
        raise
    return lease


def running_purges(place: ProjectPlace) -> set[str]:
    """The tables a purge holds a live lease of now."""
    base = layout.folder(place.prefix, layout.PURGING)
    return {lease.rpartition("/")[0].rpartition("/")[2] for lease in _live(place, base)}


def refuse_running(purging: set[str], tables: set[str], merging: str) -> None:
    """:class:`CommitConflict` when a merge (``merging``: what it merges into what) would
    change a table of ``purging`` (read after its lease was taken)."""
    hit = sorted(purging & tables)
    if hit:
        raise CommitConflict(
            f"{merging}: a purge of table {hit[0]!r} is running; a merge beside it could "
            "keep the purged rows; merge again once the purge ended; nothing was written "
            "and no branch moved"
        )


def _live(place: ProjectPlace, base: str) -> list[str]:
    """The leases under ``base`` (folders) whose newest marker is live now; the markers of
    dead ones are deleted (a process that died holding one)."""
    since = alive_after(datetime.now(UTC), timedelta(0))
    listed = place.store.list_info(base)
    newest: dict[str, datetime] = {}
    for key, info in listed.items():
        lease = key.rpartition("/")[0]
        newest[lease] = max(newest.get(lease, info.modified), info.modified)
    for key in listed:
        if newest[key.rpartition("/")[0]] < since:
            with suppress(TreadleError):
                place.store.delete(key)
    return sorted(lease for lease, t in newest.items() if t >= since)


def _wait_for_merges(place: ProjectPlace, table: str) -> None:
    base = layout.folder(place.prefix, layout.MERGING)
    deadline = time.monotonic() + _WAIT_S
    told = False
    while _live(place, base):
        if time.monotonic() > deadline:
            raise CommitConflict(
                f"purge of table {table!r} of project {place.name!r}: merges kept running "
                f"for {_WAIT_S:.0f} s (leases under {base}); nothing was written; purge again"
            )
        if not told:
            _log.info("purge of table %r waits for the merges running in %r", table, place.name)
            told = True
        _sleep(_POLL_S)

"""The markers of commits retention expired (``<project>/retention/{pending,expired}/``):
written by gc (:mod:`treadle.catalog.gc`, two phases: see :mod:`treadle.catalog.retention`),
read by every open of a table version (:class:`ExpiredCommit`) and by a pin made while gc
runs (:func:`settle`)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from treadle import layout
from treadle.catalog.place import ProjectPlace
from treadle.errors import ExpiredCommit, NotFound

_SETTLE_S = 300.0  # how long a pending marker is waited for (a gc that died leaves it)


def expired_key(prefix: str, commit_id: str, pending: bool = False) -> str:
    return layout.retention_key(prefix, commit_id, pending)


def settle(place: ProjectPlace, commit_ids: list[str]) -> list[str]:
    """Those of ``commit_ids`` a gc expired, read *after* the caller committed a pin of
    them: every pending marker (each gc deciding writes its own) is waited for until its
    gc makes it final or drops it."""
    store, prefix, out = place.store, place.prefix, []
    for cid in sorted(set(commit_ids)):
        deadline = time.monotonic() + _SETTLE_S
        # pending first: gc writes the final marker before it drops the pending one
        while _pending(place, cid):
            if time.monotonic() > deadline:
                break  # a gc that died while deciding: it deleted nothing of this commit
            time.sleep(0.02)
        if store.exists(expired_key(prefix, cid)):
            out.append(cid)
    return out


def _pending(place: ProjectPlace, cid: str) -> bool:
    """Whether some gc is still deciding whether to expire ``cid``."""
    store, prefix = place.store, place.prefix
    if store.exists(expired_key(prefix, cid, pending=True)):  # an older treadle's gc
        return True
    # a marker older than the wait is a dead gc's: waiting it out again would make every
    # save pinning this commit take _SETTLE_S (no later gc drops another gc's marker)
    since = datetime.now(UTC) - timedelta(seconds=_SETTLE_S)
    infos = store.list_info(layout.pending_folder(prefix, cid)).values()
    return any(i.modified > since for i in infos)


def expired_error(place: ProjectPlace, commit_id: str, table: str | None) -> ExpiredCommit | None:
    """The error for reading ``table`` (None: the commit) at an expired commit, or None if
    it was not expired."""
    try:
        body = json.loads(place.store.get(expired_key(place.prefix, commit_id)))
    except NotFound:
        return None
    except ValueError:
        body = {}
    return ExpiredCommit(expired_message(place, commit_id, table, body))


def expired_message(
    place: ProjectPlace, cid: str, table: str | None, body: dict | None = None
) -> str:
    """What :class:`ExpiredCommit` says of ``table`` (None: the commit) at commit ``cid``
    (``body``: its marker's, naming the rule and the day)."""
    body = body or {}
    what = f"table {table!r} at commit {cid[:8]}" if table else f"commit {cid[:8]}"
    days = body.get("keep_days")
    when = f" on {body['expired_at'][:10]}" if body.get("expired_at") else ""
    rule = f"gc --keep-days {days:g}" if isinstance(days, (int, float)) else "gc --keep-days"
    return (
        f"{what} of project {place.name!r} was expired by retention ({rule}{when}): its "
        "table versions are gone; tag commits (project.tag) to keep them readable"
    )


def mark_expired(
    place: ProjectPlace,
    expired: dict[str, dict[str, int]],
    keep_days: float,
    pending: str | None = None,
) -> None:
    """Write the marker of every commit expired this run, before anything is deleted
    (``pending``: the first phase's, of the gc with that id: two gcs deciding at once
    each hold their own, so one dropping its marker never ends another's wait)."""
    when = datetime.now(UTC).isoformat()
    for cid, tables in sorted(expired.items()):
        body = {"commit": cid, "tables": tables, "keep_days": keep_days, "expired_at": when}
        key = (
            expired_key(place.prefix, cid)
            if pending is None
            else layout.pending_key(place.prefix, cid, pending)
        )
        place.store.put(key, json.dumps(body).encode())


def drop_pending(place: ProjectPlace, commits: dict[str, dict[str, int]], gc_id: str) -> None:
    """Delete gc ``gc_id``'s pending markers of ``commits`` (after their final markers)."""
    for cid in sorted(commits):
        place.store.delete(layout.pending_key(place.prefix, cid, gc_id))

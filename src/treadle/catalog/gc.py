"""Garbage collection: remove table versions and objects no commit reaches.

gc deletes an object only when no commit reaches it, no running writer staged or reused
it, and it is older than the grace (``older_than``, default one hour). That holds at
any grace, zero included, while writers, imports and runs work beside it, on local
disk and every object store, by the order of its steps, not by timing:

1. **Survey, deleting nothing.** Reachable = every commit reachable (through parents)
   from every branch head and tag, less, with a retention (``keep_days``), the old
   commits nothing pins (:mod:`treadle.catalog.retention`). Every table version such a
   commit names is opened from storage, every data file it lists must be there with its
   recorded size, and the media streams its video columns name must exist too. Any
   damage stops gc with :class:`CorruptData` (or :class:`StorageError`) naming the
   table and the file, and nothing has been deleted.
2. **List** what gc may delete (:func:`~treadle.catalog.gcdelete.list_candidates`), and
   put up gc's *sweep* marker (:mod:`treadle.catalog.leases`).
3. **Re-read, after listing:** the writers' leases (a lease is live for the grace or five
   minutes, whichever is longer; the cutoff moves back to the oldest live lease's start,
   so nothing a running writer staged goes), then the heads, tags and checkpoint pins
   (every commit that landed since step 1 is surveyed too, and keeps what it names).
   Commits retention expires get a *pending* marker, the pins are read once more, and
   only then are the markers made final (reading such a commit raises ExpiredCommit): a
   checkpoint saved meanwhile keeps its run's commit, or learns that it came too late
   (:func:`treadle.catalog.expiry.settle`).
4. **Delete** listed objects only (:mod:`treadle.catalog.gcdelete`): table versions no
   re-read commit names whose manifest is older than the cutoff, the files only they used,
   data files no version lists, tables no commit names, media no reachable row names
   (each one's "used" marker read again just before it goes), stored episode indexes of
   data files no kept version lists, and the leases of dead writers.

Lance's own ``delete_unverified=True`` is never used, nor its age-based cleanup: gc tells
Lance exactly which versions to remove.
"""

from __future__ import annotations

import functools
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from treadle import layout
from treadle.catalog.expiry import drop_pending, mark_expired
from treadle.catalog.gcdelete import (
    Listed,
    Removed,
    collect_episode_indexes,
    collect_media,
    collect_table,
    collect_unreachable_tables,
    list_candidates,
)
from treadle.catalog.leases import SWEEPS, WRITERS, Lease, alive_after, live_since, stale
from treadle.catalog.retention import plan_retention
from treadle.errors import CorruptData, CredentialsError, NotFound, TreadleError
from treadle.storage import ObjectInfo
from treadle.table.tensors import is_video

if TYPE_CHECKING:
    import lance

    from treadle.catalog.history import History


@dataclass
class GcReport:
    """What :func:`collect_garbage` kept and removed."""

    kept_versions: dict[str, list[int]] = field(default_factory=dict)
    removed_versions: int = 0
    removed_bytes: int = 0
    removed_media: list[str] = field(default_factory=list)
    removed_tables: list[str] = field(default_factory=list)
    removed_files: int = 0  # data files no version listed (dead writers' staged rows)
    removed_episode_indexes: int = 0  # stored episode indexes of such files
    expired_commits: list[str] = field(default_factory=list)  # by retention, this run


@dataclass
class _Survey:
    """One reachable table, as read (and checked) before gc deletes anything."""

    name: str
    versions: set[int]
    media: set[str]
    files: set[str]  # keys of the data files the reachable versions list


def _at(point: str) -> None:
    """A seam: nothing happens here. Tests replace it to act at ``point`` of a gc run:
    ``"listed"`` (candidates listed, nothing re-read yet), ``"pending"`` (expired commits
    marked pending, pins not read again yet) or ``"decided"`` (pins read again, markers
    not final yet)."""


def collect_garbage(
    history: History,
    older_than: timedelta = timedelta(hours=1),
    *,
    keep_days: float | None = None,
    now: datetime | None = None,
) -> GcReport:
    """Remove what no commit of a project reaches and is older than ``older_than``
    (``history``: the project, a :class:`~treadle.catalog.client.Project`).

    With ``keep_days``, the table versions of commits older than that which no branch
    head, tag or checkpoint run record pins are expired too (see
    :mod:`treadle.catalog.retention`); without it every reachable commit stays readable.
    Any ``older_than`` (zero included) is safe beside running writers.

    ``now`` is gc's clock (default: the real one; tests move it to age objects on
    stores that cannot back-date them). Raises :class:`CorruptData` naming the table
    and file, having deleted nothing, when a reachable version cannot be fully read.
    """
    store, prefix = history.place.store, history.place.prefix
    now = now or datetime.now(UTC)
    first = plan_retention(history, keep_days, now)
    surveys = {n: _survey(history, n, v) for n, v in sorted(first.versions.items())}
    listed = list_candidates(store, prefix)
    _check_media(history, listed, surveys)
    sweep = Lease(store, prefix, SWEEPS)
    sweep.beat()  # before any "used" marker is read again (see leases.py)
    try:
        _at("listed")
        leases = store.list_info(layout.folder(prefix, WRITERS))  # after the listing
        alive = alive_after(now, older_than)
        cutoff = min(now - older_than, live_since(leases, alive) or now)
        leases.update(store.list_info(layout.folder(prefix, SWEEPS)))  # dead gcs' sweeps go too
        keep, expired = _reread(history, keep_days, now, first.versions, surveys)
        return _delete(history, listed, surveys, keep, expired, cutoff, leases, alive)
    finally:
        sweep.release()


def _reread(
    history: History,
    keep_days: float | None,
    now: datetime,
    surveyed: dict[str, set[int]],
    surveys: dict[str, _Survey],
) -> tuple[dict[str, set[int]], dict[str, dict[str, int]]]:
    """Heads, tags and pins read again (after the listing): the versions to keep, and the
    commits expired (their markers final). Newly reachable versions join ``surveys``."""
    final = plan_retention(history, keep_days, now)
    expired = final.expired
    if expired:  # pending, pins read once more, then final: see expiry.settle
        me = uuid.uuid4().hex  # this gc's pending markers: another gc never drops them
        mark_expired(history.place, expired, float(keep_days or 0), pending=me)
        try:
            _at("pending")
            again = plan_retention(history, keep_days, now)
            expired = {c: t for c, t in expired.items() if c in again.expired}
            _at("decided")
            for name, vs in again.versions.items():
                final.versions.setdefault(name, set()).update(vs)
            mark_expired(history.place, expired, float(keep_days or 0))
        finally:
            drop_pending(history.place, final.expired, me)
    for name, vs in sorted(final.versions.items()):
        new = vs - surveyed.get(name, set())
        if new:
            s = _survey(history, name, new)
            old = surveys.get(name)
            if old is not None:
                s = _Survey(
                    name, s.versions | old.versions, s.media | old.media, s.files | old.files
                )
            surveys[name] = s
    return final.versions, expired


def _delete(
    history: History,
    listed: Listed,
    surveys: dict[str, _Survey],
    keep: dict[str, set[int]],
    expired: dict[str, dict[str, int]],
    cutoff: datetime,
    leases: dict[str, ObjectInfo],
    alive: datetime,
) -> GcReport:
    store, prefix = history.place.store, history.place.prefix
    in_use = _check_media(history, listed, surveys)
    out, report = Removed(), GcReport(expired_commits=sorted(expired))
    files = {n: s.files for n, s in surveys.items()}
    for name in sorted(keep):
        report.kept_versions[name] = sorted(keep[name])
        objs = listed.tables.get(f"{name}.lance", {})
        latest = functools.partial(_open, history, name, None)
        collect_table(history, name, objs, keep[name], files.get(name, set()), cutoff, latest, out)
    collect_unreachable_tables(history, listed, keep, cutoff, out)
    collect_media(store, prefix, listed, in_use, cutoff, out)
    collect_episode_indexes(store, prefix, listed, files, cutoff, out)
    for key in stale(leases, alive):
        with suppress(NotFound):
            if store.modified(key) < alive:  # not a writer that just woke up
                store.delete(key)
    report.removed_versions, report.removed_bytes = out.versions, out.bytes
    report.removed_media, report.removed_tables = out.media, out.tables
    report.removed_files, report.removed_episode_indexes = out.files, out.episode_indexes
    return report


def _check_media(history: History, listed: Listed, surveys: dict[str, _Survey]) -> set[str]:
    """The media the surveyed versions name (:class:`CorruptData` if one is missing)."""
    in_use = set().union(*(s.media for s in surveys.values()))
    missing = sorted(in_use - listed.media.keys())  # not listed: maybe written since
    for key in history.place.store.missing(missing) if missing else []:
        owner = next(
            s.name for s in sorted(surveys.values(), key=lambda s: s.name) if key in s.media
        )
        raise CorruptData(_damaged(history, owner, f"media stream {key} is missing"))
    return in_use


def _damaged(history: History, table: str, what: str) -> str:
    return (
        f"gc of project {history.place.name!r} stopped before deleting anything: table {table!r}: "
        f"{what}; repair or restore it (or remove the commits that name it), then rerun gc"
    )


def _open(history: History, name: str, version: int | None) -> lance.LanceDataset:
    """A table version read from storage (not a cached handle); damage -> CorruptData."""
    store = history.place.store
    try:
        return history.lance.load(name, version, "its latest version" if version is None else "")
    except TreadleError as e:
        err: TreadleError = e
    if isinstance(err, CredentialsError):
        raise err from None
    if version is None:
        damaged = isinstance(err, NotFound) or "corrupt" in str(err).lower()
        kind = CorruptData if damaged else type(err)
        raise kind(_damaged(history, name, f"cannot read {err}")) from None
    # Lance could not read that version's manifest: missing, unreadable or unparsable?
    manifest = f"_versions/{2**64 - 1 - version}.manifest"  # Lance's V2 manifest naming
    where = f"version {version}: manifest {manifest}"
    try:
        store.get(f"{layout.table_key(history.place.prefix, name)}/{manifest}")
    except NotFound:
        raise CorruptData(_damaged(history, name, f"{where} is missing")) from None
    except TreadleError as e:  # the store failed: say so, not "corrupt"
        raise type(e)(_damaged(history, name, f"{where} cannot be read ({e})")) from None
    what = f"{where} is corrupt ({str(err).lstrip(': ')})"
    raise CorruptData(_damaged(history, name, what))


def _survey(history: History, name: str, versions: set[int]) -> _Survey:
    store = history.place.store
    base = f"{layout.table_key(history.place.prefix, name)}/data"
    files = store.list_info(base)
    media: set[str] = set()
    listed: set[str] = set()
    scanned: set[tuple[str, ...]] = set()
    for v in sorted(versions):
        ds = _open(history, name, v)
        video = [f.name for f in ds.schema if is_video(f)]
        for frag in ds.get_fragments():
            paths = tuple(df.path for df in frag.data_files())
            for df in frag.data_files():
                listed.add(f"{base}/{df.path}")
                info = files.get(f"{base}/{df.path}")
                if info is None:
                    what = f"version {v} lists data file data/{df.path}, which is missing"
                    raise CorruptData(_damaged(history, name, what))
                if df.file_size_bytes and info.size != df.file_size_bytes:
                    what = (
                        f"version {v} lists data file data/{df.path} of {df.file_size_bytes} "
                        f"bytes, but it holds {info.size}"
                    )
                    raise CorruptData(_damaged(history, name, what))
            if video and paths not in scanned:
                scanned.add(paths)
                media |= _streams(history, name, frag, video, paths)
    return _Survey(name, versions, media, listed)


def _streams(history: History, name: str, frag: Any, columns: list[str], paths: tuple) -> set[str]:
    """Media keys the video ``columns`` of one fragment name."""
    try:
        t = frag.to_table(columns=columns)
    except (OSError, ValueError, RuntimeError) as e:
        what = f"data file(s) {', '.join(f'data/{p}' for p in paths)} cannot be read ({e})"
        raise CorruptData(_damaged(history, name, what[:600])) from None
    out: set[str] = set()
    for col in columns:
        streams = pc.unique(pc.struct_field(t.column(col), "stream")).to_pylist()
        out.update(layout.under(history.place.prefix, s) for s in streams if s is not None)
    return out

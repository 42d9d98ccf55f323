"""Garbage collection: remove table versions and objects no commit reaches.

gc deletes an object only when it is **unreachable and older than the grace**
(``older_than``, default one hour), and it is safe to run at any time, while writers
and imports run:

1. **Survey, deleting nothing.** Reachable = every commit reachable (through parents)
   from every branch head and tag, less, with a retention (``keep_days``), the old
   commits nothing pins (:mod:`treadle.catalog.retention`). Every table version such a commit names is opened from
   storage, every data file it lists must be there with its recorded size, and the
   video columns of its fragments give the media streams in use, which must exist too.
   Any damage (a missing or unreadable manifest, data file or stream) stops gc with
   :class:`CorruptData` (or :class:`StorageError`) naming the table and the file, and
   nothing has been deleted: gc never guesses what a version it cannot read references.
2. **Cutoff** (read first of all, so a write that ends later is in the survey):
   ``now - older_than``, or earlier: the start of the oldest *running* transaction (see
   :mod:`treadle.catalog.leases`), so a write that takes longer than the grace keeps
   everything it staged. A reused content-addressed media object's age
   counts from its last reuse (its "used" marker), not from its first write.
3. **Delete.** Per table: reachable versions are tagged (``treadle-v<N>``) so Lance's
   cleanup keeps them; other versions older than the cutoff go, with the data files only
   they used; data files no remaining version lists (a dead writer's staged fragments)
   go once older than the cutoff. A writer killed between its Lance commit and its
   branch move leaves an unreachable *latest* version, which Lance's cleanup would keep
   forever: gc makes a new latest version equal to the newest reachable one first. A
   table no reachable commit names (made by a writer that died) goes whole once all its
   files are older than the cutoff. Media no reachable row names goes once older than
   the cutoff, re-checking its "used" marker just before each delete.

Lance's own ``delete_unverified=True`` is never used: it deletes every file no version
references *whatever its age*, including a running writer's staged fragments.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from treadle.catalog.leases import USED, WRITERS, live_since, stale, used_key
from treadle.catalog.retention import mark_expired, plan_retention
from treadle.errors import CorruptData, CredentialsError, NotFound, TreadleError
from treadle.storage import ObjectInfo, Store
from treadle.table.tensors import is_video

if TYPE_CHECKING:
    import lance

    from treadle.catalog.client import Project


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
    latest: lance.LanceDataset
    media: set[str]
    files: set[str]  # keys of the data files the reachable versions list


def reachable_versions(project: Project) -> dict[str, set[int]]:
    """Table name -> the Lance versions some commit reachable from a branch head or a tag
    names (less those of commits retention expired)."""
    return plan_retention(project, None, datetime.now(UTC)).versions


def collect_garbage(
    project: Project,
    older_than: timedelta = timedelta(hours=1),
    *,
    keep_days: float | None = None,
    now: datetime | None = None,
) -> GcReport:
    """Remove what no commit of ``project`` reaches and is older than ``older_than``.

    With ``keep_days``, the table versions of commits older than that which no branch
    head, tag or checkpoint run record pins are expired too (see
    :mod:`treadle.catalog.retention`); without it every reachable commit stays readable.

    ``now`` is gc's clock (default: the real one; tests move it to age objects on
    stores that cannot back-date them). Raises :class:`CorruptData` naming the table
    and file, having deleted nothing, when a reachable version cannot be fully read.
    """
    store, prefix = project.client.store, project.prefix
    now = now or datetime.now(UTC)
    report = GcReport()
    # Leases first: a write that ends (commits) after this point is in the survey below.
    alive_after = now - older_than
    leases = store.list_info(f"{prefix}/{WRITERS}")
    cutoff = min(alive_after, live_since(leases, alive_after) or alive_after)
    retention = plan_retention(project, keep_days, now)
    keep = retention.versions
    surveys = [_survey(project, name, versions) for name, versions in sorted(keep.items())]
    media = store.list_info(f"{prefix}/media")
    in_use = set().union(*(s.media for s in surveys))
    for s in surveys:
        for key in sorted(s.media - media.keys()):
            raise CorruptData(_damaged(project, s.name, f"media stream {key} is missing"))
    if retention.expired:  # readers of these commits get ExpiredCommit from now on
        mark_expired(project, retention.expired, float(keep_days or 0))
        report.expired_commits = sorted(retention.expired)
    for s in surveys:
        report.kept_versions[s.name] = sorted(s.versions)
        _collect_table(project, s, cutoff, report)
    _collect_unreachable_tables(project, keep, cutoff, report)
    _collect_media(store, prefix, media, in_use, cutoff, report)
    _collect_episode_indexes(store, prefix, surveys, cutoff, report)
    for key in stale(leases, alive_after):
        with suppress(NotFound):
            if store.modified(key) < alive_after:  # not a writer that just woke up
                store.delete(key)
    return report


def _damaged(project: Project, table: str, what: str) -> str:
    return (
        f"gc of project {project.name!r} stopped before deleting anything: table {table!r}: "
        f"{what}; repair or restore it (or remove the commits that name it), then rerun gc"
    )


def _open(project: Project, name: str, version: int | None) -> lance.LanceDataset:
    """A table version read from storage (not a cached handle); damage -> CorruptData."""
    store = project.client.store
    try:
        return project.lance.load(name, version, "its latest version" if version is None else "")
    except TreadleError as e:
        err: TreadleError = e
    if isinstance(err, CredentialsError):
        raise err from None
    if version is None:
        damaged = isinstance(err, NotFound) or "corrupt" in str(err).lower()
        kind = CorruptData if damaged else type(err)
        raise kind(_damaged(project, name, f"cannot read {err}")) from None
    # Lance could not read that version's manifest: missing, unreadable or unparsable?
    manifest = f"_versions/{2**64 - 1 - version}.manifest"  # Lance's V2 manifest naming
    where = f"version {version}: manifest {manifest}"
    try:
        store.get(f"{project.prefix}/tables/{name}.lance/{manifest}")
    except NotFound:
        raise CorruptData(_damaged(project, name, f"{where} is missing")) from None
    except TreadleError as e:  # the store failed: say so, not "corrupt"
        raise type(e)(_damaged(project, name, f"{where} cannot be read ({e})")) from None
    what = f"{where} is corrupt ({str(err).lstrip(': ')})"
    raise CorruptData(_damaged(project, name, what))


def _survey(project: Project, name: str, versions: set[int]) -> _Survey:
    store = project.client.store
    base = f"{project.prefix}/tables/{name}.lance/data"
    files = store.list_info(base)
    media: set[str] = set()
    listed: set[str] = set()
    scanned: set[tuple[str, ...]] = set()
    for v in sorted(versions):
        ds = _open(project, name, v)
        video = [f.name for f in ds.schema if is_video(f)]
        for frag in ds.get_fragments():
            paths = tuple(df.path for df in frag.data_files())
            for df in frag.data_files():
                listed.add(f"{base}/{df.path}")
                info = files.get(f"{base}/{df.path}")
                if info is None:
                    what = f"version {v} lists data file data/{df.path}, which is missing"
                    raise CorruptData(_damaged(project, name, what))
                if df.file_size_bytes and info.size != df.file_size_bytes:
                    what = (
                        f"version {v} lists data file data/{df.path} of {df.file_size_bytes} "
                        f"bytes, but it holds {info.size}"
                    )
                    raise CorruptData(_damaged(project, name, what))
            if video and paths not in scanned:
                scanned.add(paths)
                media |= _streams(project, name, frag, video, paths)
    return _Survey(name, versions, _open(project, name, None), media, listed)


def _streams(project: Project, name: str, frag: Any, columns: list[str], paths: tuple) -> set[str]:
    """Media keys the video ``columns`` of one fragment name."""
    try:
        t = frag.to_table(columns=columns)
    except (OSError, ValueError, RuntimeError) as e:
        what = f"data file(s) {', '.join(f'data/{p}' for p in paths)} cannot be read ({e})"
        raise CorruptData(_damaged(project, name, what[:600])) from None
    out: set[str] = set()
    for col in columns:
        streams = pc.unique(pc.struct_field(t.column(col), "stream")).to_pylist()
        out.update(f"{project.prefix}/{s}" for s in streams if s is not None)
    return out


def _collect_table(project: Project, s: _Survey, cutoff: datetime, report: GcReport) -> None:
    project.lance.protect_only(s.name, s.latest, s.versions)
    _lance_cleanup(project, s.latest, cutoff, report)
    if _orphan_latest(project, s.name, s.versions, cutoff):
        _lance_cleanup(project, _open(project, s.name, None), cutoff, report)
    _sweep_data_files(project, s, cutoff, report)


def _lance_cleanup(
    project: Project, ds: lance.LanceDataset, cutoff: datetime, report: GcReport
) -> None:
    """Lance's cleanup of untagged versions older than ``cutoff`` (and their files)."""
    versions, removed = project.lance.cleanup(ds, cutoff)
    report.removed_versions += versions
    report.removed_bytes += removed


def _sweep_data_files(project: Project, s: _Survey, cutoff: datetime, report: GcReport) -> None:
    """Data files no remaining version lists and older than ``cutoff``: dead writers'."""
    store = project.client.store
    base = f"{project.prefix}/tables/{s.name}.lance/data"
    files = store.list_info(base)
    listed = set(s.files)
    try:
        for info in _open(project, s.name, None).versions():
            v = int(info["version"])
            if v in s.versions:
                continue
            for frag in project.lance.open(s.name, v).get_fragments():
                listed.update(f"{base}/{df.path}" for df in frag.data_files())
    except TreadleError:
        return  # an unreachable version gc cannot read: keep every file this time
    for key, obj in files.items():
        if key not in listed and obj.modified < cutoff:
            store.delete(key)
            report.removed_files += 1
            report.removed_bytes += obj.size


def _orphan_latest(project: Project, name: str, versions: set[int], cutoff: datetime) -> bool:
    """Restore the newest reachable version over an unreachable latest one, if needed.

    True when a new latest version was made (the old latest can now be cleaned up).
    """
    latest = _open(project, name, None)
    if latest.version in versions or latest.version < max(versions):
        return False
    info = latest.versions()[-1]
    when = info["timestamp"]
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    if when >= cutoff:
        return False  # maybe a writer that is about to move its branch
    kept = project.lance.open(name, max(versions))
    kept_files = {df.path for f in kept.get_fragments() for df in f.data_files()}
    latest_files = {df.path for f in latest.get_fragments() for df in f.data_files()}
    if latest_files <= kept_files and latest.schema.equals(kept.schema, check_metadata=False):
        return False  # nothing only the unreachable version holds
    project.lance.restore(_open(project, name, max(versions)))
    return True


def _collect_unreachable_tables(
    project: Project, keep: dict[str, set[int]], cutoff: datetime, report: GcReport
) -> None:
    store = project.client.store
    for table in store.list_dirs(f"{project.prefix}/tables"):
        name = table[: -len(".lance")] if table.endswith(".lance") else table
        if name in keep or not table.endswith(".lance"):
            continue
        objs = store.list_info(f"{project.prefix}/tables/{table}")
        if objs and all(o.modified < cutoff for o in objs.values()):
            for k, o in objs.items():
                report.removed_bytes += o.size
                store.delete(k)
            if store.is_local:  # the folders a local store leaves behind
                _prune_empty(Path(store.url) / project.prefix / "tables" / table)
            report.removed_tables.append(name)


def _collect_media(
    store: Store,
    prefix: str,
    media: dict[str, ObjectInfo],
    in_use: set[str],
    cutoff: datetime,
    report: GcReport,
) -> None:
    """Streams no reachable row names, last written or reused before ``cutoff``."""
    used = store.list_info(f"{prefix}/{USED}")
    removed: set[str] = set()
    for key, obj in media.items():
        marker = used_key(prefix, key)
        if key in in_use or max(obj.modified, _when(used.get(marker))) >= cutoff:
            continue
        with suppress(NotFound):  # reused since the listing? (a writer found it, just now)
            if store.modified(marker) >= cutoff:
                continue
        store.delete(key)
        removed.add(key)
        report.removed_media.append(key)
        report.removed_bytes += obj.size
    for marker, obj in used.items():  # markers of deleted, referenced or missing objects
        key = f"{prefix}/{marker[len(prefix) + len(USED) + 2 :]}"
        if obj.modified < cutoff and (key in in_use or key in removed or key not in media):
            store.delete(marker)


def _collect_episode_indexes(
    store: Store, prefix: str, surveys: list[_Survey], cutoff: datetime, report: GcReport
) -> None:
    """Stored episode indexes (``table/episode_store.py``: one object per data file) of data
    files no reachable version lists (compacted away, or of a removed table), older than
    ``cutoff``. One deleted too early is only recomputed from its fragment on first read."""
    listed = {s.name: {k.rsplit("/", 1)[-1] for k in s.files} for s in surveys}
    base = f"{prefix}/episodes/"
    for key, obj in store.list_info(base.rstrip("/")).items():
        table, _, name = key[len(base) :].partition("/")
        stem = name[: name.find(".lance") + len(".lance")] if ".lance" in name else name
        if stem in listed.get(table, set()) or obj.modified >= cutoff:
            continue
        with suppress(NotFound):
            store.delete(key)
            report.removed_episode_indexes += 1
            report.removed_bytes += obj.size


def _when(info: ObjectInfo | None) -> datetime:
    return info.modified if info else datetime.min.replace(tzinfo=UTC)


def _prune_empty(folder: Path) -> None:
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with suppress(OSError):
            d.rmdir()
    with suppress(OSError):
        folder.rmdir()

"""gc's delete phase: what it may delete is listed first, and only what it listed goes.

:func:`list_candidates` lists every object gc might delete (media, "used" markers, each
table's files, manifests and tags, stored episode indexes) *before* gc re-reads the
branch heads, tags, pins and leases (:mod:`treadle.catalog.gc`). The functions here
then delete a listed object only when no re-read reaches or protects it:

- an object a commit landing later names was either staged by that commit's writer,
  whose lease gc's re-read saw (the object is at least as new as the lease's ``start``,
  both by the store's clock), or written after the listing (so not listed), or is a
  base object already reachable from the re-read heads;
- a table version goes only if its manifest was listed, no re-read commit names it, and
  the manifest is older than the cutoff: Lance's cleanup is told exactly which versions
  to remove (never "everything older than T", which would take an in-flight version);
- a Lance tag is removed only if it was listed, so a tag a writer makes after the
  re-read is never taken.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from treadle import layout
from treadle.catalog.leases import USED, used_key
from treadle.errors import NotFound, TreadleError
from treadle.storage import ObjectInfo, Store
from treadle.storage.filecache import delete_forgetting_copies

if TYPE_CHECKING:
    import lance

    from treadle.catalog.history import History

_VERSIONS, _TAGS = "_versions/", "_refs/tags/"


@dataclass
class Listed:
    """Every object gc may delete, as listed before its re-reads."""

    media: dict[str, ObjectInfo]
    used: dict[str, ObjectInfo]
    tables: dict[str, dict[str, ObjectInfo]]  # table folder (``<name>.lance``) -> its objects
    episodes: dict[str, ObjectInfo]


@dataclass
class Removed:
    """What the delete phase removed (copied into :class:`~treadle.catalog.gc.GcReport`)."""

    versions: int = 0
    bytes: int = 0
    media: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    files: int = 0
    episode_indexes: int = 0


def list_candidates(store: Store, prefix: str) -> Listed:
    """One listing of each kind of object gc deletes."""
    tables: dict[str, dict[str, ObjectInfo]] = {}
    base = layout.folder(prefix, layout.TABLES) + "/"
    for key, info in store.list_info(base.rstrip("/")).items():
        folder = key[len(base) :].split("/", 1)[0]
        tables.setdefault(folder, {})[key] = info
    return Listed(
        store.list_info(layout.folder(prefix, layout.MEDIA)),
        store.list_info(layout.folder(prefix, USED)),
        tables,
        store.list_info(layout.folder(prefix, layout.EPISODES)),
    )


def collect_table(
    history: History,
    name: str,
    objs: dict[str, ObjectInfo],
    keep: set[int],
    files: set[str],
    cutoff: datetime,
    latest: Callable[[], lance.LanceDataset],
    out: Removed,
) -> None:
    """Delete the listed, unreachable, old versions of table ``name`` and its unused files."""
    base = layout.table_key(history.place.prefix, name) + "/"
    manifests: dict[int, ObjectInfo] = {}
    tags: set[str] = set()
    for key, info in objs.items():
        rel = key[len(base) :]
        stem = rel[len(_VERSIONS) : -len(".manifest")]
        if rel.startswith(_VERSIONS) and rel.endswith(".manifest") and stem.isdigit():
            manifests[2**64 - 1 - int(stem)] = info  # Lance's V2 manifest naming
        elif rel.startswith(_TAGS) and rel.endswith(".json"):
            tags.add(rel[len(_TAGS) : -len(".json")])
    ds = latest()
    history.lance.protect_only(name, ds, keep, untag=tags)
    victims = sorted(v for v, i in manifests.items() if v not in keep and i.modified < cutoff)
    if victims and ds.version in victims and _restore_orphan(history, name, ds, keep):
        ds = latest()
    if victims:
        n, size = history.lance.cleanup(ds, victims)
        out.versions += n
        out.bytes += size
    data = {k: i for k, i in objs.items() if k.startswith(f"{base}data/")}
    _sweep_data_files(history, name, data, files, cutoff, latest, out)


def _restore_orphan(history: History, name: str, ds: lance.LanceDataset, keep: set[int]) -> bool:
    """The latest version is one gc may delete (a writer died between its Lance commit and
    its branch move) and Lance never removes the latest: make the newest kept version the
    latest again, if the orphan holds anything it lacks. True when a version was made."""
    if not keep or ds.version < max(keep):
        return False
    kept = history.lance.open(name, max(keep))
    kept_files = {df.path for f in kept.get_fragments() for df in f.data_files()}
    latest_files = {df.path for f in ds.get_fragments() for df in f.data_files()}
    if latest_files <= kept_files and ds.schema.equals(kept.schema, check_metadata=False):
        return False  # nothing only the orphan holds
    try:
        history.lance.restore(history.lance.load(name, max(keep), "its newest kept version"))
    except (TreadleError, OSError, ValueError, RuntimeError):
        return False  # a writer committed meanwhile: the orphan is not the latest any more
    return True


def _sweep_data_files(
    history: History,
    name: str,
    data: dict[str, ObjectInfo],
    files: set[str],
    cutoff: datetime,
    latest: Callable[[], lance.LanceDataset],
    out: Removed,
) -> None:
    """Listed data files no version lists any more, older than ``cutoff``: dead writers'."""
    store = history.place.store
    base = f"{layout.table_key(history.place.prefix, name)}/data"
    old = {k: i for k, i in data.items() if k not in files and i.modified < cutoff}
    if not old:
        return
    listed: set[str] = set()
    try:
        for info in latest().versions():
            for frag in history.lance.open(name, int(info["version"])).get_fragments():
                listed.update(f"{base}/{df.path}" for df in frag.data_files())
    except TreadleError:
        return  # a version gc cannot read: keep every file this time
    for key, obj in old.items():
        if key not in listed:
            store.delete(key)
            out.files += 1
            out.bytes += obj.size


def collect_unreachable_tables(
    history: History, listed: Listed, keep: dict[str, set[int]], cutoff: datetime, out: Removed
) -> None:
    """Tables no commit names (a writer died before its first commit), all of whose listed
    objects are older than ``cutoff``."""
    store = history.place.store
    for folder, objs in sorted(listed.tables.items()):
        name = folder[: -len(".lance")]
        if not folder.endswith(".lance") or name in keep:
            continue
        if objs and all(o.modified < cutoff for o in objs.values()):
            for k, o in objs.items():
                out.bytes += o.size
                store.delete(k)
            if store.is_local:  # the folders a local store leaves behind
                _prune_empty(Path(store.url) / history.place.prefix / "tables" / folder)
            out.tables.append(name)
    if store.is_local:  # a writer killed after making its table's folders, before a file
        for d in (Path(store.url) / history.place.prefix / "tables").glob("*.lance"):
            if d.name not in listed.tables and d.name[: -len(".lance")] not in keep:
                with suppress(OSError):
                    if datetime.fromtimestamp(d.stat().st_mtime, UTC) < cutoff:
                        _prune_empty(d)  # empty folders only: a file in it stays


def collect_media(
    store: Store, prefix: str, listed: Listed, in_use: set[str], cutoff: datetime, out: Removed
) -> None:
    """Streams no reachable row names, last written or reused before ``cutoff``.

    Each stream's "used" marker is read again just before its delete: gc's sweep marker is
    up by then, so a writer reusing the stream either wrote its marker first (gc keeps the
    stream) or sees the sweep and stores its bytes under a key of its own."""
    removed: set[str] = set()
    for key, obj in listed.media.items():
        marker = used_key(prefix, key)
        if key in in_use or max(obj.modified, _when(listed.used.get(marker))) >= cutoff:
            continue
        with suppress(NotFound):
            if store.modified(marker) >= cutoff:
                continue
        # this node's chunk cache names a stream by its key and size (the listed one): its
        # frames would stay on disk
        delete_forgetting_copies(store, key, obj.size)
        removed.add(key)
        out.media.append(key)
        out.bytes += obj.size
    for marker, obj in listed.used.items():  # markers of deleted, referenced or missing objects
        key = layout.under(prefix, marker[len(layout.folder(prefix, USED)) + 1 :])
        gone = key in removed or key not in listed.media
        if obj.modified < cutoff and (key in in_use or gone):
            store.delete(marker)


def collect_episode_indexes(
    store: Store, prefix: str, listed: Listed, files: dict[str, set[str]], cutoff: datetime,
    out: Removed,
) -> None:  # fmt: skip
    """Stored episode indexes (``table/episode_store.py``: one object per data file) of data
    files no reachable version lists (compacted away, or of a removed table), older than
    ``cutoff``. One deleted too early is only recomputed from its fragment on first read."""
    names = {t: {k.rsplit("/", 1)[-1] for k in keys} for t, keys in files.items()}
    base = layout.folder(prefix, layout.EPISODES) + "/"
    for key, obj in listed.episodes.items():
        table, _, name = key[len(base) :].partition("/")
        stem = name[: name.find(".lance") + len(".lance")] if ".lance" in name else name
        if stem in names.get(table, set()) or obj.modified >= cutoff:
            continue
        with suppress(NotFound):
            store.delete(key)
            out.episode_indexes += 1
            out.bytes += obj.size


def _when(info: ObjectInfo | None) -> datetime:
    return info.modified if info else datetime.min.replace(tzinfo=UTC)


def _prune_empty(folder: Path) -> None:
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with suppress(OSError):
            d.rmdir()
    with suppress(OSError):
        folder.rmdir()

"""Garbage collection: remove table versions and media that no commit reaches.

Reachable = every commit reachable (through parents) from every branch head.
Each table version a reachable commit names is tagged (``treadle-v<N>``) and so
kept by Lance's cleanup; every other version older than ``older_than`` goes, with
the data files only it used. Media streams no kept version references, and older
than ``older_than``, are deleted too. A running writer's files are younger than
the grace period, so gc never races a writer that is about to commit.

A writer killed between its Lance commit and its branch move leaves a Lance version
no commit names; when that version is the table's latest, Lance's cleanup would keep
it (and its data files) forever, so gc first makes a new latest version equal to the
newest reachable one. A table no reachable commit names at all (created by a writer
that died before its branch move) is removed whole once all its files are older than
``older_than``.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import lance
import pyarrow.compute as pc

from treadle.table.tensors import is_video

if TYPE_CHECKING:
    from treadle.catalog.client import Project


@dataclass
class GcReport:
    """What :func:`collect_garbage` kept and removed."""

    kept_versions: dict[str, list[int]] = field(default_factory=dict)
    removed_versions: int = 0
    removed_bytes: int = 0
    removed_media: list[str] = field(default_factory=list)
    removed_tables: list[str] = field(default_factory=list)


def reachable_versions(project: Project) -> dict[str, set[int]]:
    """Table name -> the Lance versions some reachable commit names."""
    seen: set[str] = set()
    out: dict[str, set[int]] = {}
    stack = [project.refs.head(b).commit_id for b in project.branches() if project.refs.head(b)]
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        c = project.load_commit(cid)
        for name, v in c.tables.items():
            out.setdefault(name, set()).add(v)
        stack.extend(c.parents)
    return out


def collect_garbage(project: Project, older_than: timedelta = timedelta(hours=1)) -> GcReport:
    """Remove what no commit of ``project`` reaches and is older than ``older_than``."""
    store = project.client.store
    report = GcReport()
    keep = reachable_versions(project)
    media_in_use: set[str] = set()
    for name, versions in sorted(keep.items()):
        report.kept_versions[name] = sorted(versions)
        latest = lance.dataset(project.table_uri(name), storage_options=store.lance_options)
        tags = latest.tags.list()
        for v in versions:
            if f"treadle-v{v}" not in tags:
                project.protect_version(name, v)
        for tag, info in tags.items():
            if tag.startswith("treadle-v") and info["version"] not in versions:
                latest.tags.delete(tag)
        stats = latest.cleanup_old_versions(
            older_than=older_than, delete_unverified=True, error_if_tagged_old_versions=False
        )
        report.removed_versions += stats.old_versions
        report.removed_bytes += stats.bytes_removed
        for v in versions:
            ds = project.open_dataset(name, v)
            for f in ds.schema:
                if is_video(f):
                    col = ds.to_table(columns=[f.name]).column(f.name)
                    streams = pc.unique(pc.struct_field(col, "stream")).to_pylist()
                    media_in_use.update(f"{project.prefix}/{s}" for s in streams)
    cutoff = datetime.now(UTC) - older_than
    for name, versions in sorted(keep.items()):
        if _orphan_latest(project, name, versions, cutoff):
            latest = lance.dataset(project.table_uri(name), storage_options=store.lance_options)
            stats = latest.cleanup_old_versions(
                older_than=older_than, delete_unverified=True, error_if_tagged_old_versions=False
            )
            report.removed_versions += stats.old_versions
            report.removed_bytes += stats.bytes_removed
    for table in store.list_dirs(f"{project.prefix}/tables"):
        name = table[: -len(".lance")] if table.endswith(".lance") else table
        if name in keep or not table.endswith(".lance"):
            continue
        keys = store.list(f"{project.prefix}/tables/{table}")
        if keys and all(store.modified(k) < cutoff for k in keys):
            for k in keys:
                report.removed_bytes += store.size(k)
                store.delete(k)
            if store.is_local:  # the folders a local store leaves behind
                _prune_empty(Path(store.url) / project.prefix / "tables" / table)
            report.removed_tables.append(name)
    for key in store.list(f"{project.prefix}/media"):
        if key not in media_in_use and store.modified(key) < cutoff:
            store.delete(key)
            report.removed_media.append(key)
    return report


def _orphan_latest(project: Project, name: str, versions: set[int], cutoff: datetime) -> bool:
    """Restore the newest reachable version over an unreachable latest one, if needed.

    True when a new latest version was made (the old latest can now be cleaned up).
    """
    store = project.client.store
    latest = lance.dataset(project.table_uri(name), storage_options=store.lance_options)
    if latest.version in versions or latest.version < max(versions):
        return False
    info = latest.versions()[-1]
    when = info["timestamp"]
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    if when >= cutoff:
        return False  # maybe a writer that is about to move its branch
    kept = project.open_dataset(name, max(versions))
    kept_files = {df.path for f in kept.get_fragments() for df in f.data_files()}
    latest_files = {df.path for f in latest.get_fragments() for df in f.data_files()}
    if latest_files <= kept_files and latest.schema.equals(kept.schema, check_metadata=False):
        return False  # nothing only the unreachable version holds
    lance.dataset(
        project.table_uri(name), version=max(versions), storage_options=store.lance_options
    ).restore()
    return True


def _prune_empty(folder: Path) -> None:
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with suppress(OSError):
            d.rmdir()
    with suppress(OSError):
        folder.rmdir()

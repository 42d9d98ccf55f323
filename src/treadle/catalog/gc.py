"""Garbage collection: remove table versions and media that no commit reaches.

Reachable = every commit reachable (through parents) from every branch head.
Each table version a reachable commit names is tagged (``treadle-v<N>``) and so
kept by Lance's cleanup; every other version older than ``older_than`` goes, with
the data files only it used. Media streams no kept version references, and older
than ``older_than``, are deleted too. A running writer's files are younger than
the grace period, so gc never races a writer that is about to commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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
    for key in store.list(f"{project.prefix}/media"):
        if key not in media_in_use and _modified(store, key) < cutoff:
            store.delete(key)
            report.removed_media.append(key)
    return report


def _modified(store, key: str) -> datetime:  # type: ignore[no-untyped-def]
    import obstore

    meta = obstore.head(store._inner, key)
    return meta["last_modified"]

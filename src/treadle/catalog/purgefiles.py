"""What a purge deletes once its record is stored (:mod:`treadle.catalog.purge`).

For each replaced version: its manifest and its ``treadle-v<N>`` tag, its statistics
(``stats/<table>/v<N>/``); every kept ``plan.stats`` result (``runstats/``: a run's
quantiles are values of its rows, and a run id does not say which tables it read; they
are computed again when asked); for each replaced fragment: its data files (and this machine's
cached copies of them) and its stored episode index; then the purged episodes' media
streams that no row of another episode names (and this machine's cached chunks of them).
Media go the way gc's do: gc's sweep marker is up first, so a writer reusing a stream
meanwhile either marked it used (it stays) or stores a copy of its own
(:mod:`treadle.catalog.leases`). A stream reused in the last five minutes stays for gc,
which removes it when no row names it.

A purge interrupted once its record is stored is finished by the next purge of the table,
or by running it again (:func:`finish_earlier`), which does the same from the record: the
record names the replaced versions, the data files removed and the purged rows' streams.
A record is marked ``finished`` once its deletions are done, so later purges walk only
the records of purges that did not finish.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from treadle import layout
from treadle.catalog.leases import LEASE_TTL, SWEEPS, Lease, used_key
from treadle.catalog.purgemap import PurgeRecord, write_record
from treadle.errors import NotFound
from treadle.storage import Store
from treadle.storage.filecache import delete_forgetting_copies
from treadle.table.episode_store import fragment_key
from treadle.table.tensors import is_video

if TYPE_CHECKING:
    from treadle.catalog.history import History

log = logging.getLogger("treadle")


def manifest_keys(table_key: str, version: int) -> list[str]:
    """Where Lance may keep ``version``'s manifest (its V2 naming, then V1's)."""
    return [
        f"{table_key}/_versions/{2**64 - 1 - version}.manifest",
        f"{table_key}/_versions/{version}.manifest",
    ]


def referenced_streams(project: History, table: str, versions: list[int]) -> set[str]:
    """Media keys (project-relative) the video columns of ``versions`` name (purged
    rows are blank by now, so: the streams other episodes still use)."""
    out: set[str] = set()
    seen: set[tuple[str, ...]] = set()
    for v in versions:
        ds = project.lance.load(table, v, f"table {table!r} version {v}")
        video = [f.name for f in ds.schema if is_video(f)]
        if not video:
            continue
        for frag in ds.get_fragments():
            files = tuple(sorted(df.path for df in frag.metadata.files))
            if files in seen:
                continue
            seen.add(files)
            t = frag.to_table(columns=video)
            for col in video:
                streams = pc.unique(pc.struct_field(t.column(col), "stream")).to_pylist()
                out.update(s for s in streams if s)
    return out


def _delete(store: Store, key: str, size: int | None = None) -> None:
    """Delete ``key`` if it is there; with its ``size``, this machine's copies of it too."""
    with suppress(NotFound):
        if size:
            delete_forgetting_copies(store, key, size)
        else:
            store.delete(key)


def delete_replaced(
    project: History,
    table: str,
    replaced: dict[int, int],
    old: dict[str, Any],
    streams: set[str],
    lease: Lease,
) -> None:
    """Delete what held the purged rows (see the module docstring); ``old``: data file
    path -> the replaced fragment; ``streams``: the purged rows' media keys nothing else
    names."""
    store, prefix = project.place.store, project.place.prefix
    base = layout.table_key(prefix, table)
    for v in sorted(replaced):
        for key in manifest_keys(base, v):
            _delete(store, key)
        _delete(store, f"{base}/_refs/tags/treadle-v{v}.json")
        for key in store.list(layout.stats_folder(prefix, table, v)):
            _delete(store, key)
    for key in store.list(layout.folder(prefix, layout.RUNSTATS)):
        _delete(store, key)  # run ids do not say which tables a run read: every run's go
    metas = {id(m): m for m in old.values()}
    for meta in metas.values():
        lease.beat()
        _delete(store, fragment_key(prefix, table, meta))
        for df in meta.files:
            _delete(store, f"{base}/data/{df.path}", int(df.file_size_bytes or 0))
    _delete_media(project, streams)


def finish_earlier(
    project: History, table: str, keep: Callable[[], set[str]], records: list[PurgeRecord]
) -> None:
    """Delete what the purges of ``records`` not marked finished (earlier ones of ``table``
    interrupted after storing their records) left, as :func:`delete_replaced` does: the
    replaced versions' manifests, tags, statistics and stored episode indexes, the data
    files they removed (and this machine's copies of them), every kept ``plan.stats``
    result, and their episodes' streams no row names (``keep()``: the streams the rows of
    the versions left name, asked once their old versions' manifests are gone).
    Each is then marked finished, so a purge walks only the records not finished before
    it (what is gone already costs one request a file or stream, and one listing per
    table folder). A record written before its streams were kept names none: gc removes
    them, once no row names them (they are blank)."""
    records = [r for r in records if not r.finished]
    if not records:
        return
    store, prefix = project.place.store, project.place.prefix
    base = layout.table_key(prefix, table)
    versions = {v for r in records for v in r.versions}
    if versions:
        tags = {f"{base}/_refs/tags/treadle-v{v}.json" for v in versions}
        stats = tuple(layout.stats_folder(prefix, table, v) + "/" for v in versions)
        listed = store.list(f"{base}/_refs/tags") + store.list(f"{prefix}/{layout.STATS}/{table}")
        for key in listed:
            if key in tags or key.startswith(stats):
                _delete(store, key)
        for key in store.list(layout.folder(prefix, layout.RUNSTATS)):
            _delete(store, key)
    for record in records:
        for v in record.versions:
            for key in manifest_keys(base, v):
                _delete(store, key)
        for path in record.removed:
            stem = path.rsplit("/", 1)[-1]  # a fragment's index is named by its first file
            _delete(store, layout.episodes_key(prefix, table, stem))
            key = f"{base}/data/{path}"
            try:
                size = store.size(key)
            except NotFound:
                continue  # deleted by the purge, after its copies were forgotten
            _delete(store, key, size)
    streams = {s for r in records for s in r.streams}
    _delete_media(project, streams - keep() if streams else set())
    unknown = [r.commit[:8] for r in records if not r.streams_known]
    if unknown:
        log.info("treadle: purges %s of table %r kept no list of their streams; gc removes "
                 "those no row names", unknown, table)  # fmt: skip
    for record in records:
        write_record(project.place, dataclasses.replace(record, finished=True))


def _delete_media(project: History, streams: set[str]) -> None:
    """Delete ``streams`` under gc's sweep marker, except one a writer reused since."""
    if not streams:
        return
    store, prefix = project.place.store, project.place.prefix
    sweep = Lease(store, prefix, SWEEPS)
    sweep.beat()  # from now on a writer reusing a stream stores a copy of its own
    recent = datetime.now(UTC) - LEASE_TTL
    try:
        for key in sorted(streams):
            full = layout.under(prefix, key)
            with suppress(NotFound):
                if store.modified(used_key(prefix, full)) >= recent:
                    continue  # a writer may be storing this content again: gc decides later
            try:
                size = store.size(full)
            except NotFound:
                continue
            # the purged frames in this node's chunk cache (named by the stream's extent: its
            # packets end to end, the object's size)
            _delete(store, full, size)
    finally:
        sweep.release()

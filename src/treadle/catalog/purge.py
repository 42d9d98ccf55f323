"""``project.purge(table, episodes, reason=...)``: episodes removed from history too.

Commits and Lance data files are immutable, and object caches key data files by name and
size, so nothing is rewritten in place. A purge, in this order:

1. checks every episode is in some version of the table (:class:`NotFound` otherwise,
   nothing written);
2. commits a deletion (``delete_episodes``) on every branch whose head holds one of them;
   the commit on ``branch`` (an empty one when its head held none) is *the purge's commit*;
3. writes, for every Lance version of the table that still holds a purged row, a
   replacement version: the same fragments, each one holding such a row written again
   with those rows blanked (:mod:`treadle.table.scrub`), so every moment id stays;
4. stores the purge record (:mod:`treadle.catalog.purgemap`): ``{old: replacement}``,
   the episodes, the commit and the reason. Every open of an old version reads its
   replacement from then on, and a plan whose anchors reach a purged episode, or a read
   of its rows, raises :class:`~treadle.errors.Purged` naming the episode, the commit and
   the reason;
5. deletes what held the rows (:mod:`treadle.catalog.purgefiles`): the old data files,
   the old versions' manifests and tags, their stored episode indexes and statistics, and
   the episodes' media streams unless a row of another episode names the same stream;
   then what earlier purges of the table that died while deleting left, and marks the
   records finished.

A version a purge of the same episodes already replaced or wrote is not written again.
While it runs, a merge that would change the table is refused, and a purge waits for the
merges running when it starts (:mod:`treadle.catalog.purgeguard`).

Run again once everything is done (no version nor branch head holds an unblanked row of
the episodes), a purge commits nothing: it finishes what an interrupted run left and
returns the commit of the purge that removed them (the latest, if several did).

Other episodes of the old versions read as before, value for value. The episodes' names
stay in the footers of other data files written while a schema record named them (see
``docs/api.md``, "What a purge does not erase").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle.catalog.commit import Commit
from treadle.catalog.history import Merging
from treadle.catalog.leases import Lease
from treadle.catalog.purgefiles import delete_replaced, finish_earlier, referenced_streams
from treadle.catalog.purgeguard import purge_lease
from treadle.catalog.purgemap import PurgeRecord, read_records, write_record
from treadle.errors import CommitConflict, NotFound, Purged, SchemaMismatch, TreadleError
from treadle.names import check_name
from treadle.table.episodes import EPISODE
from treadle.table.scrub import scrub_version
from treadle.table.tensors import is_video

_ATTEMPTS = 20  # deletions on one branch raced by other writers before a purge gives up


class PurgeOf(Merging, Protocol):
    """What a purge uses of its project (a :class:`treadle.Project`, which mixes
    :class:`Purges` in: this module does not import it)."""

    def branch(self, name: str = ...) -> Any: ...


class Purges:
    """``project.purge`` and the purge map every read of the project consults."""

    def purge(
        self,
        table: str,
        episodes: Sequence[str],
        *,
        reason: str,
        branch: str = "main",
        progress: bool | None = None,
    ) -> Commit:
        """Remove ``episodes`` of ``table`` from every version of it, for good (privacy,
        consent, legal removal): see :mod:`treadle.catalog.purge`. Returns the purge's
        commit on ``branch``. ``reason`` is kept and shown by every :class:`td.Purged`;
        ``progress``: a progress bar over the versions rewritten (None: on a terminal)."""
        return purge_episodes(self, table, episodes, reason, branch, progress)  # type: ignore[arg-type]

    def purged(self, name: str, version: int, fresh: bool = False) -> Mapping[str, TreadleError]:
        """``{episode: td.Purged}`` of table ``name`` at ``version`` (``fresh``: purges
        read from storage now): what :meth:`Table.purged` answers."""
        return self.lance.purged(name, version, fresh)  # type: ignore[attr-defined]


class _Rows:
    """Which rows of each fragment are purged, read once per set of data files."""

    def __init__(self, episodes: set[str]):
        self.episodes = episodes
        self.found: set[str] = set()
        self._memo: dict[tuple[str, ...], tuple[np.ndarray, set[str]]] = {}

    def __call__(self, fragment: Any) -> np.ndarray:
        return self.read(fragment)[0]

    def read(self, fragment: Any) -> tuple[np.ndarray, set[str]]:
        """The fragment's purged rows, and the episodes they are of."""
        key = tuple(sorted(df.path for df in fragment.metadata.files))
        got = self._memo.get(key)
        if got is None:
            names = fragment.to_table(columns=[EPISODE]).column(EPISODE)
            hit = pc.is_in(names, value_set=pa.array(sorted(self.episodes))).fill_null(False)
            here = set(pc.unique(names.filter(hit)).to_pylist())
            got = self._memo[key] = (np.asarray(hit, dtype=bool), here)
            self.found |= here
        return got


def purge_episodes(
    project: PurgeOf,
    table: str,
    episodes: Sequence[str],
    reason: str,
    branch: str,
    progress: bool | None,
) -> Commit:
    """:meth:`Purges.purge` (the steps in the module docstring)."""
    check_name(table, "table")
    wanted = _check_args(episodes, reason)
    if project.refs.head(branch) is None:
        raise NotFound(f"branch {branch!r} not found in project {project.name!r}")
    guard = purge_lease(project.place, table)  # before the scan: see catalog/purgeguard.py
    try:
        return _purge(project, table, wanted, reason, branch, progress)
    finally:
        guard.release()


def _purge(
    project: PurgeOf,
    table: str,
    wanted: set[str],
    reason: str,
    branch: str,
    progress: bool | None,
) -> Commit:
    """:func:`purge_episodes` once it holds the table's purge lease."""
    where = f"table {table!r} of project {project.name!r}"
    rows = _Rows(wanted)
    found = _scan(project, table, rows, where)
    missing = sorted(wanted - rows.found)
    if missing:
        raise NotFound(
            f"{where} has no episode(s) {missing[:5]} in any version; nothing was written"
        )
    earlier = read_records(project.place, table)
    pending = _pending(found, earlier)
    lease = Lease(project.place.store, project.place.prefix)
    if not pending and not any(_held(project, b, table, wanted) for b in project.branches()):
        try:  # purged before: what a purge that died left is deleted, nothing committed
            lease.beat()
            finish_earlier(project, table, lambda: _kept(project, table, where), earlier)
        finally:
            lease.release()
        last = [r for r in earlier if wanted & set(r.episodes)][-1]
        return project.load_commit(last.commit)
    commit = _commit_deletions(project, table, wanted, reason, branch)
    try:
        lease.beat()
        replaced, streams, old, blanked = _replace_versions(
            project, table, rows, pending, lease.beat, progress
        )
        eps = tuple(sorted(wanted))
        removed = tuple(sorted(old))
        record = PurgeRecord(table, commit.id, reason, eps, replaced, time.time(), blanked, removed,
                             tuple(sorted(streams)))  # fmt: skip
        write_record(project.place, record)
        project.lance.forget(table)
        for v in sorted(set(replaced.values())):
            project.lance.protect(table, v)
        keep = _kept(project, table, where, set(replaced))
        delete_replaced(project, table, replaced, old, streams - keep, lease)
        earlier = [r for r in earlier if r.commit != commit.id]
        finish_earlier(project, table, lambda: _kept(project, table, where), earlier)
        write_record(project.place, dataclasses.replace(record, finished=True))
    finally:
        lease.release()
    return commit


def _scan(project: PurgeOf, table: str, rows: _Rows, where: str) -> dict[int, set[str]]:
    """``{version: the episodes of rows it holds}`` over every version in storage."""
    found: dict[int, set[str]] = {}
    for v in _versions(project, table, where):
        ds = project.lance.load(table, v, f"{where} version {v}")
        if EPISODE not in ds.schema.names:
            raise SchemaMismatch(
                f"{where} has no episodes (no episode column); nothing was written"
            )
        found[v] = set().union(*(rows.read(frag)[1] for frag in ds.get_fragments()))
    return found


def _pending(found: dict[int, set[str]], records: list[PurgeRecord]) -> list[int]:
    """The versions holding rows of episodes no purge blanked in them: neither replaced by
    a purge of those episodes (its old version, deleted once it finishes) nor written by
    one (its replacement, or a replacement's replacement)."""
    covered: dict[int, set[str]] = {}
    for r in records:  # oldest first: a replacement inherits what its old version had
        for old, new in r.versions.items():
            covered.setdefault(old, set()).update(r.episodes)
            covered.setdefault(new, set()).update(covered[old])
    return sorted(v for v, names in found.items() if names - covered.get(v, set()))


def _held(project: PurgeOf, name: str, table: str, wanted: set[str]) -> bool:
    """Whether branch ``name``'s head holds one of ``wanted`` (the purge deletes it there)."""
    head = project.load_commit(project.refs.head(name).commit_id)  # type: ignore[union-attr]
    if table not in head.tables:
        return False
    return bool(wanted & set(project.table_at(table, head.tables[table], head.id).episodes().names))


def _kept(project: PurgeOf, table: str, where: str, replaced: Collection[int] = ()) -> set[str]:
    """The media keys the rows of the versions in storage (but ``replaced``) name."""
    left = [v for v in _versions(project, table, where) if v not in replaced]
    return referenced_streams(project, table, left)


def _check_args(episodes: Sequence[str], reason: str) -> set[str]:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("purge needs a reason= (kept with the purge, shown by td.Purged)")
    if isinstance(episodes, str):
        episodes = [episodes]
    wanted = {str(e) for e in episodes}
    if not wanted:
        raise ValueError("purge needs at least one episode name")
    return wanted


def _versions(project: PurgeOf, table: str, where: str) -> list[int]:
    """Every Lance version of ``table`` in storage now (replaced ones are gone)."""
    latest = project.lance.load(table, None, where)
    return sorted(int(v["version"]) for v in latest.versions())


def _commit_deletions(
    project: PurgeOf, table: str, wanted: set[str], reason: str, branch: str
) -> Commit:
    """Delete the episodes on every branch whose head holds one; the commit on ``branch``."""
    message = f"purge {table}: {reason}"
    ours: Commit | None = None
    for name in sorted(project.branches()):
        commit = _delete_on(project, name, table, wanted, message)
        if name == branch:
            ours = commit
    return ours if ours is not None else _empty_commit(project, branch, message)


def _delete_on(
    project: PurgeOf, name: str, table: str, wanted: set[str], message: str
) -> Commit | None:
    """Delete the episodes of ``wanted`` branch ``name``'s head holds (None: it holds none);
    a writer that changed the table meanwhile is not an error: delete on its head."""
    for _ in range(_ATTEMPTS):
        head = project.load_commit(project.refs.head(name).commit_id)  # type: ignore[union-attr]
        if table not in head.tables:
            return None
        have = set(project.table_at(table, head.tables[table], head.id).episodes().names)
        present = sorted(wanted & have)
        if not present:
            return None
        try:
            with project.branch(name).transaction(message) as tx:
                tx.table(table).delete_episodes(present)
        except CommitConflict:
            continue
        return tx.commit
    raise CommitConflict(
        f"table {table!r} of project {project.name!r}: branch {name!r} kept changing while "
        f"the purge deleted {sorted(wanted)[:5]} on it ({_ATTEMPTS} attempts); the branches "
        "done so far keep their deletions; purge again"
    )


def _empty_commit(project: PurgeOf, branch: str, message: str) -> Commit:
    """A commit on ``branch`` that changes no table (the episodes had left its head)."""
    for _ in range(20):
        head = project.refs.head(branch)
        assert head is not None
        parent = project.load_commit(head.commit_id)
        commit = Commit.create([head.commit_id], message, dict(parent.tables), after=parent.time)
        project.save_commit(commit)
        if project.refs.try_advance(branch, head.seq + 1, commit.id):
            return commit
    raise CommitConflict(f"could not move branch {branch!r} of project {project.name!r}")


def _replace_versions(
    project: PurgeOf,
    table: str,
    rows: _Rows,
    versions: list[int],
    beat: Any,
    progress: bool | None,
) -> tuple[dict[int, int], set[str], dict[str, Any], tuple[str, ...]]:
    """Each of ``versions`` (holding a purged row) committed again with them blanked:
    ``({old: replacement}, media keys the rows named, {data file path: old fragment},
    the new data files holding the blanked rows)``."""
    from tqdm import tqdm

    where = f"table {table!r} of project {project.name!r}"
    lance = project.lance
    replaced: dict[int, int] = {}
    streams: set[str] = set()
    old: dict[str, Any] = {}
    blanked: list[str] = []
    memo: dict[Any, Any] = {}  # a fragment several versions list is written once
    bar = tqdm(versions, desc=f"purge {table}", unit="version",
               disable=None if progress is None else not progress)  # fmt: skip
    for v in bar:
        ds = lance.load(table, v, f"{where} version {v}")
        video = [f.name for f in ds.schema if is_video(f)]
        done = scrub_version(ds, rows.episodes, video, rows, beat, memo)
        if done.edited is None:
            continue
        edited = done.edited
        replaced[v] = lance.commit_edit(table, edited.schema, edited.fragments, purge=True)
        streams |= done.streams
        blanked.extend(done.written)
        for meta in done.replaced:
            for df in meta.files:
                old[df.path] = meta
    return replaced, streams, old, tuple(sorted(set(blanked)))


__all__ = ["Purged", "Purges", "purge_episodes"]

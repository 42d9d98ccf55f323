"""A project's Lance handle: every Lance dataset call the catalog makes goes through it.

One :class:`LanceTables` per :class:`~treadle.catalog.client.Project` (``project.lance``),
given the project's place (:class:`~treadle.catalog.place.ProjectPlace`), owns:

- **opening versions**: a pinned version opened once and kept in a bounded cache
  (:class:`~treadle.catalog.lru.Lru`: a long-lived writer opens a version per commit, memory
  stays flat), or read fresh from storage (what gc checks);
- **episode indexes**, cached per version beside the open versions (computed by
  :func:`treadle.table.episode_store.compute_episode_index`), and the episode names of
  each table's fragments a commit checks new names against
  (:class:`~treadle.table.episode_names.EpisodeNames`);
- **committing** a version that lists exactly a base's fragments + new ones
  (:mod:`treadle.table.lancecommit`);
- **protection and cleanup**: the ``treadle-v<N>`` tags that keep a version from Lance's
  cleanup, the cleanup itself and restoring an older version as the latest;
- **purges**: every open of a version reads the version a purge replaced it with
  (:class:`~treadle.catalog.purgemap.PurgeMap`, read again on each version not yet open),
  and :meth:`LanceTables.purged` says which episodes a read of a version must refuse;
- **error mapping**: a failure to open a version is an :class:`ExpiredCommit` when
  retention took it, the project's :class:`NotFound` when there is no project, else
  :func:`~treadle.table.lanceerror.lance_error` naming the table and version. A read
  through a handle opened before gc expired its commit is mapped where it fails
  (:meth:`~treadle.table.table.Table.read_error`, asking ``Project.expired``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from typing import TYPE_CHECKING

import lance
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from treadle import layout
from treadle.catalog.expiry import expired_error
from treadle.catalog.lru import Lru
from treadle.catalog.place import ProjectPlace
from treadle.catalog.purgemap import PurgeMap, read_records
from treadle.errors import Purged, TreadleError
from treadle.storage.credsource import advice
from treadle.table.episode_names import EpisodeNames
from treadle.table.episode_store import compute_episode_index
from treadle.table.episodes import EpisodeIndex
from treadle.table.lancecommit import commit_edit, commit_exactly
from treadle.table.lanceerror import lance_error

if TYPE_CHECKING:
    from treadle.table.table import Table

_OPEN_VERSIONS = 32  # table versions a project keeps open (and their episode indexes)
_TAG = "treadle-v"  # Lance tag of a version some commit names: cleanup keeps it


class LanceTables:
    """The Lance datasets of one project's tables (see the module docstring)."""

    def __init__(self, place: ProjectPlace, absent: Callable[[], TreadleError | None]):
        """``absent()``: the project's :class:`NotFound` while it does not exist, else None."""
        self.place = place
        self.absent = absent
        self._datasets: Lru[tuple[str, int], lance.LanceDataset] = Lru(_OPEN_VERSIONS)
        self._episodes: Lru[tuple[str, int], EpisodeIndex] = Lru(_OPEN_VERSIONS)
        self.episode_names = EpisodeNames()  # what commits check new episode names against
        self._purges: dict[str, PurgeMap] = {}  # per table, read again when a version opens

    @property
    def options(self) -> dict[str, str] | None:
        """``storage_options`` Lance opens the project's root with."""
        return self.place.store.lance_options

    def _advice(self) -> tuple[str, str]:
        """:func:`lance_error`'s ``advice`` and ``place`` for this project's store."""
        return advice(self.place.store.credentials), self.place.store.place

    def uri(self, name: str) -> str:
        """Where table ``name``'s Lance dataset lives."""
        return self.place.store.lance_uri(layout.table_key(self.place.prefix, name))

    # -- versions ------------------------------------------------------------------------
    def open(self, name: str, version: int, commit_id: str | None = None) -> lance.LanceDataset:
        """Lance ``version`` of table ``name`` (cached); ``commit_id``, the commit it was
        read through, names it in the :class:`ExpiredCommit` raised if retention took it."""
        key = (name, int(version))
        ds = self._datasets.get(key)
        if ds is None:
            reads = self.purge_map(name, fresh=True).resolve(int(version))
            try:
                ds = lance.dataset(self.uri(name), version=reads, storage_options=self.options)
            except (ValueError, OSError) as e:
                absent = self.absent()
                if absent is not None:
                    raise absent from None
                expired = expired_error(self.place, commit_id, name) if commit_id else None
                if expired is not None:
                    raise expired from None
                where = f"table {name!r} version {version} of project {self.place.name!r}"
                raise lance_error(e, where, *self._advice()) from None
            ds = self._datasets.setdefault(key, ds)
        return ds

    def purge_map(self, name: str, fresh: bool = False) -> PurgeMap:
        """The purges of table ``name`` (``fresh``: read from storage now)."""
        got = self._purges.get(name)
        if got is None or fresh:
            got = self._purges[name] = PurgeMap(self.place.name, read_records(self.place, name))
        return got

    def resolve(self, name: str, version: int) -> int:
        """The Lance version that holds ``version``'s rows now (itself unless purged)."""
        return self.purge_map(name).resolve(version)

    def purged(self, name: str, version: int, fresh: bool = False) -> dict[str, Purged]:
        """``{episode: Purged}``: the purged episodes of table ``name`` at ``version``
        (``fresh``: the purges read from storage now)."""
        return self.purge_map(name, fresh).purged(version)

    def forget(self, name: str) -> None:
        """Drop every open version and episode index of table ``name`` (after a purge)."""
        self._datasets.drop(lambda k: k[0] == name)
        self._episodes.drop(lambda k: k[0] == name)
        self._purges.pop(name, None)

    def load(self, name: str, version: int | None, where: str) -> lance.LanceDataset:
        """Table ``name`` at ``version`` (None: the latest) read from storage now, not a
        cached handle; a failure is :func:`lance_error` naming ``where``."""
        try:
            return lance.dataset(self.uri(name), version=version, storage_options=self.options)
        except (OSError, ValueError, RuntimeError) as e:
            raise lance_error(e, where, *self._advice()) from None

    def episode_index(self, table: Table) -> EpisodeIndex:
        """The episode index of a pinned table, computed once per version."""
        key = (table.name, table.version)
        idx = self._episodes.get(key)
        if idx is None:
            idx = self._episodes.setdefault(key, compute_episode_index(table))
        return idx

    def commit(
        self,
        name: str,
        schema: pa.Schema,
        base: lance.LanceDataset | None,
        fragments: list[FragmentMetadata],
        before_write: Callable[[], None],
    ) -> int:
        """A new version of table ``name``: ``base``'s fragments + ``fragments``."""
        listed = list(fragments) + ([f.metadata for f in base.get_fragments()] if base else [])
        self.check_unblanked(name, listed)  # a merge lists another version's fragments too
        # not cached: a dataset Lance returns from a commit shares its base's session,
        # whose caches would then hold every version this writer ever committed
        return commit_exactly(
            self.uri(name), schema, base, fragments, self.options, before_write
        ).version

    def write_fragments(self, rows: object, ds: lance.LanceDataset) -> list[FragmentMetadata]:
        """Uncommitted fragments of ``rows`` (a ``pyarrow.Table``) under ``ds``'s schema."""
        return write_fragments(rows, ds, schema=ds.schema, storage_options=self.options)

    def commit_edit(
        self, name: str, schema: object, fragments: list[FragmentMetadata], purge: bool = False
    ) -> int:
        """A new version of table ``name`` listing exactly ``fragments`` under the Lance
        ``schema`` of a changed table (:mod:`treadle.table.evolve`; ``purge``: a purge's
        replacement version, which may list blanked rows)."""
        if not purge:
            self.check_unblanked(name, fragments)
        return commit_edit(self.uri(name), schema, fragments, self.options)

    def check_unblanked(self, name: str, fragments: list[FragmentMetadata]) -> None:
        """:class:`Purged` if a new version of table ``name`` would list rows a purge
        blanked (a write on a branch made from a commit before the purge)."""
        record = self.purge_map(name).blanked([df.path for f in fragments for df in f.files])
        if record is not None:
            err = record.error(record.episodes[0], self.place.name, -1)
            raise Purged(
                f"table {name!r} of project {self.place.name!r}: this write is based on a "
                f"version that held episodes {list(record.episodes)[:5]}, purged by commit "
                f"{record.commit[:8]} ({record.reason!r}); delete_episodes() them first, or "
                "write on a branch made after the purge; nothing was committed",
                episode=err.episode,
                table=name,
                commit=record.commit,
                reason=record.reason,
            )

    # -- protection and cleanup ------------------------------------------------------------
    def protect(self, name: str, version: int) -> None:
        """Tag a committed table version so Lance's cleanup never removes it."""
        # a handle of its own: creating a tag borrows Lance's dataset mutably, and another
        # thread reading the cached handle's schema then fails ("Already mutably borrowed")
        ds = self.load(name, version, f"table {name!r} version {version}")
        with suppress(Exception):  # an existing tag (a retry, or gc got there first) is fine
            ds.tags.create(f"{_TAG}{version}", version)

    def protect_only(
        self, name: str, latest: lance.LanceDataset, versions: set[int], untag: set[str]
    ) -> None:
        """Tag every one of ``versions``; untag the other versions whose tag is in ``untag``
        (the tags gc listed before it re-read the heads: never one a writer made since)."""
        tags = latest.tags.list()
        for v in versions:
            if f"{_TAG}{v}" not in tags:
                self.protect(name, v)
        for tag, info in tags.items():
            if tag.startswith(_TAG) and tag in untag and info["version"] not in versions:
                with suppress(Exception):  # gone already (another gc): fine
                    latest.tags.delete(tag)

    @staticmethod
    def cleanup(ds: lance.LanceDataset, versions: list[int]) -> tuple[int, int]:
        """Lance's cleanup of exactly ``versions`` (untagged ones, never the latest) and the
        files only they use: ``(versions removed, bytes removed)``."""
        stats = ds.cleanup_old_versions(
            older_than=timedelta(0), versions=versions, error_if_tagged_old_versions=False
        )
        return stats.old_versions, stats.bytes_removed

    @staticmethod
    def restore(ds: lance.LanceDataset) -> None:
        """Make the version ``ds`` is at the latest again (a new version equal to it)."""
        ds.restore()

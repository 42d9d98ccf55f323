"""Transactions: stage rows (as uncommitted Lance fragments), then commit them all at once.

A :class:`Transaction` writes each table's new rows as Lance data files that no
version references yet (:mod:`treadle.table.write`), then, for every touched table,
commits a Lance version whose fragment list is exactly "base fragments + new
fragments" (an Append, or an Overwrite listing them; see
:mod:`treadle.table.lancecommit`), and finally moves the branch with one
compare-and-swap. If another writer moved the branch first and changed a table this
transaction also appends to, the new fragments are simply re-listed on top of the
winner's (appends commute): nothing is lost and the order is the order of commits;
a winner that only added columns gives the staged rows their defaults, or nulls
(:mod:`treadle.catalog.rebase`). Anything else (a table created by both with different
schemas, a column renamed or dropped meanwhile) raises :class:`CommitConflict`.

Until the final compare-and-swap nothing is visible; a crash leaves only files no
commit references, which ``treadle gc`` removes.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from treadle import layout
from treadle.catalog.commit import Commit
from treadle.catalog.edits import Change, TableEdits
from treadle.catalog.leases import Borrowed, Lease, mark_used, sweeping
from treadle.catalog.rebase import check_base
from treadle.errors import CommitConflict, NotFound, StorageError, TreadleError
from treadle.names import check_case_apart, check_name
from treadle.table.episode_store import store_episode_index
from treadle.table.lanceerror import lance_error
from treadle.table.table import Table
from treadle.table.tensors import KIND_KEY
from treadle.table.write import StagedTable, episode_rows, rows_to_arrow
from treadle.video import EncodedStream, index_to_arrow

if TYPE_CHECKING:
    import lance

    from treadle.catalog.history import Repository

_MAX_ATTEMPTS = 200


class BranchOf(Protocol):
    """What a :class:`Transaction` uses of its branch (a :class:`treadle.Branch`, which
    makes transactions: this module does not import it)."""

    name: str

    @property
    def project(self) -> Repository: ...


class TableWriter(TableEdits):
    """Stages rows, or column and episode changes (:class:`TableEdits`), for one table
    inside a :class:`Transaction`."""

    def __init__(self, tx: Transaction, name: str):
        self.tx = tx
        self.name = name

    def append(self, data: pa.Table | pa.RecordBatch | dict[str, Any]) -> None:
        """Stage rows: an Arrow table/batch or a dict of equally long columns."""
        table, episodes = rows_to_arrow(data, self.name, self._staging().schema)
        self.tx._stage(self.name, table, episodes)

    @property
    def schema(self) -> pa.Schema | None:
        """The schema rows are staged in (the table's, or fixed by the first rows)."""
        return self._staging().schema

    def use_schema(self, schema: pa.Schema) -> None:
        """Stage every later row in ``schema`` (before any row is staged); rows that do
        not fit raise :class:`SchemaMismatch`, as for an existing table."""
        st = self._staging()
        if st.rows:
            raise TreadleError(f"table {self.name!r}: use_schema after rows were staged")
        st.schema = schema

    def append_episode(
        self,
        columns: dict[str, Any],
        episode: str | None = None,
        fps: float | None = None,
        column_metadata: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> str:
        """Stage one episode; returns its name. Every column has one entry per frame. ``fps``
        sets the table's fps; ``column_metadata``: :mod:`treadle.table.column_meta`."""
        store = partial(self.tx._store_video, self.name)
        table, name = episode_rows(self.name, columns, episode, fps, store, column_metadata)
        self.tx._stage(self.name, table, [name])
        return name

    # -- what treadle.table.handoff uses -------------------------------------------------
    def _staging(self) -> StagedTable:
        return self.tx._staged(self.name)

    def _where(self) -> str:
        return self.tx._where(self.name)

    def _flush(self) -> None:
        self.tx._flush(self.name, self._staging())

    def _media_keys(self) -> list[str]:
        return [k for k, t in self.tx._media.items() if t == self.name]

    def _add_media(self, keys: list[str]) -> None:
        self.tx._media.update(dict.fromkeys(keys, self.name))


class Transaction:
    """Several writes to several tables of one branch, committed as one commit.

    Use ``with branch.transaction("message") as tx:``; on an exception inside the
    block nothing is committed. After the block, ``tx.commit`` is the new commit.
    """

    def __init__(self, branch: BranchOf, message: str):
        self.branch = branch
        self.message = str(message)
        self.project: Repository = branch.project
        head = self.project.refs.head(branch.name)
        if head is None:
            raise NotFound(
                f"branch {branch.name!r} of project {self.project.name!r} does not exist"
            )
        self._base_commit = self.project.load_commit(head.commit_id)
        self._tables: dict[str, StagedTable] = {}
        self.commit: Commit | None = None
        self._done = False
        self._lease: Lease | Borrowed = Lease(self.project.place.store, self.project.prefix)
        self._media: dict[str, str] = {}  # media key this transaction stored -> its table
        self._edited: dict[str, tuple[int, list[str]]] = {}  # table -> (version, changes)

    def table(self, name: str) -> TableWriter:
        check_name(name, "table")
        return TableWriter(self, name)

    def hold(self) -> None:
        """Take (or refresh) this transaction's gc lease now, before anything is staged: gc
        then keeps every unreferenced object newer than it, so files other processes stage
        for it (:func:`treadle.table.handoff.add_staged`) are safe until it ends."""
        self._lease.beat()

    @property
    def lease_key(self) -> str:
        """Where this transaction's gc lease lives (for :meth:`stage_under`)."""
        return self._lease.base

    def stage_under(self, lease_key: str) -> None:
        """Stage under another transaction's gc lease (``lease_key``), taking none of its own.

        For writes staged on behalf of a transaction that is held (:meth:`hold`) in another
        process, which adds them (a Ray task of an import, for its driver): a writer killed
        mid-write leaves no lease that would keep its orphans from gc, and each write first
        checks that lease is still held, raising :class:`TreadleError` once it is gone (the
        holder ended), so nothing is written after. Call it before staging anything.
        """
        if isinstance(self._lease, Lease) and self._lease.held:
            raise TreadleError("stage_under: this transaction already holds its own gc lease")
        self._lease = Borrowed(self.project.place.store, lease_key)

    def close(self) -> None:
        """End without committing: drop the gc lease; what was staged is left to gc (or to
        the transaction that adds it, holding its own lease)."""
        self._done = True
        self._lease.release()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self.commit = self._commit()
        finally:
            self._done = True
            self._lease.release()

    # -- staging -----------------------------------------------------------------------
    def _where(self, name: str) -> str:
        return f"table {name!r} of project {self.project.name!r}"

    def _staged(self, name: str) -> StagedTable:
        if self._done:
            raise TreadleError("transaction is finished")
        if name in self._edited:
            raise TreadleError(
                f"{self._where(name)}: rows appended after its columns or "
                "episodes changed in one transaction; commit them separately"
            )
        st = self._tables.get(name)
        if st is None:
            base_v = self._base_commit.tables.get(name)
            schema = self.project.lance.open(name, base_v).schema if base_v is not None else None
            st = self._tables[name] = StagedTable(schema, base_v)
        return st

    def _stage(self, name: str, table: pa.Table, episodes: list[str]) -> None:
        st = self._staged(name)
        if st.add(table, episodes, self._where(name)):
            self._flush(name, st)

    def _edit_base(self, name: str) -> Table:
        """Table ``name`` as this transaction has changed it so far (no rows staged)."""
        if self._done:
            raise TreadleError("transaction is finished")
        st = self._tables.get(name)
        if st is not None and (st.rows or st.fragments):
            raise TreadleError(
                f"{self._where(name)}: columns or episodes changed after rows "
                "were appended in one transaction; commit them separately"
            )
        version = self._edited.get(name, (self._base_commit.tables.get(name), []))[0]
        if version is None:
            raise NotFound(
                f"{self._where(name)} does not exist at commit "
                f"{self._base_commit.short_id} (branch {self.branch.name!r})"
            )
        return Table(self.project, name, version, None)

    def _apply_edit(self, name: str, kind: str, change: Change) -> bool:
        """Commit the Lance version ``change`` makes of the table as changed so far (no
        branch moves until the transaction commits); False when it changed nothing."""
        table = self._edit_base(name)
        lance = self.project.lance
        self._lease.beat()
        edited = change(lance.open(name, table.version), self._lease.beat)
        if edited is None:
            return False
        try:
            version = lance.commit_edit(name, edited.schema, edited.fragments)
        except OSError as e:
            raise lance_error(
                e, f"committing {self._where(name)} (nothing was committed)"
            ) from None
        kinds = self._edited.get(name, (0, []))[1]
        self._edited[name] = (version, [*kinds, kind])
        return True

    def _flush(self, name: str, st: StagedTable) -> None:
        lance, base = self.project.lance, st.base_version
        target = lance.uri(name) if base is None else lance.open(name, base)
        st.write(target, lance.options, self._where(name), self._lease.beat)

    def _store_video(
        self, table: str, column: str, stream: EncodedStream
    ) -> tuple[pa.Field, pa.Array]:
        digest = hashlib.sha256(stream.data).hexdigest()
        key = layout.media_key(table, digest)
        schema = self._staged(table).schema  # an older table's column may lack colour tags
        like = schema.field(column).type if schema is not None and column in schema.names else None
        where = f"table {table!r} column {column!r}"
        arr = index_to_arrow(key, stream, like=like, where=where)  # checked before storing
        store, prefix = self.project.place.store, self.project.prefix
        self._lease.beat()
        full = layout.under(prefix, key)
        if not store.put(full, stream.data, if_absent=True):
            # content-addressed: maybe an old orphan; its age for gc restarts now, and a gc
            # deleting now either reads this marker or is seen below (see leases.py)
            mark_used(store, prefix, full)
            if sweeping(store, prefix):  # a gc may be deleting it: store a copy of our own
                key = layout.media_key(table, digest, f"-{self._lease.id[:16]}")
                full = layout.under(prefix, key)
                store.put(full, stream.data)
                arr = index_to_arrow(key, stream, like=like, where=where)
            elif store.missing([full]):  # a gc that has ended took it before our marker
                store.put(full, stream.data)
        self._media[full] = table
        return pa.field(column, arr.type, metadata={KIND_KEY: b"video"}), arr

    # -- commit ------------------------------------------------------------------------
    def _commit(self) -> Commit | None:
        for name, st in self._tables.items():
            self._flush(name, st)
        touched = {n: st for n, st in self._tables.items() if st.fragments}
        if not touched and not self._edited:
            return None
        project, refs = self.project, self.project.refs
        versions: dict[str, int] = {}
        bases: dict[str, int | None] = {n: st.base_version for n, st in touched.items()}
        for attempt in range(_MAX_ATTEMPTS):
            head = refs.head(self.branch.name)
            assert head is not None
            head_commit = project.load_commit(head.commit_id)
            for name, st in touched.items():
                now = head_commit.tables.get(name)
                if now is None:
                    check_case_apart(name, head_commit.tables, "table", f"project {project.name!r}")
                if now != bases[name] or name not in versions:
                    versions[name] = self._version(name, st, now, head.commit_id)
                    bases[name] = now
                    stored = store_episode_index(project, name, versions[name], now)
                    project.lance.episode_names.remember(name, stored)
            self._check_edited(head_commit, versions)
            tables = dict(head_commit.tables)
            tables.update(versions)
            changes = {n: ["append"] for n in touched}
            changes.update({n: kinds for n, (_, kinds) in self._edited.items()})
            commit = Commit.create(
                [head.commit_id], self.message, tables, changes, head_commit.time
            )
            self._check_staged(touched)
            project.save_commit(commit)
            if refs.try_advance(self.branch.name, head.seq + 1, commit.id):
                for name, v in versions.items():
                    project.lance.protect(name, v)
                return commit
            time.sleep(random.uniform(0.0, min(0.5, 0.01 * 2 ** min(attempt, 6))))
        raise CommitConflict(
            f"could not move branch {self.branch.name!r} of project {project.name!r} after "
            f"{_MAX_ATTEMPTS} attempts (too many concurrent writers); nothing was committed"
        )

    def _check_edited(self, head: Commit, versions: dict[str, int]) -> None:
        """Changed tables go in as changed, unless another commit changed them since."""
        for name, (version, kinds) in self._edited.items():
            if head.tables.get(name) != self._base_commit.tables.get(name):
                raise CommitConflict(
                    f"{self._where(name)} was changed by commit {head.short_id} while this "
                    f"transaction made its changes ({', '.join(kinds)}); nothing was "
                    "committed: retry them on the new head"
                )
            if name not in versions:
                base = self._base_commit.tables.get(name)
                stored = store_episode_index(self.project, name, version, base)
                self.project.lance.episode_names.remember(name, stored)
            versions[name] = version

    def _version(self, name: str, st: StagedTable, now: int | None, head_id: str) -> int:
        """The Lance version of table ``name`` holding version ``now`` + ``st``'s rows."""
        project = self.project
        ds = None if now is None else project.lance.open(name, now)
        if ds is not None:
            check_base(project, ds, st, name, head_id, self._lease.beat)
        try:
            return _lance_commit(project, name, st, ds, self._lease.beat)
        except OSError as e:
            where = f"committing table {name!r} of project {project.name!r}"
            raise lance_error(e, f"{where} (nothing was committed)") from None

    def _check_staged(self, touched: dict[str, StagedTable]) -> None:
        """Every object this transaction staged still exists (else a gc took this writer
        for dead: its lease unrenewed for longer than the lease TTL): never move the branch
        to a commit that names a missing file."""
        self._lease.beat()
        prefix = self.project.prefix
        owner = dict(self._media)
        for name, st in touched.items():
            for frag in st.fragments:
                for df in frag.files:
                    owner[f"{layout.table_key(prefix, name)}/data/{df.path}"] = name
        gone = self.project.place.store.missing(list(owner))
        if gone:
            raise StorageError(
                f"table {owner[gone[0]]!r} of project {self.project.name!r}: "
                f"{gone[0][len(prefix) + 1 :]}, written by this transaction, was deleted "
                f"before its commit ({len(gone)} object(s); gc took this writer for dead: was "
                "its process stalled for longer than the gc lease TTL, 5 minutes?); nothing "
                "was committed"
            )


def _lance_commit(
    project: Repository,
    name: str,
    st: StagedTable,
    base: lance.LanceDataset | None,
    before_write: Callable[[], None],
) -> int:
    """The Lance version of one table for a commit (the seam fault tests break)."""
    return project.lance.commit(name, st.schema, base, st.fragments, before_write)

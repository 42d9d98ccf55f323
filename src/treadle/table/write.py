"""Writes: stage rows (as uncommitted Lance fragments), then commit them all at once.

A :class:`Transaction` writes each table's new rows as Lance data files that no
version references yet, then, for every touched table, commits a Lance version
whose fragment list is exactly "base fragments + new fragments" (an Append, or an
Overwrite listing them; see :mod:`treadle.table.lancecommit`), and
finally moves the branch with one compare-and-swap. If another writer moved the
branch first and changed a table this transaction also appends to, the new
fragments are simply re-listed on top of the winner's (appends commute): nothing
is lost and the order is the order of commits. Anything else (a table created by
both with different schemas) raises :class:`CommitConflict`.

Until the final compare-and-swap nothing is visible; a crash leaves only files no
commit references, which ``treadle gc`` removes.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import FragmentMetadata, write_fragments

from treadle.catalog.commit import Commit
from treadle.catalog.leases import Lease, mark_used
from treadle.errors import AlreadyExists, CommitConflict, SchemaMismatch, StorageError, TreadleError
from treadle.names import check_name
from treadle.storage import lance_error
from treadle.table.episode_store import store_episode_index
from treadle.table.episodes import EPISODE, FRAME, episode_runs
from treadle.table.fps import episode_fps, schema_fps, with_fps
from treadle.table.lancecommit import commit_exactly
from treadle.table.tensors import (
    KIND_KEY,
    column_from_values,
    conform,
    normalise_column,
    schema_difference,
)

if TYPE_CHECKING:
    from treadle.catalog.client import Branch

_FLUSH_BYTES = 64 << 20
_MAX_ATTEMPTS = 200


@dataclass
class _Staged:
    schema: pa.Schema | None
    base_version: int | None
    pending: list[pa.Table] = field(default_factory=list)
    pending_bytes: int = 0
    fragments: list[FragmentMetadata] = field(default_factory=list)
    rows: int = 0
    episodes: set[str] = field(default_factory=set)  # names of the episodes staged


class TableWriter:
    """Stages rows for one table inside a :class:`Transaction`."""

    def __init__(self, tx: Transaction, name: str):
        self.tx = tx
        self.name = name

    def append(self, data: pa.Table | pa.RecordBatch | dict[str, Any]) -> None:
        """Stage rows: an Arrow table/batch or a dict of equally long columns."""
        staged = self.tx._staged(self.name)
        table = _to_arrow(data, self.name)
        for col in table.column_names:
            check_name(col, "column")
        names: list[str] = []
        if EPISODE in table.column_names or (staged.schema and EPISODE in staged.schema.names):
            names = _episode_names(table, self.name)
        self.tx._stage(self.name, table, names)

    @property
    def schema(self) -> pa.Schema | None:
        """The schema rows are staged in (the table's, or fixed by the first rows)."""
        return self.tx._staged(self.name).schema

    def use_schema(self, schema: pa.Schema) -> None:
        """Stage every later row in ``schema`` (before any row is staged); rows that do
        not fit raise :class:`SchemaMismatch`, as for an existing table."""
        st = self.tx._staged(self.name)
        if st.rows:
            raise TreadleError(f"table {self.name!r}: use_schema after rows were staged")
        st.schema = schema

    def append_episode(
        self, columns: dict[str, Any], episode: str | None = None, fps: float | None = None
    ) -> str:
        """Stage one episode; returns its name. Every column has one entry per frame.
        ``fps`` (or a video column's rate) sets the table's fps (:mod:`treadle.table.fps`)."""
        if not isinstance(columns, dict) or not columns:
            raise SchemaMismatch(
                f"append_episode to {self.name!r}: give a non-empty dict of columns"
            )
        for col in columns:
            check_name(col, "column")
            if col in (EPISODE, FRAME):
                raise SchemaMismatch(
                    f"append_episode to {self.name!r}: {col!r} is set by treadle, not by you"
                )
        if episode is None:
            episode = f"ep-{uuid.uuid4().hex[:12]}"
        if not isinstance(episode, str) or not episode or any(ord(c) < 32 for c in episode):
            raise SchemaMismatch(f"episode name must be a non-empty printable string: {episode!r}")
        encoded = {c: _encode_video(v) for c, v in columns.items() if _is_video_value(v)}
        lengths = {
            c: encoded[c].meta.num_frames if c in encoded else _length(v)
            for c, v in columns.items()
        }
        known = {c: n for c, n in lengths.items() if n is not None}
        if not known:
            raise SchemaMismatch(f"append_episode to {self.name!r}: no column has a length")
        if len(set(known.values())) != 1:
            raise SchemaMismatch(
                f"append_episode to {self.name!r}, episode {episode!r}: columns have different "
                f"numbers of frames: {known}"
            )
        n = next(iter(known.values()))
        if n < 1:
            raise SchemaMismatch(f"episode {episode!r} of {self.name!r} has no frames")
        fields = [pa.field(EPISODE, pa.string()), pa.field(FRAME, pa.int32())]
        arrays: list[pa.Array] = [
            pa.array([episode] * n, pa.string()),
            pa.array(np.arange(n, dtype=np.int32)),
        ]
        for col, value in columns.items():
            if col in encoded:
                f, a = self.tx._store_video(self.name, col, encoded[col])
            elif lengths[col] is None:
                f, a = column_from_values(col, [value] * n, n)
            else:
                f, a = column_from_values(col, value, n)
            fields.append(f)
            arrays.append(a)
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        where = f"table {self.name!r}, episode {episode!r}"
        rate = episode_fps(fps, {c: v.meta.fps for c, v in encoded.items()}, where)
        if rate is not None:
            table = table.replace_schema_metadata(with_fps(table.schema, rate, where).metadata)
        self.tx._stage(self.name, table, [episode])
        return episode


class Transaction:
    """Several writes to several tables of one branch, committed as one commit.

    Use ``with branch.transaction("message") as tx:``; on an exception inside the
    block nothing is committed. After the block, ``tx.commit`` is the new commit.
    """

    def __init__(self, branch: Branch, message: str):
        self.branch = branch
        self.message = str(message)
        self.project = branch.project
        head = self.project.refs.head(branch.name)
        if head is None:
            from treadle.errors import NotFound

            raise NotFound(
                f"branch {branch.name!r} of project {self.project.name!r} does not exist"
            )
        self._base_commit = self.project.load_commit(head.commit_id)
        self._tables: dict[str, _Staged] = {}
        self.commit: Commit | None = None
        self._done = False
        self._lease = Lease(self.project.client.store, self.project.prefix)  # holds off gc
        self._media: dict[str, str] = {}  # media key this transaction stored -> its table

    def table(self, name: str) -> TableWriter:
        check_name(name, "table")
        return TableWriter(self, name)

    def hold(self) -> None:
        """Take (or refresh) this transaction's gc lease now, before anything is staged.

        gc then keeps every unreferenced object newer than it, so files other
        processes stage for it (:meth:`TableWriter.add_staged`) are safe until it ends.
        """
        self._lease.beat()

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
    def _staged(self, name: str) -> _Staged:
        if self._done:
            raise TreadleError("transaction is finished")
        st = self._tables.get(name)
        if st is None:
            base_v = self._base_commit.tables.get(name)
            schema = self.project.open_dataset(name, base_v).schema if base_v is not None else None
            st = self._tables[name] = _Staged(schema, base_v)
        return st

    def _stage(self, name: str, table: pa.Table, episodes: list[str]) -> None:
        st = self._staged(name)
        where = f"table {name!r} of project {self.project.name!r}"
        if st.schema is None:
            st.schema = table.schema
        else:
            fps = schema_fps(table.schema)
            if fps is not None:  # the first write naming an fps sets it; another is refused
                st.schema = with_fps(st.schema, fps, where)
            table = conform(table, st.schema, where)
        again = sorted(st.episodes.intersection(episodes))
        if again:
            raise AlreadyExists(
                f"{where}: episode {again[0]!r} is written twice in this transaction; "
                "episode names must be unique in a table"
            )
        st.episodes.update(episodes)
        st.pending.append(table)
        st.pending_bytes += table.nbytes
        st.rows += table.num_rows
        if st.pending_bytes >= _FLUSH_BYTES:
            self._flush(name, st)

    def _flush(self, name: str, st: _Staged) -> None:
        if not st.pending:
            return
        data = pa.concat_tables(st.pending)
        st.pending, st.pending_bytes = [], 0
        self._lease.beat()
        try:
            frags = write_fragments(
                data,
                self.project.table_uri(name),
                schema=st.schema,
                storage_options=self.project.client.store.lance_options,
            )
        except OSError as e:
            if "different schema" not in str(e):
                where = f"writing table {name!r} of project {self.project.name!r}"
                raise lance_error(e, f"{where} (nothing was committed)") from None
            raise CommitConflict(
                f"table {name!r} of project {self.project.name!r} was created by another "
                f"writer with a different schema ({str(e).splitlines()[0][:200]}); "
                "nothing was committed"
            ) from None
        st.fragments.extend(frags)

    def _store_video(self, table: str, column: str, stream: Any) -> tuple[pa.Field, pa.Array]:
        from treadle.video import index_to_arrow

        digest = hashlib.sha256(stream.data).hexdigest()
        key = f"media/{table}/{digest}.h264"
        schema = self._staged(table).schema  # an older table's column may lack colour tags
        like = schema.field(column).type if schema is not None and column in schema.names else None
        arr = index_to_arrow(key, stream, like=like, where=f"table {table!r} column {column!r}")
        store, full = self.project.client.store, f"{self.project.prefix}/{key}"
        self._lease.beat()
        if not store.put(full, stream.data, if_absent=True):
            # content-addressed: maybe an old orphan; its age for gc restarts now
            mark_used(store, self.project.prefix, full)
            if store.missing([full]):  # gc took it between the two calls
                store.put(full, stream.data)
        self._media[full] = table
        return pa.field(column, arr.type, metadata={KIND_KEY: b"video"}), arr

    # -- commit ------------------------------------------------------------------------
    def _commit(self) -> Commit | None:
        for name, st in self._tables.items():
            self._flush(name, st)
        touched = {n: st for n, st in self._tables.items() if st.fragments}
        project, refs = self.project, self.project.refs
        if not touched:
            return None
        versions: dict[str, int] = {}
        bases: dict[str, int | None] = {n: st.base_version for n, st in touched.items()}
        for attempt in range(_MAX_ATTEMPTS):
            head = refs.head(self.branch.name)
            assert head is not None
            head_commit = project.load_commit(head.commit_id)
            for name, st in touched.items():
                now = head_commit.tables.get(name)
                if now != bases[name] or name not in versions:
                    ds = None if now is None else project.open_dataset(name, now)
                    if ds is not None:
                        _check_base(ds, st, name, project.name, head.commit_id)
                    try:
                        versions[name] = _lance_commit(
                            project.table_uri(name),
                            st.schema,
                            ds,
                            st.fragments,
                            project.client.store.lance_options,
                            self._lease.beat,
                        )
                    except OSError as e:
                        where = f"committing table {name!r} of project {project.name!r}"
                        raise lance_error(e, f"{where} (nothing was committed)") from None
                    bases[name] = now
                    store_episode_index(project, name, versions[name], now)
            tables = dict(head_commit.tables)
            tables.update(versions)
            commit = Commit.create([head.commit_id], self.message, tables)
            self._check_staged(touched)
            project.save_commit(commit)
            if refs.try_advance(self.branch.name, head.seq + 1, commit.id):
                for name, v in versions.items():
                    project.protect_version(name, v)
                return commit
            time.sleep(random.uniform(0.0, min(0.5, 0.01 * 2 ** min(attempt, 6))))
        raise CommitConflict(
            f"could not move branch {self.branch.name!r} of project {project.name!r} after "
            f"{_MAX_ATTEMPTS} attempts (too many concurrent writers); nothing was committed"
        )

    def _check_staged(self, touched: dict[str, _Staged]) -> None:
        """Every object this transaction staged still exists (else gc, forced to a grace
        shorter than this transaction, took it): never move the branch to a commit that
        names a missing file."""
        self._lease.beat()
        prefix = self.project.prefix
        owner = dict(self._media)
        for name, st in touched.items():
            for frag in st.fragments:
                for df in frag.files:
                    owner[f"{prefix}/tables/{name}.lance/data/{df.path}"] = name
        gone = self.project.client.store.missing(list(owner))
        if gone:
            raise StorageError(
                f"table {owner[gone[0]]!r} of project {self.project.name!r}: "
                f"{gone[0][len(prefix) + 1 :]}, written by this transaction, was deleted "
                f"before its commit ({len(gone)} object(s); was gc run with a grace shorter "
                "than this transaction?); nothing was committed"
            )


def _check_base(ds: Any, st: _Staged, name: str, project: str, commit_id: str) -> None:
    """The rows of ``st`` can go on top of ``ds`` (the table at the branch head): same
    schema, tensor shapes included, and none of the same episode names."""
    where = f"table {name!r} of project {project!r} (commit {commit_id[:8]})"
    diff = schema_difference(ds.schema, st.schema)
    if diff is not None:
        raise CommitConflict(
            f"{where} was written by another writer with a different schema: {diff}; "
            "nothing was committed"
        )
    if st.episodes and EPISODE in ds.schema.names:
        # every episode has one frame 0: filtering on it reads the small frame column and
        # only the episode names, not every row's name
        have = ds.to_table(columns=[EPISODE], filter=f"{FRAME} = 0").column(EPISODE)
        wanted = pa.array(sorted(st.episodes), have.type)
        hit = pc.filter(have, pc.is_in(have, value_set=wanted))
        if len(hit):
            raise AlreadyExists(
                f"{where} already has episode {hit[0].as_py()!r}; episode names must be "
                "unique in a table; nothing was committed"
            )


def _lance_commit(
    uri: str,
    schema: pa.Schema,
    base: Any,
    fragments: list[FragmentMetadata],
    options: dict | None,
    before_write: Callable[[], None],
) -> int:
    """The Lance version of one table for a commit (the seam fault tests break)."""
    return commit_exactly(uri, schema, base, fragments, options, before_write)


def _to_arrow(data: Any, name: str) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        fields, arrays = [], []
        for f, col in zip(data.schema, data.columns):
            f, a = normalise_column(f, col)
            fields.append(f)
            arrays.append(a)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, data.schema.metadata))
    if isinstance(data, dict):
        if not data:
            raise SchemaMismatch(f"append to {name!r}: no columns given")
        fields, arrays = [], []
        n = None
        for col, values in data.items():
            check_name(col, "column")
            f, a = column_from_values(col, values, n)
            n = len(a)
            fields.append(f)
            arrays.append(a)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    raise SchemaMismatch(
        f"append to {name!r}: give a pyarrow Table or a dict of columns, got {type(data).__name__}"
    )


def _episode_names(table: pa.Table, name: str) -> list[str]:
    """The episodes of appended rows, checked: names, contiguous frames 0..len-1."""
    for col in (EPISODE, FRAME):
        if col not in table.column_names:
            raise SchemaMismatch(f"append to time-indexed table {name!r}: missing {col!r} column")
    where = f"append to table {name!r}"
    return episode_runs(table.column(EPISODE), table.column(FRAME), where, SchemaMismatch).names


def _is_video_value(value: Any) -> bool:
    mod = type(value).__module__
    return mod.startswith("treadle.video")


def _encode_video(value: Any) -> Any:
    from treadle.video import encode_value

    return encode_value(value)


def _length(value: Any) -> int | None:
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return None  # a per-episode constant, repeated for every frame
    try:
        return len(value)
    except TypeError:
        return None

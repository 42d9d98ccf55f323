"""Writes: stage rows (as uncommitted Lance fragments), then commit them all at once.

A :class:`Transaction` writes each table's new rows as Lance data files that no
version references yet, then, for every touched table, commits a Lance version
whose fragment list is exactly "base fragments + new fragments" (an Overwrite), and
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from treadle.catalog.commit import Commit
from treadle.errors import CommitConflict, SchemaMismatch, TreadleError
from treadle.names import check_name
from treadle.storage import lance_error
from treadle.table.table import EPISODE, FRAME
from treadle.table.tensors import KIND_KEY, column_from_values, conform

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
        if EPISODE in table.column_names or (staged.schema and EPISODE in staged.schema.names):
            _check_episode_runs(table, self.name)
        self.tx._stage(self.name, table)

    def append_episode(self, columns: dict[str, Any], episode: str | None = None) -> str:
        """Stage one episode; returns its name. Every column has one entry per frame."""
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
        self.tx._stage(self.name, pa.Table.from_arrays(arrays, schema=pa.schema(fields)))
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

    def table(self, name: str) -> TableWriter:
        check_name(name, "table")
        return TableWriter(self, name)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit = self._commit()
        self._done = True

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

    def _stage(self, name: str, table: pa.Table) -> None:
        st = self._staged(name)
        where = f"table {name!r} of project {self.project.name!r}"
        if st.schema is None:
            st.schema = table.schema
        else:
            table = conform(table, st.schema, where)
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
        from treadle.video import index_to_arrow, video_struct_type

        digest = hashlib.sha256(stream.data).hexdigest()
        key = f"media/{table}/{digest}.h264"
        self.project.client.store.put(f"{self.project.prefix}/{key}", stream.data, if_absent=True)
        arr = index_to_arrow(key, stream)
        return pa.field(column, video_struct_type(), metadata={KIND_KEY: b"video"}), arr

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
                    base_frags: list[FragmentMetadata] = []
                    if now is not None:
                        ds = project.open_dataset(name, now)
                        if not _same_schema(ds.schema, st.schema):
                            raise CommitConflict(
                                f"table {name!r} of project {project.name!r} was changed by "
                                f"commit {head.commit_id[:8]} with a different schema while this "
                                "transaction was writing; nothing was committed"
                            )
                        base_frags = [f.metadata for f in ds.get_fragments()]
                    try:
                        versions[name] = _lance_overwrite(
                            project.table_uri(name),
                            st.schema,
                            base_frags + st.fragments,
                            project.client.store.lance_options,
                        )
                    except OSError as e:
                        where = f"committing table {name!r} of project {project.name!r}"
                        raise lance_error(e, f"{where} (nothing was committed)") from None
                    bases[name] = now
            tables = dict(head_commit.tables)
            tables.update(versions)
            commit = Commit.create([head.commit_id], self.message, tables)
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


def _same_schema(a: pa.Schema, b: pa.Schema | None) -> bool:
    return b is not None and a.equals(b, check_metadata=False)


def _lance_overwrite(
    uri: str, schema: pa.Schema, fragments: list[FragmentMetadata], options: dict | None
) -> int:
    last: Exception | None = None
    for _ in range(100):
        try:
            latest: int | None = lance.dataset(uri, storage_options=options).version
        except ValueError:
            latest = None
        try:
            ds = lance.LanceDataset.commit(
                uri,
                lance.LanceOperation.Overwrite(schema, fragments),
                read_version=latest,
                storage_options=options,
            )
            return ds.version
        except Exception as e:  # Lance raises CommitConflictError (and OSError on races)
            if "onflict" not in str(e) and "already exists" not in str(e):
                raise
            last = e
            time.sleep(random.uniform(0.0, 0.05))
    raise CommitConflict(f"Lance commit of {uri} kept conflicting: {last}")


def _to_arrow(data: Any, name: str) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
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


def _check_episode_runs(table: pa.Table, name: str) -> None:
    if FRAME not in table.column_names:
        raise SchemaMismatch(f"append to time-indexed table {name!r}: missing 'frame' column")
    frames = table.column(FRAME).to_numpy()
    if frames.size == 0:
        return
    ok = frames[0] == 0 and np.all((np.diff(frames) == 1) | (frames[1:] == 0))
    if not ok:
        raise SchemaMismatch(
            f"append to {name!r}: 'frame' must run 0, 1, 2, ... within each episode, starting at 0"
        )


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

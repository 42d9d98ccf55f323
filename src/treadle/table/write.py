"""Staging rows of one table: Arrow conversion, schema checks and Lance data files.

What a write hands over (an Arrow table, a dict of columns, one episode's columns) is
turned into Arrow rows in the table's schema here, and a :class:`StagedTable` keeps the
rows staged for one table: in memory up to ``_FLUSH_BYTES``, then written out as Lance
data files that no version references yet (``lance.fragment.write_fragments``).

Nothing here knows branches or commits: the catalog's
:class:`~treadle.catalog.transaction.Transaction` stages through this module and then
commits the fragments (a Lance version, then one branch move).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from treadle.errors import AlreadyExists, CommitConflict, SchemaMismatch, VideoError
from treadle.names import check_name, reserved_column_reason
from treadle.table.column_meta import with_column_metadata
from treadle.table.episodes import EPISODE, FRAME, episode_runs
from treadle.table.fps import episode_fps, schema_fps, with_fps
from treadle.table.frame_sizes import with_frame_sizes
from treadle.table.image_sizes import with_image_sizes
from treadle.table.lanceerror import lance_error
from treadle.table.null_columns import with_nulls
from treadle.table.off_grid import merge_off_grid, with_off_grid
from treadle.table.tensors import column_from_values, conform, normalise_column
from treadle.video.encode import encode_value
from treadle.video.geometry import check_geometry
from treadle.video.stream import EncodedStream
from treadle.video.values import VideoFile, VideoFrames

_FLUSH_BYTES = 64 << 20

#: How a video column's stream is stored: ``(column, encoded stream) -> (field, array)``
#: of the column (the caller keeps the stream's bytes, the table the stream's index).
StoreVideo = Callable[[str, EncodedStream], tuple[pa.Field, pa.Array]]


@dataclass
class StagedTable:
    """The rows staged for one table: a schema, rows in memory, written fragments."""

    schema: pa.Schema | None
    base_version: int | None
    pending: list[pa.Table] = field(default_factory=list)
    pending_bytes: int = 0
    fragments: list[FragmentMetadata] = field(default_factory=list)
    rows: int = 0
    episodes: set[str] = field(default_factory=set)  # names of the episodes staged

    def add(self, table: pa.Table, episodes: list[str], where: str) -> bool:
        """Stage ``table`` (conformed to the schema) holding ``episodes``; True when the
        rows in memory should be written out (:meth:`write`)."""
        fresh = self.schema is None  # these rows create the table: record every video size
        if self.schema is None:
            self.schema = table.schema
        else:
            fps = schema_fps(table.schema)
            if fps is not None:  # the first write naming an fps sets it; another is refused
                self.schema = with_fps(self.schema, fps, where)
            self.schema = merge_off_grid(self.schema, table.schema)
            table = conform(table, self.schema, where)
        self.schema = with_nulls(with_image_sizes(self.schema, table, where), table)
        self.schema = with_frame_sizes(self.schema, table, fresh)
        self.check_new_episodes(episodes, where)
        self.episodes.update(episodes)
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        self.rows += table.num_rows
        return self.pending_bytes >= _FLUSH_BYTES

    def check_new_episodes(self, episodes: set[str] | list[str], where: str) -> None:
        """:class:`AlreadyExists` if one of ``episodes`` is staged already."""
        again = sorted(self.episodes.intersection(episodes))
        if again:
            raise AlreadyExists(
                f"{where}: episode {again[0]!r} is written twice in this transaction; "
                "episode names must be unique in a table"
            )

    def write(
        self,
        target: str | lance.LanceDataset,
        options: dict | None,
        where: str,
        before_write: Callable[[], None],
    ) -> None:
        """Write the rows in memory as Lance data files of ``target`` (a uri, or the
        opened base version: then Lance does not look up the latest) no version lists yet.

        ``before_write`` runs first (a transaction's gc lease). ``where`` names the table
        ("table 't' of project 'p'"); a table another writer created with a different
        schema is a :class:`CommitConflict`, any other failure mapped by :func:`lance_error`.
        """
        if not self.pending:
            return
        data = pa.concat_tables(self.pending)
        self.pending, self.pending_bytes = [], 0
        before_write()
        try:
            frags = write_fragments(data, target, schema=self.schema, storage_options=options)
        except OSError as e:
            if "different schema" not in str(e):
                raise lance_error(e, f"writing {where} (nothing was committed)") from None
            raise CommitConflict(
                f"{where} was created by another writer with a different schema "
                f"({str(e).splitlines()[0][:200]}); nothing was committed"
            ) from None
        self.fragments.extend(frags)


def rows_to_arrow(data: Any, name: str, staged_schema: pa.Schema | None) -> tuple[pa.Table, list]:
    """Appended rows of table ``name`` as Arrow, and the episodes they hold (checked:
    names, contiguous frames 0..len-1) when the rows or the table are time-indexed."""
    table = _to_arrow(data, name)
    for col in table.column_names:
        check_name(col, "column")
        if col not in (EPISODE, FRAME):
            check_not_reserved(col, f"append to table {name!r}")
    names: list[str] = []
    if EPISODE in table.column_names or (staged_schema and EPISODE in staged_schema.names):
        names = _episode_names(table, name)
    return table, names


def check_not_reserved(column: str, where: str) -> None:
    """:class:`SchemaMismatch` if ``column`` is a name batches reserve for their own keys."""
    why = reserved_column_reason(column)
    if why is not None:
        raise SchemaMismatch(
            f"{where}: column {column!r} has a reserved name ({why}); rename it (importers "
            "take rename={...}); nothing was written"
        )


def episode_rows(
    name: str,
    columns: dict[str, Any],
    episode: str | None,
    fps: float | None,
    store_video: StoreVideo,
    column_metadata: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[pa.Table, str]:
    """One episode of table ``name`` as Arrow rows (``episode`` and ``frame`` added), and
    its name (a new one when ``episode`` is None). Every column has one entry per frame,
    or is one value repeated; video values are encoded and stored by ``store_video``.
    ``fps`` (or a video column's rate) goes into the schema (:mod:`treadle.table.fps`);
    ``column_metadata`` into the columns' fields (:mod:`treadle.table.column_meta`)."""
    _check_episode_columns(name, columns, column_metadata)
    if episode is None:
        episode = f"ep-{uuid.uuid4().hex[:12]}"
    if not isinstance(episode, str) or not episode or any(ord(c) < 32 for c in episode):
        raise SchemaMismatch(f"episode name must be a non-empty printable string: {episode!r}")
    encoded = {
        c: _encode_video(name, episode, c, v) for c, v in columns.items() if _is_video_value(v)
    }
    lengths = {
        c: encoded[c].meta.num_frames if c in encoded else _length(v) for c, v in columns.items()
    }
    n = _episode_length(name, episode, lengths)
    fields = [pa.field(EPISODE, pa.string()), pa.field(FRAME, pa.int32())]
    arrays: list[pa.Array] = [
        pa.array([episode] * n, pa.string()),
        pa.array(np.arange(n, dtype=np.int32)),
    ]
    for col, value in columns.items():
        if col in encoded:
            f, a = store_video(col, encoded[col])
        elif lengths[col] is None:
            f, a = column_from_values(col, [value] * n, n)
        else:
            f, a = column_from_values(col, value, n)
        if column_metadata and col in column_metadata:
            f = with_column_metadata(f, column_metadata[col], f"table {name!r}, column {col!r}")
        fields.append(f)
        arrays.append(a)
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    where = f"table {name!r}, episode {episode!r}"
    rate = episode_fps(fps, {c: v.meta.fps for c, v in encoded.items()}, where)
    schema = table.schema if rate is None else with_fps(table.schema, rate, where)
    for col, stream in encoded.items():  # streams whose frames are not shown at k / fps
        schema = with_off_grid(schema, col, stream.meta.grid_deviation_s, episode)
    if schema.metadata != table.schema.metadata:
        table = table.replace_schema_metadata(schema.metadata)
    return table, episode


def _encode_video(name: str, episode: str, column: str, value: Any) -> EncodedStream:
    """``value`` encoded (or remuxed), refused unless every frame decodes to the size its
    index records (:func:`treadle.video.geometry.check_geometry`); errors name the table,
    episode and column."""
    where = f"table {name!r}, episode {episode!r}, column {column!r}"
    try:
        stream = encode_value(value)
    except VideoError as e:
        raise VideoError(f"{where}: {e}") from None
    check_geometry(stream, where)
    return stream


def _check_episode_columns(name: str, columns: Any, column_metadata: Any = None) -> None:
    if not isinstance(columns, dict) or not columns:
        raise SchemaMismatch(f"append_episode to {name!r}: give a non-empty dict of columns")
    extra = sorted(set(column_metadata or {}) - set(columns))
    if extra:
        raise SchemaMismatch(
            f"append_episode to {name!r}: column_metadata names columns the episode does not "
            f"have: {extra}"
        )
    for col in columns:
        check_name(col, "column")
        check_not_reserved(col, f"append_episode to table {name!r}")
        if col in (EPISODE, FRAME):
            raise SchemaMismatch(
                f"append_episode to {name!r}: {col!r} is set by treadle, not by you"
            )


def _episode_length(name: str, episode: str, lengths: dict[str, int | None]) -> int:
    """The episode's number of frames: the length every column with one agrees on."""
    known = {c: n for c, n in lengths.items() if n is not None}
    if not known:
        raise SchemaMismatch(f"append_episode to {name!r}: no column has a length")
    if len(set(known.values())) != 1:
        raise SchemaMismatch(
            f"append_episode to {name!r}, episode {episode!r}: columns have different "
            f"numbers of frames: {known}"
        )
    n = next(iter(known.values()))
    if n < 1:
        raise SchemaMismatch(f"episode {episode!r} of {name!r} has no frames")
    return n


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
    return isinstance(value, (VideoFrames, VideoFile, EncodedStream))


def _length(value: Any) -> int | None:
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return None  # a per-episode constant, repeated for every frame
    try:
        return len(value)
    except TypeError:
        return None

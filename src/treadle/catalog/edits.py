"""Changes to a table's columns and episodes inside a transaction (one commit each).

:class:`TableEdits` is what a :class:`~treadle.catalog.transaction.TableWriter` can do
beside appending: add a column, annotate spans, update values, rename and drop
columns, delete episodes, compact. Each checks everything first (a named error, nothing
written), then hands the transaction a function of the table's Lance version that
returns the changed version (:mod:`treadle.table.evolve`): no row moves, no video media
object is read or written, and added or updated columns write only their own bytes.
"""

from __future__ import annotations

import reprlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from treadle.errors import AlreadyExists, NotFound, SchemaMismatch, TreadleError
from treadle.names import check_name
from treadle.plan.reserved import reserved
from treadle.table import evolve
from treadle.table.casts import exact_cast
from treadle.table.defaults import NO_DEFAULT, added_field, is_added
from treadle.table.episodes import EPISODE, FRAME
from treadle.table.image_sizes import IMAGES_KEY, images_updated, recorded_images
from treadle.table.labels import per_episode, per_moment, spans
from treadle.table.null_columns import recorded_nulls
from treadle.table.tensors import is_video, tensor_shape
from treadle.video.image_decode import image_header

if TYPE_CHECKING:
    import lance

    from treadle.table.table import Table

#: A change of one table version: ``(dataset, before_write) -> Edited`` (None: no change).
Change = Callable[[Any, Callable[[], None]], "evolve.Edited | None"]


class EditsOf(Protocol):
    """What :class:`TableEdits` uses of its transaction (a
    :class:`~treadle.catalog.transaction.Transaction`, which imports this module)."""

    def _where(self, name: str) -> str: ...

    def _edit_base(self, name: str) -> Table: ...

    def _apply_edit(self, name: str, kind: str, change: Change) -> bool: ...

    @property
    def project(self) -> Any: ...


class TableEdits:
    """Column and episode changes of one table in a transaction (mixed into its writer)."""

    name: str
    tx: EditsOf

    def _table(self) -> Table:
        return self.tx._edit_base(self.name)

    def _where(self) -> str:
        return self.tx._where(self.name)

    def _new_column(
        self, table: Table, column: str, hint: str = "use update() to change its values"
    ) -> None:
        check_name(column, "column")
        if reserved(column) or column in (EPISODE, FRAME):
            raise SchemaMismatch(
                f"{self._where()}: column name {column!r} is reserved (names starting with "
                "'_' or ending with _is_pad, _dim_mask, _is_present; episode, frame); "
                "nothing was written"
            )
        if column in table.schema.names:
            raise AlreadyExists(
                f"{self._where()} already has column {column!r} ({hint}); nothing was written"
            )

    def add_column(
        self,
        column: str,
        values: Any = None,
        *,
        fn: Callable[[dict[str, Any]], Any] | None = None,
        columns: Sequence[str] | None = None,
        default: Any = NO_DEFAULT,
        executor: Any = None,
        batch_rows: int = 4096,
        progress: bool | None = None,
    ) -> None:
        """Add column ``column``: ``values`` one per moment (table order) or a mapping of
        episode names to one value each, or ``fn`` over ``columns`` in batches
        (:mod:`treadle.catalog.computed`). ``default=`` fills the episodes a mapping leaves
        out, and the rows of later appends that lack the column (else null)."""
        table = self._table()
        self._new_column(table, column)
        where = f"{self._where()}, column {column!r}"
        if (fn is None) == (values is None):
            raise SchemaMismatch(f"{where}: give values (per moment or per episode) or fn=")
        if fn is not None:
            from treadle.catalog.computed import computed_column

            field, arr = computed_column(
                table,
                column,
                fn,
                columns,
                executor,
                batch_rows,
                progress,
                self.tx.project.address(),
                where,
            )
        elif isinstance(values, Mapping):
            field, arr = per_episode(column, table.episodes(), values, default, where)
        else:
            field, arr = per_moment(column, values, table.num_moments, where)
        self._add(column, field, arr, default, where)

    def _add(self, column: str, field: pa.Field, arr: pa.Array, default: Any, where: str) -> None:
        if pa.types.is_null(arr.type):
            raise SchemaMismatch(f"{where}: every value is None: the column's type is unknown")
        try:
            field = added_field(field, default)
        except SchemaMismatch as e:
            why = str(e).removeprefix(f"column {column!r}: ")
            raise SchemaMismatch(f"{where}: {why}; nothing was written") from None
        self.tx._apply_edit(self.name, f"add_column {column}", lambda ds, _: evolve.add_column(
            ds, field, arr))  # fmt: skip

    def annotate(
        self,
        column: str,
        labels: Mapping[str, Sequence[tuple[Any, Any, Any]]],
        *,
        frames: bool = False,
        default: Any = NO_DEFAULT,
    ) -> None:
        """Add column ``column`` from spans ``{episode: [(start_s, end_s, value), ...]}``:
        frame ``f`` takes a span's value when ``start_s <= f / fps < end_s`` (exact);
        ``frames=True`` gives spans in frames. Other moments hold ``default`` or null."""
        table = self._table()
        self._new_column(table, column)
        where = f"{self._where()}, column {column!r}"
        if not isinstance(labels, Mapping):
            raise SchemaMismatch(f"{where}: give spans as {{episode: [(start, end, value)]}}")
        field, arr = spans(column, table.episodes(), labels, table.fps, frames, default, where)
        if pa.types.is_null(arr.type) and not any(len(v) for v in labels.values()):
            raise SchemaMismatch(
                f"{where}: no spans were given ({reprlib.repr(dict(labels))}): give "
                "{episode: [(start, end, value), ...]}; nothing was written"
            )
        self._add(column, field, arr, default, where)

    def update(self, values: Mapping[str, Any], where: str | None = None) -> int:
        """Set columns to values (``{column: value}``) on the rows a Lance SQL ``where``
        keeps (every row without one); only those columns of the fragments holding such
        rows are written. Returns the rows matched (0: a warning, nothing written)."""
        table = self._table()
        here = self._where()
        if not isinstance(values, Mapping) or not values:
            raise SchemaMismatch(f"{here}: update takes {{column: value}}")
        for col in values:
            self._existing(table, col, "update")
            field = table.schema.field(col)
            if col in (EPISODE, FRAME) or is_video(field):
                raise SchemaMismatch(f"{here}: column {col!r} cannot be updated")
            _check_image_value(table, col, values[col], f"{here}: column {col!r}")
            if values[col] is None and not _may_hold_null(table, field):
                raise SchemaMismatch(  # a batch cannot hold it, and no plan would look for it
                    f"{here}: column {col!r} holds no null values (a batch cannot hold one): "
                    "set a value, or delete those rows; nothing was written"
                )
        try:
            rows = table.matching_rows(where)
        except ValueError as e:  # Lance: a where that does not parse, an unknown column
            if isinstance(e, TreadleError):
                raise
            first = str(e).split(", /")[0]  # without the path into Lance's Rust sources
            raise SchemaMismatch(f"{here}: where={where!r}: {first}; nothing was written") from None
        if not len(rows):
            warnings.warn(f"{here}: where={where!r} matches no row; nothing was written",
                          stacklevel=3)  # fmt: skip
            return 0
        for col, value in values.items():
            typ = table.schema.field(col).type
            new = _one_value(
                value, typ, f"{here}: value {reprlib.repr(value)} for column {col!r} of type {typ}"
            )
            records = _updated_images(table, col, value, rows)
            self.tx._apply_edit(self.name, f"update {col}", _replace(col, new, rows, records))
        return len(rows)

    def _existing(self, table: Table, col: str, what: str) -> None:
        if col not in table.schema.names:
            raise NotFound(
                f"{self._where()} has no column {col!r} to {what}; columns: "
                f"{table.schema.names}; nothing was written"
            )

    def rename_columns(self, names: Mapping[str, str]) -> None:
        """Rename columns (``{old: new}``); no data is written."""
        table = self._table()
        for old, new in names.items():
            self._existing(table, old, "rename")
            if old in (EPISODE, FRAME):
                raise SchemaMismatch(f"{self._where()}: column {old!r} cannot be renamed")
            self._new_column(table, new, f"rename {old!r} to a name it does not have")
        if len(set(names.values())) != len(names):
            raise SchemaMismatch(f"{self._where()}: two columns renamed to one name")
        kind = "rename_columns " + ",".join(f"{a}->{b}" for a, b in names.items())
        renamed = dict(names)
        self.tx._apply_edit(self.name, kind, lambda ds, _: evolve.rename_columns(ds, renamed))

    def drop_columns(self, names: Sequence[str]) -> None:
        """Drop columns from this version on (older versions keep them)."""
        table = self._table()
        for col in names:
            self._existing(table, col, "drop")
            if col in (EPISODE, FRAME):
                raise SchemaMismatch(f"{self._where()}: column {col!r} cannot be dropped")
        data = [c for c in table.schema.names if c not in (EPISODE, FRAME)]
        if set(names) >= set(data):
            raise SchemaMismatch(
                f"{self._where()}: dropping {sorted(names)} would leave no data column (a "
                "table keeps at least one beside episode and frame); nothing was written"
            )
        dropped = list(names)
        kind = "drop_columns " + ",".join(dropped)
        self.tx._apply_edit(self.name, kind, lambda ds, _: evolve.drop_columns(ds, dropped))

    def delete_episodes(self, episodes: Sequence[str]) -> None:
        """Remove episodes from this version on. Their media stay while a retained commit
        reaches them (``gc`` removes them after); the name may be appended again."""
        table = self._table()
        if isinstance(episodes, str):
            episodes = [episodes]
        episodes = list(dict.fromkeys(episodes))  # a name given twice is one episode
        if not episodes:
            warnings.warn(f"{self._where()}: no episodes to delete; nothing was written",
                          stacklevel=3)  # fmt: skip
            return
        if not table.is_time_indexed:
            raise SchemaMismatch(f"{self._where()} has no episodes (no episode/frame columns)")
        index = table.episodes()
        at = {n: i for i, n in enumerate(index.names)}
        for ep in episodes:
            if ep not in at:
                raise NotFound(f"{self._where()} has no episode {ep!r}; nothing was written")
        drop = np.zeros(table.num_moments, bool)
        for ep in episodes:
            s = int(index.starts[at[ep]])
            drop[s : s + int(index.lengths[at[ep]])] = True
        kind = f"delete_episodes {len(episodes)}"
        self.tx._apply_edit(self.name, kind, _delete(drop, episodes))

    def compact(self) -> bool:
        """Write each fragment spread over several data files after edits again as one
        (same rows, order and values); False when there was nothing to do."""
        self._table()
        return self.tx._apply_edit(self.name, "compact", lambda ds, w: evolve.compact(ds, w))


def _check_image_value(table: Table, col: str, value: Any, where: str) -> None:
    """A column of images (as its writes recorded) takes only an image td.Video reads
    beside the others: a null or other bytes would stop a run at the step that draws it."""
    recorded = recorded_images(table.schema).get(col)
    if recorded is None:
        return
    if value is None or not isinstance(value, (bytes, bytearray, memoryview)):
        raise SchemaMismatch(
            f"{where} holds images that td.Video reads: {reprlib.repr(value)} is not one "
            "(delete the episode, or leave its moments out of a plan with where=); "
            "nothing was written"
        )
    head = image_header(value, f"{where}, the new value")  # CorruptData: not an image
    depth16 = recorded.get("depth16")
    if depth16 is not None and head.depth16 != depth16:
        bits = "16-bit" if depth16 else "8-bit"
        raise SchemaMismatch(f"{where} holds {bits} images; the new value is not one; "
                             "nothing was written")  # fmt: skip
    sizes = {(w, h) for w, h, _ in recorded.get("sizes") or []}
    if not recorded.get("more") and (head.width, head.height) not in sizes:
        have = ", ".join(f"{w}x{h}" for w, h in sorted(sizes))
        raise SchemaMismatch(
            f"{where} holds images of {have}; the new value is {head.width}x{head.height} "
            "(resize it to one of them); nothing was written"
        )


def _one_value(value: Any, typ: pa.DataType, where: str) -> pa.Array:
    """``value`` as a one-element array of ``typ`` (None: null), never a changed value."""
    if value is None:
        return pa.nulls(1, typ)
    try:
        return exact_cast(pa.array([value]), typ, where, "")
    except (pa.ArrowException, TypeError, ValueError) as e:
        if isinstance(e, SchemaMismatch):
            raise
        raise SchemaMismatch(f"{where}: it is not a value of that type ({e})") from None


def _by_fragment(ds: lance.LanceDataset, rows: np.ndarray) -> dict[int, np.ndarray]:
    """Row positions grouped by fragment (position in the list) as fragment offsets."""
    ends = np.cumsum(evolve.fragment_rows(ds))
    which = np.searchsorted(ends, rows, side="right")
    out: dict[int, np.ndarray] = {}
    for i in np.unique(which):
        start = 0 if i == 0 else int(ends[i - 1])
        out[int(i)] = rows[which == i] - start
    return out


def _updated_images(table: Table, col: str, value: Any, rows: np.ndarray) -> dict[str, str]:
    """The image record once ``value`` is written into ``rows`` of ``col``: the rows'
    episodes hold its size too (else a delete of the size's listed episodes drops it)."""
    if col not in recorded_images(table.schema) or not table.is_time_indexed:
        return {}
    head = image_header(value, f"{table.name}, column {col!r}")
    idx = table.episodes()
    which = np.unique(np.searchsorted(np.asarray(idx.starts), rows, side="right") - 1)
    names = [idx.names[int(i)] for i in which]
    text = images_updated(table.schema, col, head.width, head.height, names)
    return {} if text is False else {IMAGES_KEY.decode(): str(text)}


def _replace(col: str, value: pa.Array, rows: np.ndarray, records: dict[str, str | None]) -> Change:
    def change(ds: lance.LanceDataset, _: Callable[[], None]) -> evolve.Edited:
        new = {}
        frags = ds.get_fragments()
        for i, offsets in _by_fragment(ds, rows).items():
            old = frags[i].to_table(columns=[col]).column(col).combine_chunks()
            take = np.arange(len(old), dtype=np.int64)
            take[offsets] = len(old)  # the one new value, after the old ones
            new[i] = pa.concat_arrays([old, value.cast(old.type)]).take(pa.array(take))
        edited = evolve.replace_column(ds, col, new)
        return evolve.Edited(evolve.schema_with(ds, records), edited.fragments)

    return change


def _delete(drop: np.ndarray, episodes: list[str]) -> Change:
    def change(ds: lance.LanceDataset, before_write: Callable[[], None]) -> evolve.Edited:
        parts, at = {}, 0
        for i, n in enumerate(evolve.fragment_rows(ds)):
            if drop[at : at + n].any():
                parts[i] = drop[at : at + n]
            at += n
        return evolve.delete_rows(ds, parts, before_write, episodes)

    return change


def _may_hold_null(table: Table, field: pa.Field) -> bool:
    """Whether ``update`` may set ``field`` to null: a plan looks for nulls there (an added
    column, or one a write recorded a null in), or a batch holds it as a list (text, bytes),
    not as a tensor."""
    if is_added(field) or field.name in recorded_nulls(table.schema):
        return True
    return not (tensor_shape(field) or pa.types.is_integer(field.type)
                or pa.types.is_floating(field.type) or pa.types.is_boolean(field.type))  # fmt: skip

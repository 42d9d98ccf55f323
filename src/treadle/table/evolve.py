"""Changing a table version's columns and rows without moving a row or rewriting a frame.

Each function takes an opened Lance version and returns an :class:`Edited`: the schema
(a Lance schema, whose field ids the data files name) and the fragment list of the
changed version, which the caller commits exactly as it is
(:func:`treadle.table.lancecommit.commit_edit`). Nothing here commits.

- **add a column**: per fragment, one new data file holding only the new column
  (Lance's ``merge_columns`` fed from memory, so no stored column is read). Bytes
  written: the new column's.
- **replace a column's values** (``update``): per fragment that has a changed row, one
  new data file holding only that column under the *same* field id, and the field's
  entry in the old data file marked -2 (Lance's tombstone). Row positions, other
  columns and untouched fragments stay as they were. (Lance's own ``update()`` deletes
  the rows and appends them rewritten whole, at the end: it moves rows.)
- **rename / drop columns**: the schema only (the same Lance operations run on an empty
  scratch dataset to produce it); no data file is written.
- **delete rows**: each fragment holding a deleted row is written again without them
  (its columns, not the media objects video columns point at); what the schema records
  of the deleted episodes (off-grid videos, image sizes) leaves with them. Fragments never carry
  Lance deletion files: a deletion file would switch off the mapped reads and cannot be
  listed by the explicit commits other branches make.
- **added columns for staged rows**: rows staged against a version before an
  ``add_column`` get, per fragment, a data file of the added columns' defaults (or nulls).
- **compact**: each fragment spread over several data files after edits is written
  again as one file, values unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from treadle.errors import TreadleError
from treadle.table.defaults import default_column
from treadle.table.schema_records import records_without, renamed_records

_BATCH_ROWS = 65536  # rows per record batch handed to Lance
_TOMBSTONE = -2  # Lance's field id of a column a data file still holds but no longer serves
_SCRATCH = "__treadle_new_values"


@dataclass(frozen=True)
class Edited:
    """A changed table version, not committed: its Lance schema and fragments."""

    schema: Any  # lance.schema.LanceSchema
    fragments: list[FragmentMetadata]


def fragment_rows(ds: lance.LanceDataset) -> list[int]:
    """Rows of each fragment of ``ds``, in order (its fragments carry no deletions)."""
    return [f.metadata.physical_rows - f.metadata.num_deletions for f in ds.get_fragments()]


def _reader(field: pa.Field, values: pa.Array) -> pa.RecordBatchReader:
    schema = pa.schema([field])
    batches = [
        pa.record_batch([values.slice(i, _BATCH_ROWS)], schema=schema)
        for i in range(0, len(values), _BATCH_ROWS)
    ] or [pa.record_batch([values], schema=schema)]
    return pa.RecordBatchReader.from_batches(schema, batches)


def add_column(ds: lance.LanceDataset, field: pa.Field, values: pa.Array) -> Edited:
    """``ds`` with column ``field`` added, ``values`` in row order (one per row)."""
    frags = ds.get_fragments()
    _no_deletions(frags)
    metas, schema, at = [], None, 0
    for frag in frags:
        n = frag.metadata.physical_rows
        meta, schema = frag.merge_columns(_reader(field, values.slice(at, n)))
        metas.append(meta)
        at += n
    if schema is None or at != len(values):
        raise ValueError(f"add_column: {len(values)} values for {at} rows")
    return Edited(schema, metas)


def defaults_for(
    ds: lance.LanceDataset,
    staged: list[FragmentMetadata],
    columns: list[str],
    before_write: Callable[[], None],
) -> list[FragmentMetadata]:
    """Fragments staged against an older version, given ``ds``'s added ``columns``: per
    fragment one more data file holding only those columns, each its default or null
    (an append rebased on a version that added columns). Bytes written: those columns'."""
    fields = [ds.schema.field(c) for c in columns]
    schema = pa.schema(fields)
    out = []
    for meta in staged:
        n = meta.physical_rows
        data = pa.Table.from_arrays([default_column(f, n) for f in fields], schema=schema)
        before_write()
        written = write_fragments(data, ds, schema=schema, max_rows_per_file=1 << 30)
        if len(written) != 1 or written[0].physical_rows != n:
            raise TreadleError(f"writing {columns} for a staged fragment of {n} rows failed")
        out.append(dataclasses.replace(meta, files=[*meta.files, *written[0].files]))
    return out


def _field_ids(field: Any) -> list[int]:
    """The Lance field id of ``field`` and of its children, depth first."""
    ids = [field.id()]
    for child in field.children():
        ids.extend(_field_ids(child))
    return ids


def replace_column(ds: lance.LanceDataset, name: str, new_values: dict[int, pa.Array]) -> Edited:
    """``ds`` with column ``name`` of fragment ``i`` (its position in the fragment list)
    holding ``new_values[i]`` (every row of it); other fragments unchanged."""
    frags = ds.get_fragments()
    _no_deletions(frags)
    old_ids = _field_ids(ds.lance_schema.field(name))
    typ = ds.schema.field(name).type
    metas = []
    for i, frag in enumerate(frags):
        if i not in new_values:
            metas.append(frag.metadata)
            continue
        scratch = pa.field(_SCRATCH, typ)
        meta, schema = frag.merge_columns(_reader(scratch, new_values[i].cast(typ)))
        new_ids = _field_ids(schema.field(_SCRATCH))
        to_old = dict(zip(new_ids, old_ids, strict=True))
        files = []
        for df in meta.files[:-1]:
            df = copy.copy(df)
            df.fields = [_TOMBSTONE if f in old_ids else f for f in df.fields]
            if any(f != _TOMBSTONE for f in df.fields):  # a file serving nothing is dropped
                files.append(df)
        written = copy.copy(meta.files[-1])
        written.fields = [to_old[f] for f in written.fields]
        files.append(written)
        metas.append(dataclasses.replace(frag.metadata, files=files))
    return Edited(ds.lance_schema, metas)


def _scratch_schema(ds: lance.LanceDataset, change: Callable[[lance.LanceDataset], None]) -> Any:
    """The Lance schema ``change`` makes of ``ds``'s, run on an empty local copy."""
    with tempfile.TemporaryDirectory(prefix="treadle-schema-") as d:
        lance.LanceDataset.commit(d, lance.LanceOperation.Overwrite(ds.lance_schema, []))
        # a new dataset's first version numbers its fields 0..n-1: after a drop, the next
        # rename or drop then named another column's data (the dropped one's) by a field;
        # an overwrite of an existing dataset keeps the ids it is given
        op = lance.LanceOperation.Overwrite(ds.lance_schema, [])
        scratch = lance.LanceDataset.commit(d, op, read_version=1)
        change(scratch)
        return lance.dataset(d).lance_schema


def _with_records(change: Callable[[Any], None], records: dict[str, str | None]) -> Callable:
    """``change``, then the schema metadata's records of the columns it renames or drops."""

    def run(s: Any) -> None:
        change(s)
        if records:
            s.update_schema_metadata(records)

    return run


def rename_columns(ds: lance.LanceDataset, names: dict[str, str]) -> Edited:
    """``ds`` with columns renamed (``{old: new}``), what the version records of them
    renamed too; data files unchanged."""
    alter = [{"path": old, "name": new} for old, new in names.items()]
    records = renamed_records(ds.schema, names)
    schema = _scratch_schema(ds, _with_records(lambda s: s.alter_columns(*alter), records))
    return Edited(schema, [f.metadata for f in ds.get_fragments()])


def drop_columns(ds: lance.LanceDataset, names: list[str]) -> Edited:
    """``ds`` without ``names`` nor what the version records of them; data files unchanged
    (compact() leaves the bytes out)."""
    records = renamed_records(ds.schema, dict.fromkeys(names))
    schema = _scratch_schema(ds, _with_records(lambda s: s.drop_columns(list(names)), records))
    return Edited(schema, [f.metadata for f in ds.get_fragments()])


def schema_with(ds: lance.LanceDataset, records: dict[str, str | None]) -> Any:
    """``ds``'s Lance schema with its schema metadata entries ``records`` changed (None:
    removed), field ids kept."""
    if not records:
        return ds.lance_schema
    return _scratch_schema(ds, lambda s: s.update_schema_metadata(records))


def schema_without(ds: lance.LanceDataset, episodes: Iterable[str]) -> Any:
    """``ds``'s Lance schema once ``episodes`` are deleted or purged: what it records of
    them gone (:func:`~treadle.table.schema_records.records_without`), field ids kept."""
    return schema_with(ds, records_without(ds.schema, episodes))


def delete_rows(
    ds: lance.LanceDataset,
    drop: dict[int, np.ndarray],
    before_write: Callable[[], None],
    episodes: Iterable[str] = (),
) -> Edited:
    """``ds`` without the rows ``drop[i]`` (bool, one per row) marks in fragment ``i``:
    each such fragment written again without them; rows keep their order. ``episodes``:
    the episodes deleted, whose entries leave the schema's records."""
    metas: list[FragmentMetadata] = []
    for i, frag in enumerate(ds.get_fragments()):
        if i not in drop:
            metas.append(frag.metadata)
            continue
        keep = frag.to_table().filter(pa.array(~drop[i]))
        if keep.num_rows:
            before_write()
            metas.extend(write_fragments(keep, ds, schema=ds.schema, max_rows_per_file=1 << 30))
    return Edited(schema_without(ds, episodes), metas)


def spread(meta: FragmentMetadata) -> bool:
    """Whether a fragment's columns lie over several data files (or carry deletions)."""
    return (
        len(meta.files) > 1
        or meta.deletion_file is not None
        or any(f == _TOMBSTONE for df in meta.files for f in df.fields)
    )


def compact(ds: lance.LanceDataset, before_write: Callable[[], None]) -> Edited | None:
    """``ds`` with each fragment spread over several data files written again as one
    (same rows, same order, same values); None when there is none."""
    frags = ds.get_fragments()
    if not any(spread(f.metadata) for f in frags):
        return None
    metas: list[FragmentMetadata] = []
    for frag in frags:
        if not spread(frag.metadata):
            metas.append(frag.metadata)
            continue
        before_write()
        data = frag.to_table()
        metas.extend(write_fragments(data, ds, schema=ds.schema, max_rows_per_file=1 << 30))
    return Edited(ds.lance_schema, metas)


def _no_deletions(frags: list[Any]) -> None:
    for f in frags:
        if f.metadata.deletion_file is not None:
            raise TreadleError(
                f"fragment {f.fragment_id} carries a Lance deletion file (written outside "
                "treadle); compact() the table first; nothing was written"
            )

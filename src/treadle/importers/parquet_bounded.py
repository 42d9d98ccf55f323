"""Parquet record batches whose memory does not grow with what a dictionary repeats.

A parquet column may be dictionary-encoded: each distinct value stored once, each row an
index into them (run-length encoded, so a run of one index takes a few bytes). Read as a
plain column, every row gets its own copy: a 3 KB file whose one 1 MB value is repeated on
1,000 rows became a 1 GB batch (and a 100 MB value, 100 GB). Binary and string columns are
read here as dictionaries, and each batch is cut into slices of at most ``budget`` decoded
bytes (a single row may still be as large as one value) before its values are copied out,
so memory stays bounded while the values delivered are the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from treadle.errors import CorruptData, UnsafeInput
from treadle.importers.arrow import DEFAULT_CHUNK_BYTES
from treadle.importers.parquet_pages import (
    MAX_PAGE_BYTES,
    check_pages,
    file_reader,
    page_spans,
    pages,
    row_values,
)

#: default ``max_row_bytes``: the most one row of a parquet file's list columns may make the
#: reader hold (its values at their width, with their levels), however few bytes store it
MAX_ROW_BYTES = 1 << 30


def _is_bytes(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_string(t)
        or (pa.types.is_large_string(t))
    )


@dataclass(frozen=True)
class Limits:
    """What one parquet file may make the reader hold (see :func:`bounded_batches`)."""

    max_page_bytes: int = MAX_PAGE_BYTES
    max_row_bytes: int = MAX_ROW_BYTES


def bounded_batches(
    open_: Any,
    batch_rows: int,
    budget: int = DEFAULT_CHUNK_BYTES,
    where: str = "parquet file",
    limits: Limits = Limits(),
) -> Iterator[pa.RecordBatch]:
    """The record batches of a parquet file (``open_()`` gives a fresh handle to it), of at
    most ``batch_rows`` rows and, beyond one row, ``budget`` bytes of binary and string
    values; the schema is the file's own (its metadata kept).

    Before anything is decoded, a page over ``limits.max_page_bytes`` is refused (from the
    page headers), and so is a row of a list column holding more than
    ``limits.max_row_bytes`` (its values counted from the pages' repetition levels, each
    counted at its type's width, a string at its dictionary page's size); a row group whose
    lists are long is read in fewer rows a batch."""
    check_pages(open_(), where, limits.max_page_bytes)
    file = pq.ParquetFile(open_())
    schema, meta = file.schema_arrow, file.metadata
    names = [f.name for f in schema if _is_bytes(f.type)]
    for g in range(meta.num_row_groups):
        # only a chunk whose pages all hold dictionary indices: pyarrow's dictionary of
        # plain values grows over the row group's batches (its distinct values, all held)
        indexed = [n for n in names if _indexed(open_, meta, g, n, where)]
        pf = pq.ParquetFile(open_(), read_dictionary=indexed) if indexed else file
        rows = _group_rows(open_, meta, g, batch_rows, budget, where, limits)
        rows = _plain_rows(open_, meta, g, rows, budget, where, set(indexed))
        for batch in pf.iter_batches(batch_size=rows, row_groups=[g]):
            yield from _slices(batch, schema, names, budget)


def _indexed(open_: Any, meta: Any, g: int, name: str, where: str) -> bool:
    """Whether top-level column ``name`` holds only dictionary indices in row group ``g``."""
    c = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == name)
    chunk = meta.row_group(g).column(c)
    if not chunk.has_dictionary_page:
        return False
    at = f"{where}: column {name!r}, row group {g}"
    return bool(page_spans(file_reader(open_()), chunk, at)[2].all())


def _group_rows(
    open_: Any, meta: Any, g: int, batch_rows: int, budget: int, where: str, limits: Limits
) -> int:
    """Rows a batch of row group ``g``: ``batch_rows``, fewer when its lists are long."""
    group = meta.row_group(g)
    repeated = [
        c for c in range(group.num_columns) if meta.schema.column(c).max_repetition_level > 0
    ]
    widths = {
        c: _leaf_width(open_, group.column(c), meta.schema.column(c), where) for c in repeated
    }
    if sum(group.column(c).num_values * widths[c] for c in repeated) <= budget:
        return batch_rows  # the whole row group's lists fit: no row can hold more
    row = 0
    for c in repeated:
        at = f"{where}: column {group.column(c).path_in_schema!r}, row group {g}"
        most = row_values(open_(), g, c, at)
        row += most * widths[c]
        if most * widths[c] > limits.max_row_bytes:
            raise UnsafeInput(
                f"{at}: a row holds {most:,} values, {most * widths[c]:,} bytes read, more "
                f"than max_row_bytes={limits.max_row_bytes:,}; raise max_row_bytes if you "
                "trust it"
            )
    return max(1, min(batch_rows, budget // max(row, 1)))


def _plain_rows(
    open_: Any, meta: Any, g: int, rows: int, budget: int, where: str, strings: set[str]
) -> int:
    """``rows`` or fewer, so that no batch of row group ``g`` decodes more than ``budget``
    bytes (one row at least) from the pages of its columns that are not repeated.

    A page states what it decompresses to, and a page of a column that is not repeated holds
    one value a row: a batch holds at most the pages it overlaps (values compressed away,
    a few bytes of zstd a 1 MB value, are counted at their size). A page of dictionary
    indices counts its rows at the value's width (a string column is read as a dictionary
    and cut by its values' sizes after)."""
    group = meta.row_group(g)
    read = file_reader(open_())
    spans = []
    for c in range(group.num_columns):
        leaf, chunk = meta.schema.column(c), group.column(c)
        if leaf.max_repetition_level > 0:
            continue
        at = f"{where}: column {chunk.path_in_schema!r}, row group {g}"
        counts, sizes, indexed = page_spans(read, chunk, at)
        width = 4 if chunk.path_in_schema in strings else _leaf_width(open_, chunk, leaf, at)
        sizes = np.where(indexed, counts * width, sizes + counts * 2)
        spans.append(
            (np.concatenate([[0], np.cumsum(counts)]), np.concatenate([[0], np.cumsum(sizes)]))
        )
    # the most any window of ``rows`` rows overlaps is reached by one starting on a page's
    # last row (moving a start right only drops a page there): those starts are enough,
    # however many rows the footer claims
    starts = np.unique(np.concatenate([[0]] + [b[1:] - 1 for b, _ in spans]))
    starts = starts[(starts >= 0) & (starts < group.num_rows)]
    while rows > 1:
        total = np.zeros(len(starts), np.int64)
        for bounds, cum in spans:
            lo = np.searchsorted(bounds, starts, side="right") - 1
            hi = np.searchsorted(bounds, starts + rows, side="left")
            total += cum[np.minimum(hi, len(cum) - 1)] - cum[np.clip(lo, 0, len(cum) - 1)]
        if total.max(initial=0) <= budget:
            break
        rows //= 2
    return rows


def _leaf_width(open_: Any, chunk: Any, leaf: Any, where: str) -> int:
    """Bytes the reader holds for one value of a leaf column: its width and two levels; a
    dictionary-encoded string, its dictionary page's size (the largest a value may be)."""
    if chunk.physical_type != "BYTE_ARRAY":
        width = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT96": 12}.get(chunk.physical_type, 8)
        if chunk.physical_type == "FIXED_LEN_BYTE_ARRAY":
            width = max(1, leaf.length or 0)
        return width + 4
    if not chunk.has_dictionary_page:
        return 16 + 4  # plain strings are in the pages themselves: bounded by their size
    first = next(pages(file_reader(open_()), chunk, where), None)
    return (first.size if first is not None and first.kind == 2 else 16) + 8


def _slices(
    batch: pa.RecordBatch, schema: pa.Schema, names: list[str], budget: int
) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of at most ``budget`` decoded bytes (one row at least), each with
    its dictionary columns decoded to the file's own types."""
    n = batch.num_rows
    sizes = np.zeros(n, np.int64)
    for name in names:
        col = batch.column(name)
        if isinstance(col, pa.DictionaryArray):
            lengths = pc.take(pc.binary_length(col.dictionary), col.indices)
        else:
            lengths = pc.binary_length(col)
        sizes += lengths.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes)
    start = 0
    while start < n:
        before = int(ends[start - 1]) if start else 0
        end = max(start + 1, int(np.searchsorted(ends, before + budget, side="right")))
        yield _decoded(batch.slice(start, end - start), schema)
        start = end


def _decoded(piece: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    arrays = []
    for field, col in zip(schema, piece.columns):
        if isinstance(col, pa.DictionaryArray) and not pa.types.is_dictionary(field.type):
            col = col.dictionary_decode().cast(field.type)
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def check_footer(handle: Any, where: str, rows: int, values_per_row: int) -> None:
    """Refuse, from its footer alone, a parquet file read whole that would hold more than
    ``rows`` rows or ``values_per_row`` values a row (leaf values: a list of 6 floats is 6).

    Parquet's run-length encoding lets a few bytes stand for a billion rows or list entries,
    and the reader stops at the count the footer states: so it bounds what reading allocates.
    """
    meta = pq.ParquetFile(handle).metadata
    if meta.num_rows > rows:
        raise CorruptData(f"{where} holds {meta.num_rows:,} rows; its episodes have {rows:,}")
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.num_values > max(group.num_rows, 1) * values_per_row:
                raise CorruptData(
                    f"{where}: column {chunk.path_in_schema!r} holds {chunk.num_values:,} values "
                    f"in {group.num_rows:,} rows (row group {g}), over the {values_per_row:,} a "
                    "row the features of meta/info.json allow"
                )


def _width(t: pa.DataType) -> int:
    """Bytes a value of a fixed-width type takes (8 for a variable-width one: its offset)."""
    try:
        return max(1, t.bit_width // 8)
    except ValueError:
        return 8


def read_columns(
    raw: bytes, where: str, columns: Sequence[str], limit: int, option: str
) -> pa.Table:
    """The scalar ``columns`` (those the file has, no others) of a parquet file held in
    ``raw``, refused (:class:`UnsafeInput` naming ``option``) when their values would take
    more than ``limit`` bytes: fixed-width values counted from the footer's row count,
    binary and string values from their dictionary, before they are decoded (a dictionary
    lets a few KB repeat a 1 MB value on a million rows). A nested column is
    :class:`CorruptData` (its values are not counted by rows)."""
    schema = pq.read_schema(pa.BufferReader(raw))
    fields = [schema.field(c) for c in columns if c in schema.names]
    for f in fields:
        if pa.types.is_nested(f.type):
            raise CorruptData(f"{where}: column {f.name!r} is {f.type}, not a single value a row")
    strings = [f.name for f in fields if _is_bytes(f.type)]
    check_pages(pa.BufferReader(raw), where, limit, option, [f.name for f in fields])
    pf = pq.ParquetFile(pa.BufferReader(raw), read_dictionary=strings)
    rows = pf.metadata.num_rows
    fixed = rows * sum(_width(f.type) for f in fields)
    if fixed > limit:
        raise UnsafeInput(
            f"{where} holds {rows:,} rows: {fixed:,} bytes in columns {[f.name for f in fields]}, "
            f"more than {option}={limit:,}; raise {option} if you trust it"
        )
    table = pf.read(columns=[f.name for f in fields])
    for f in fields:
        if f.name not in strings:
            continue
        col = table.column(f.name)
        size = sum(
            pc.sum(pc.take(pc.binary_length(c.dictionary), c.indices)).as_py() or 0
            for c in col.chunks
        )
        fixed += size
        if fixed > limit:
            raise UnsafeInput(
                f"{where}: column {f.name!r} holds {size:,} bytes of values, more than "
                f"{option}={limit:,} with the other columns; raise {option} if you trust it"
            )
        table = table.set_column(table.schema.get_field_index(f.name), f, col.cast(f.type))
    return table

"""Columns added after a table was written: nullable, or with a stored default.

A column :meth:`TableRef.add_column <treadle.TableRef.add_column>` adds carries field
metadata ``treadle:added`` (and ``treadle:default``, the JSON of its default when one was
given), so a writer that keeps appending rows without it goes on working: its rows get
the default, or null.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import SchemaMismatch
from treadle.table.casts import exact_cast

ADDED_KEY = b"treadle:added"
DEFAULT_KEY = b"treadle:default"
NO_DEFAULT = object()


def added_field(field: pa.Field, default: Any = NO_DEFAULT) -> pa.Field:
    """``field`` marked as added (nullable), with ``default`` stored when given."""
    meta = dict(field.metadata or {})
    meta[ADDED_KEY] = b"1"
    if default is not NO_DEFAULT:
        if isinstance(default, np.generic):  # np.float32(0), np.False_: their plain value
            default = default.item()
        try:
            meta[DEFAULT_KEY] = json.dumps(default).encode()
        except (TypeError, ValueError):
            raise SchemaMismatch(
                f"column {field.name!r}: default {default!r} is not a plain value (a number, "
                "string, bool or None) that can be stored with the table"
            ) from None
        _check_default(field, json.loads(meta[DEFAULT_KEY]))
    return field.with_nullable(True).with_metadata(meta)


def _check_default(field: pa.Field, value: Any) -> None:
    """A default every later append can store: of the column's type, exactly (else each
    append without the column would fail on it)."""
    if value is None:
        return
    try:
        exact_cast(pa.array([value]), field.type, f"column {field.name!r}: default {value!r}")
    except (pa.ArrowException, TypeError, ValueError) as e:
        if isinstance(e, SchemaMismatch):
            raise
        raise SchemaMismatch(
            f"column {field.name!r}: default {value!r} is not a value of its type {field.type}"
        ) from None


def default_of(field: pa.Field) -> Any:
    """The stored default of an added column (None: null)."""
    raw = (field.metadata or {}).get(DEFAULT_KEY)
    return None if raw is None else json.loads(raw)


def is_added(field: pa.Field) -> bool:
    """Whether ``field`` is a column added after the table was written."""
    return ADDED_KEY in (field.metadata or {})


def default_column(field: pa.Field, rows: int) -> pa.Array:
    """``rows`` values of an added column: its stored default, or null."""
    value = default_of(field)
    if value is None:
        return pa.nulls(rows, field.type)
    return pa.array([value] * rows, field.type)


def fill_added(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with every added column of ``schema`` it lacks filled with its default."""
    for field in schema:
        if field.name in table.column_names or not is_added(field):
            continue
        col = default_column(field, table.num_rows)
        table = table.append_column(pa.field(field.name, field.type), col)
    return table

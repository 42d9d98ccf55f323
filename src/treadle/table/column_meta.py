"""What a writer says of one column (a JointState column's joint names), kept in its field.

Column metadata is ``{name: JSON value}`` per column, stored in the column's Arrow field
metadata under ``treadle:meta:<name>`` (the value as JSON), so that it travels with the
table's schema, version by version. A writer gives it with ``append_episode(...,
column_metadata={column: {name: value}})`` or as such keys in an Arrow table's fields;
``table.column_metadata(column)`` reads it back.

The first write of a column fixes its metadata. A later write that gives metadata must give
the same (a column's joint names describe every row of it): a different value, or metadata
for a column that has none, is a :class:`~treadle.errors.SchemaMismatch` naming the column
and both values; a write that gives none keeps the table's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from treadle.errors import SchemaMismatch

PREFIX = b"treadle:meta:"


def column_metadata(field: pa.Field) -> dict[str, Any]:
    """``{name: value}`` a writer gave for this column ({} when none)."""
    out = {}
    for key, raw in (field.metadata or {}).items():
        if key.startswith(PREFIX):
            out[key[len(PREFIX) :].decode()] = json.loads(raw)
    return out


def meta_keys(field: pa.Field) -> dict[bytes, bytes]:
    """The ``treadle:meta:*`` entries of a field's metadata, as stored."""
    return {k: v for k, v in (field.metadata or {}).items() if k.startswith(PREFIX)}


def with_column_metadata(field: pa.Field, metadata: Mapping[str, Any], where: str) -> pa.Field:
    """``field`` carrying ``metadata`` (names without a ':' or control characters; JSON
    values) beside its own metadata."""
    if not isinstance(metadata, Mapping):
        raise SchemaMismatch(f"{where}: column metadata must be a dict of name -> JSON value")
    meta = dict(field.metadata or {})
    for name, value in metadata.items():
        if not isinstance(name, str) or not name or ":" in name or not name.isprintable():
            raise SchemaMismatch(
                f"{where}: column metadata name {name!r} must be a non-empty printable string "
                "without ':'"
            )
        try:
            meta[PREFIX + name.encode()] = json.dumps(value, sort_keys=True).encode()
        except (TypeError, ValueError):
            raise SchemaMismatch(
                f"{where}: column metadata {name!r} is not a JSON value: {value!r}"
            ) from None
    return field.with_metadata(meta)


def keep_meta(old: pa.Field, new: pa.Field) -> pa.Field:
    """``new`` with ``old``'s ``treadle:meta:*`` entries (a column rebuilt from ``old``)."""
    keys = meta_keys(old)
    return new.with_metadata({**(new.metadata or {}), **keys}) if keys else new


def check_same_meta(table_field: pa.Field, write_field: pa.Field, where: str) -> None:
    """A write's column metadata against the table's (see the module doc)."""
    given = meta_keys(write_field)
    if not given or given == meta_keys(table_field):
        return
    have, got = column_metadata(table_field), column_metadata(write_field)
    for name in sorted(have.keys() | got.keys()):
        if have.get(name) != got.get(name):
            theirs = f"{have[name]!r}" if name in have else "none"
            mine = f"{got[name]!r}" if name in got else "none"
            raise SchemaMismatch(
                f"{where}: column {table_field.name!r} has {name} {theirs} in the table, "
                f"{mine} in this write"
            )

"""Which columns a write put null values in, kept in the table's schema metadata.

A batch holds number and tensor columns as tensors, which have no null, so a plan refuses
a window that reads a null (:mod:`treadle.plan.null_rows`). Finding one means reading the
column: the plan does so only for columns that may hold one. Those are columns added
without a value for later episodes (:mod:`treadle.table.defaults`), and columns listed here:
every write (``append``, ``append_episode``, the importers through them) records in
``treadle:nulls`` the columns whose rows it wrote held a null (Arrow keeps each array's null
count: no row is looked at). The record travels with every Lance version, as the image
record does (:mod:`treadle.table.image_sizes`); tables written before it was kept have none,
and a null there is found when a batch reads it.
"""

from __future__ import annotations

import json

import pyarrow as pa

from treadle.table.defaults import is_added

__all__ = ["NULLS_KEY", "merge_nulls", "recorded_nulls", "with_nulls"]

NULLS_KEY = b"treadle:nulls"


def recorded_nulls(schema: pa.Schema) -> set[str]:
    """The columns a write recorded a null in."""
    raw = (schema.metadata or {}).get(NULLS_KEY)
    return set(json.loads(raw)) if raw else set()


def _recording(schema: pa.Schema, names: set[str]) -> pa.Schema:
    meta = dict(schema.metadata or {})
    meta[NULLS_KEY] = json.dumps(sorted(names), separators=(",", ":")).encode()
    return schema.with_metadata(meta)


def with_nulls(schema: pa.Schema, rows: pa.Table) -> pa.Schema:
    """``schema`` recording the columns of ``rows`` that hold a null, but added ones (a plan
    reads those for nulls anyway, and an append leaves them null where it has no value:
    recording them would change the schema's metadata, a new version of it, on such
    appends)."""
    have = recorded_nulls(schema)
    new = {
        name
        for name, col in zip(rows.column_names, rows.columns)
        if col.null_count and not (name in schema.names and is_added(schema.field(name)))
    }
    return schema if new <= have else _recording(schema, have | new)


def merge_nulls(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the columns either records (rows staged or committed apart)."""
    have, theirs = recorded_nulls(schema), recorded_nulls(other)
    return schema if theirs <= have else _recording(schema, have | theirs)

"""A merge of a branch that changed a table's columns (added, renamed, dropped) with one
that appended to it: where each column of the common ancestor went, read from the column
side's commits (``Commit.changes``: ``rename_columns a->b``, ``drop_columns c``), so the
appended rows are renamed and cut to the column side's schema
(:mod:`treadle.catalog.merge_tables`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from treadle.table.schema_records import renamed_records
from treadle.table.tensors import schema_difference

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.catalog.history import Merging

ADD_COLUMN, RENAME, DROP = "add_column", "rename_columns", "drop_columns"
COLUMN_KINDS = {ADD_COLUMN, RENAME, DROP}


def table_changes(project: Merging, name: str, head: Commit, base: Commit
                  ) -> list[tuple[Commit, list[Commit]]] | None:  # fmt: skip
    """The commits from ``head`` back to ``base`` that changed table ``name``, newest first,
    each with its parents, walking through the parent each version came from; None where
    the walk does not meet ``base``."""
    out: list[tuple[Commit, list[Commit]]] = []
    cur = head
    while cur.id != base.id:
        if not cur.parents:
            return None
        parents = [project.load_commit(p) for p in cur.parents]
        same = [p for p in parents if p.tables.get(name) == cur.tables.get(name)]
        if not same:
            out.append((cur, parents))
        cur = same[0] if same else parents[0]
    return out


def _changes(project: Merging, name: str, head: Commit, base: Commit) -> list[str] | None:
    """What the commits from ``base`` to ``head`` did to table ``name``, oldest first; None
    past a merge that combined changes, or a walk that does not meet ``base``."""
    walk = table_changes(project, name, head, base)
    if walk is None or any(len(parents) > 1 for _, parents in walk):
        return None
    return [c for cur, _ in reversed(walk) for c in cur.changes.get(name, ("unknown",))]


def column_map(
    project: Merging, name: str, head: Commit, base: Commit, before: pa.Schema, after: pa.Schema
) -> dict[str, str | None] | None:
    """``{column of base: its name at head, or None if dropped}`` when the commits between
    only added, renamed and dropped columns and ``after`` (head's schema) holds each kept
    column under its new name, same type; None otherwise."""
    changes = _changes(project, name, head, base)
    if changes is None:
        return None
    now: dict[str, str | None] = {c: c for c in before.names}
    for change in changes:
        kind, _, detail = change.partition(" ")
        if kind == RENAME:
            pairs = [p.split("->") for p in detail.split(",")]
            if not detail or any(len(p) != 2 for p in pairs):
                return None
            step = dict(pairs)
            now = {c: (None if n is None else step.get(n, n)) for c, n in now.items()}
        elif kind == DROP:
            gone = set(detail.split(","))
            now = {c: (None if n in gone else n) for c, n in now.items()}
        elif kind != ADD_COLUMN:
            return None
    kept = [(c, n) for c, n in now.items() if n is not None]
    if any(n not in after.names for _, n in kept):
        return None
    was = pa.schema([before.field(c).with_name(n) for c, n in kept])
    if schema_difference(was, pa.schema([after.field(n) for _, n in kept])) is not None:
        return None
    return now


def renamed_rows(rows: pa.Table, names: dict[str, str | None]) -> pa.Table:
    """``rows`` (in the ancestor's columns) with each column renamed or dropped."""
    keep = [c for c in rows.column_names if names.get(c, c) is not None]
    rows = rows.select(keep)
    return rows.rename_columns([names.get(c, c) or c for c in keep])


def renamed_schema(schema: pa.Schema, names: dict[str, str | None]) -> pa.Schema:
    """``schema``'s records of its rows (nulls, image sizes, off-grid videos) under the new
    names (the appended side's, before they meet the column side's)."""
    moved = {c: n for c, n in names.items() if n != c}
    if not moved:
        return schema
    meta = dict(schema.metadata or {})
    for key, value in renamed_records(schema, moved).items():
        if value is None:
            meta.pop(key.encode(), None)
        else:
            meta[key.encode()] = value.encode()
    return schema.with_metadata(meta)

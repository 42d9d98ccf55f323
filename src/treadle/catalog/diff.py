"""What changed between two commits, table by table (``project.diff(a, b) -> td.Diff``).

Per table: episodes added and removed (names), columns added, removed and changed (names
and types), columns whose values were updated, moments before and after. ``a`` and ``b``
are commit ids (or unique prefixes), branch names or tags. Reads the two versions' schemas
and episode indexes (O(episodes)), never a row, and the commits on either side since their
common ancestors (what each recorded it did, ``Commit.changes``: ``update <column>``), not
the rest of the history.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from treadle.catalog.between import sides
from treadle.errors import InvalidName, NotFound
from treadle.names import check_name
from treadle.table.table import Table

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.catalog.history import Merging


@dataclass(frozen=True)
class TableDiff:
    """How one table differs between the two commits of a :class:`Diff`."""

    name: str
    status: str  # "added", "removed", "changed" or "same"
    moments_before: int | None
    moments_after: int | None
    episodes_added: list[str] = field(default_factory=list)
    episodes_removed: list[str] = field(default_factory=list)
    columns_added: dict[str, str] = field(default_factory=dict)  # name -> type
    columns_removed: dict[str, str] = field(default_factory=dict)
    columns_changed: dict[str, list[str]] = field(default_factory=dict)  # name -> [old, new]
    columns_updated: list[str] = field(default_factory=list)  # values set by update()

    def line(self) -> str:
        """One line: what changed."""
        parts = [f"{self.name}: {self.status}"]
        before, after = self.moments_before, self.moments_after
        if before is None and after is not None:
            parts.append(f"{after:,} moments")
        elif after is None and before is not None:
            parts.append(f"had {before:,} moments")
        elif before != after:
            parts.append(f"moments {before:,} -> {after:,}")
        for what, items in (("+episodes", self.episodes_added), ("-episodes", self.episodes_removed),
                            ("+columns", list(self.columns_added)),
                            ("-columns", list(self.columns_removed)),
                            ("~columns", list(self.columns_changed)),
                            ("~values", self.columns_updated)):  # fmt: skip
            if items:
                shown = ", ".join(items[:5]) + (f", ... ({len(items)})" if len(items) > 5 else "")
                parts.append(f"{what} {shown}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Diff:
    """The tables that differ between commit ``a`` and commit ``b`` (full ids)."""

    a: str
    b: str
    tables: dict[str, TableDiff]

    def to_json(self) -> dict[str, Any]:
        """The same as a JSON-ready dict (``treadle diff --json``)."""
        return {"a": self.a, "b": self.b, "tables": {n: asdict(t) for n, t in self.tables.items()}}

    def __str__(self) -> str:
        head = f"diff {self.a[:8]}..{self.b[:8]}"
        if not self.tables:
            return head + ": no table changed"
        return "\n".join([head] + [t.line() for t in self.tables.values()])

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)


def resolve(project: Merging, ref: str) -> Commit:
    """The commit a branch name, a tag or a commit id (prefix) names, in that order."""
    ref = str(ref)
    try:
        check_name(ref, "ref")
        head = project.refs.head(ref)
    except Exception:
        head = None
    tags = project.tags()
    if head is not None and ref in tags and tags[ref] != head.commit_id:
        raise InvalidName(
            f"{ref!r} names both a branch (at {head.commit_id[:8]}) and a tag (at "
            f"{tags[ref][:8]}) of project {project.name!r}: give the commit id"
        )
    if head is not None:
        return project.load_commit(head.commit_id)
    if ref in tags:
        return project.load_commit(tags[ref])
    try:
        return project.commit(ref)
    except NotFound:
        raise NotFound(
            f"project {project.name!r} has no branch, tag or commit {ref!r}; branches: "
            f"{project.branches()}, tags: {sorted(tags)}"
        ) from None


def _columns(table: Table | None) -> dict[str, str]:
    if table is None:
        return {}
    return {f.name: _type(f) for f in table.schema}


def _type(f: Any) -> str:
    shape = (f.metadata or {}).get(b"treadle:shape")
    return f"{f.type}" + (f" shape {shape.decode()}" if shape else "")


def _episodes(table: Table | None) -> list[str]:
    return [] if table is None or not table.is_time_indexed else list(table.episodes().names)


def updated_columns(project: Merging, a: Commit, b: Commit) -> dict[str, set[str]]:
    """Per table, the columns an ``update`` set in a commit on one side but not the other
    (the columns whose values may differ beyond what the schemas and episodes say). Reads
    the commits between ``a``, ``b`` and their common ancestors, not the whole history
    (:mod:`treadle.catalog.between`)."""
    walked = sides(project.load_commit, a.id, b.id)
    out: dict[str, set[str]] = {}
    for cid in walked.left | walked.right:
        for table, changes in project.load_commit(cid).changes.items():
            for change in changes:
                kind, _, column = change.partition(" ")
                if kind == "update" and column:
                    out.setdefault(table, set()).add(column)
    return out


def table_diff(
    name: str, before: Table | None, after: Table | None, updated: set[str] | None = None
) -> TableDiff:
    """How table ``name`` differs between two pinned versions (None: absent); ``updated``:
    the columns an ``update`` set on either side."""
    if before is not None and after is not None and before.version == after.version:
        n = before.num_moments
        return TableDiff(name, "same", n, n)
    status = "added" if before is None else "removed" if after is None else "changed"
    old_eps, new_eps = _episodes(before), _episodes(after)
    old_set, new_set = set(old_eps), set(new_eps)
    old_cols, new_cols = _columns(before), _columns(after)
    return TableDiff(
        name,
        status,
        None if before is None else before.num_moments,
        None if after is None else after.num_moments,
        [e for e in new_eps if e not in old_set],
        [e for e in old_eps if e not in new_set],
        {c: t for c, t in new_cols.items() if c not in old_cols},
        {c: t for c, t in old_cols.items() if c not in new_cols},
        {c: [old_cols[c], t] for c, t in new_cols.items() if c in old_cols and old_cols[c] != t},
        sorted(c for c in updated or () if c in old_cols and c in new_cols),
    )


def diff(project: Merging, a: str, b: str) -> Diff:
    """:class:`Diff` of two commits, branches or tags of ``project``."""
    ca, cb = resolve(project, a), resolve(project, b)
    updated = updated_columns(project, ca, cb) if ca.id != cb.id else {}
    out: dict[str, TableDiff] = {}
    for name in sorted(set(ca.tables) | set(cb.tables)):
        va, vb = ca.tables.get(name), cb.tables.get(name)
        if va == vb:
            continue
        before = None if va is None else Table(project, name, va, ca.id)
        after = None if vb is None else Table(project, name, vb, cb.id)
        out[name] = table_diff(name, before, after, updated.get(name))
    return Diff(ca.id, cb.id, out)

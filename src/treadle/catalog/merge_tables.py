"""One table of a three-way merge: what to take (checked first, nothing written), then
the merged Lance version (:mod:`treadle.catalog.merge`).

Both sides only appended: the merged version lists our version's fragments, then their
appended rows (their fragments as they are where one starts right after the base's
rows, else those rows written again; never a media object). One side only added
columns, the other only appended: the column side's version, then the appended rows
with each added column's default (or null).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from treadle.catalog.commit import Commit
from treadle.catalog.history import Merging
from treadle.errors import MergeConflict
from treadle.table.episode_store import store_episode_index
from treadle.table.episodes import EPISODE
from treadle.table.schema_records import merge_records
from treadle.table.tensors import conform, schema_difference

if TYPE_CHECKING:
    from lance.fragment import FragmentMetadata

APPEND = "append"
ADD_COLUMN = "add_column"


@dataclass
class TablePlan:
    """What a merge takes for one table (``take`` None: our version stays)."""

    name: str
    take: str | None  # "theirs", "appends" or "columns+appends"
    base: int | None = None
    ours: int | None = None
    theirs: int | None = None
    kinds: list[str] = field(default_factory=list)
    columns_side: str = ""  # "ours" or "theirs" for "columns+appends"
    commits: dict[int | None, str] = field(default_factory=dict)  # version -> a commit naming it


def _conflict(name: str, why: str, ok: list[str], tk: list[str]) -> MergeConflict:
    return MergeConflict(
        f"table {name!r} {why}: this side did {sorted(ok) or ['nothing']}, the merged "
        f"side did {sorted(tk) or ['nothing']}; nothing was written and no branch moved"
    )


def plan_table(
    project: Merging,
    name: str,
    base: Commit,
    ours: Commit,
    theirs: Commit,
    our_kinds: dict[str, list[str]],
    their_kinds: dict[str, list[str]],
) -> TablePlan:
    """What to take for table ``name``; :class:`MergeConflict` when both sides changed it
    in ways that do not combine."""
    b, o, t = base.tables.get(name), ours.tables.get(name), theirs.tables.get(name)
    if t in (b, o):
        return TablePlan(name, None)
    ok, tk = our_kinds.get(name, []), their_kinds.get(name, [])
    if o == b:
        return TablePlan(name, "theirs", b, o, t, list(tk))
    if b is None:
        raise _conflict(name, "was created on both sides", ok, tk)
    plan = TablePlan(name, None, b, o, t, [APPEND], commits={b: base.id, o: ours.id, t: theirs.id})
    if set(ok) == {APPEND} and set(tk) == {APPEND}:
        plan.take = "appends"
        _check_appends(project, plan, ok, tk)
    elif set(ok) == {ADD_COLUMN} and set(tk) == {APPEND}:
        plan.take, plan.columns_side, plan.kinds = "columns+appends", "ours", [ADD_COLUMN, APPEND]
    elif set(tk) == {ADD_COLUMN} and set(ok) == {APPEND}:
        plan.take, plan.columns_side, plan.kinds = "columns+appends", "theirs", [ADD_COLUMN, APPEND]
    else:
        raise _conflict(name, "was changed on both sides", ok, tk)
    return plan


def _open(project: Merging, plan: TablePlan, version: int | None) -> Any:
    """Version ``version`` of the plan's table, read through the commit that names it
    (:class:`ExpiredCommit` naming it when retention took it, not a missing manifest)."""
    assert version is not None
    return project.lance.open(plan.name, version, plan.commits.get(version))


def _table(project: Merging, plan: TablePlan, version: int | None) -> Any:
    assert version is not None
    return project.table_at(plan.name, version, plan.commits.get(version))


def _rows(project: Merging, plan: TablePlan, version: int | None) -> int:
    return _table(project, plan, version).num_moments


def _appended_names(
    project: Merging, plan: TablePlan, version: int | None, after: int
) -> list[str]:
    idx = _table(project, plan, version).episodes()
    return [n for n, s in zip(idx.names, idx.starts.tolist(), strict=True) if s >= after]


def _check_appends(project: Merging, plan: TablePlan, ok: list[str], tk: list[str]) -> None:
    ds_o, ds_t = _open(project, plan, plan.ours), _open(project, plan, plan.theirs)
    if schema_difference(ds_o.schema, ds_t.schema) is not None:
        raise _conflict(plan.name, "was appended to with different schemas", ok, tk)
    if EPISODE not in ds_o.schema.names:
        return
    nb = _rows(project, plan, plan.base)
    both = set(_appended_names(project, plan, plan.ours, nb)) & set(
        _appended_names(project, plan, plan.theirs, nb)
    )
    if both:
        raise _conflict(plan.name, f"got episode {sorted(both)[0]!r} on both sides", ok, tk)


def _tail(ds: Any, after: int, reuse: bool) -> list[FragmentMetadata] | pa.Table:
    """The rows of ``ds`` after the first ``after``: its fragments when one starts there
    (and ``reuse``), else the rows."""
    at = 0
    frags = ds.get_fragments()
    for i, f in enumerate(frags):
        if at == after and reuse:
            return [g.metadata for g in frags[i:]]
        at += f.count_rows()
    if at == after and reuse:
        return []
    return ds.take(list(range(after, ds.count_rows())))


def merged_version(project: Merging, plan: TablePlan) -> tuple[int, str | None]:
    """The Lance version the merge commits for one table, and a note for its message."""
    if plan.take == "theirs":
        assert plan.theirs is not None
        return plan.theirs, None
    lance = project.lance
    nb = _rows(project, plan, plan.base)
    if plan.take == "appends":
        target, source, reuse = plan.ours, plan.theirs, True
    else:
        col_ours = plan.columns_side == "ours"
        target = plan.ours if col_ours else plan.theirs
        source = plan.theirs if col_ours else plan.ours
        reuse = False
    ds, src = _open(project, plan, target), _open(project, plan, source)
    tail = _tail(src, nb, reuse)
    # what the other side recorded of its rows (schema_records), kept (as a rebase does)
    schema = merge_records(ds.schema, src.schema)
    note = None
    if isinstance(tail, pa.Table):
        where = f"merging table {plan.name!r}"
        rows = conform(tail, ds.schema, where)
        added = [c for c in ds.schema.names if c not in tail.column_names]
        if added:
            note = (f"table {plan.name}: {rows.num_rows} appended moments take the default "
                    f"or null of {', '.join(added)}")  # fmt: skip
        tail = lance.write_fragments(rows, ds) if rows.num_rows else []
    version = lance.commit(plan.name, schema, ds, tail, lambda: None)
    stored = store_episode_index(project, plan.name, version, target)
    lance.episode_names.remember(plan.name, stored)
    return version, note

"""One table of a three-way merge: what to take (checked first, nothing written), then
the merged Lance version (:mod:`treadle.catalog.merge`).

Both sides only appended: the merged version lists our version's fragments, then their
appended rows (their fragments as they are where one starts right after the base's
rows, else those rows written again; never a media object). One side only added
columns, the other only appended: the column side's version, then the appended rows
with each added column's default (or null). Both sides deleted the same episodes of the
base (read from their ``delete_episodes`` commits) and otherwise only appended: as for
appends, after the episodes both kept. Rows copied from the other side that a purge blanked
are :class:`Purged`; nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from treadle.catalog.commit import Commit
from treadle.catalog.history import Merging
from treadle.catalog.merge_columns import (
    COLUMN_KINDS,
    column_map,
    renamed_rows,
    renamed_schema,
    table_changes,
)
from treadle.errors import MergeConflict, Purged
from treadle.table.episode_store import store_episode_index
from treadle.table.episodes import EPISODE
from treadle.table.fps import same_rate, schema_fps
from treadle.table.schema_records import merge_records
from treadle.table.tensors import conform, schema_difference

if TYPE_CHECKING:
    from lance.fragment import FragmentMetadata

APPEND = "append"
ADD_COLUMN = "add_column"
DELETE = "delete_episodes"


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
    after: int | None = None  # leading rows both sides share ("appends"; None: the base's)
    renames: dict[str, str | None] = field(default_factory=dict)  # base column -> new, or None


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
    rates = [schema_fps(_open(project, plan, v).schema) for v in (o, t)]
    if None not in rates and not same_rate(*rates):  # type: ignore[arg-type]
        raise _conflict(name, f"has {rates[0]:g} fps on this side, {rates[1]:g} fps on the "
                        "merged side (a table has one frame rate)", ok, tk)  # fmt: skip
    if set(ok) == {APPEND} and set(tk) == {APPEND}:
        plan.take = "appends"
        _check_appends(project, plan, ok, tk)
    elif DELETE in ok + tk and set(ok + tk) <= {APPEND, DELETE}:
        _plan_deletes(project, plan, base, ours, theirs, ok, tk)
    elif ok and set(ok) <= COLUMN_KINDS and set(tk) == {APPEND}:
        _plan_columns(project, plan, (base, ours, theirs), "ours", ok, tk)
    elif tk and set(tk) <= COLUMN_KINDS and set(ok) == {APPEND}:
        _plan_columns(project, plan, (base, ours, theirs), "theirs", ok, tk)
    else:
        raise _conflict(name, "was changed on both sides", ok, tk)
    return plan


def _plan_columns(
    project: Merging,
    plan: TablePlan,
    commits: tuple[Commit, Commit, Commit],
    side: str,
    ok: list[str],
    tk: list[str],
) -> None:
    """One side (``side``) only added, renamed or dropped columns, the other only appended:
    the column side's version, then the appended rows renamed and cut to it (added columns
    take their default or null). :class:`MergeConflict` when where a column went is not
    known (a merge on the column side combined changes, say)."""
    base, ours, theirs = commits
    head, columns_v = (ours, plan.ours) if side == "ours" else (theirs, plan.theirs)
    appends_v = plan.theirs if side == "ours" else plan.ours
    before = _open(project, plan, plan.base).schema
    after = _open(project, plan, columns_v).schema
    names = column_map(project, plan.name, head, base, before, after)
    if names is None or schema_difference(before, _open(project, plan, appends_v).schema):
        raise _conflict(plan.name, "was changed on both sides (where its columns went is "
                        "not known)", ok, tk)  # fmt: skip
    plan.take, plan.columns_side, plan.renames = "columns+appends", side, names
    plan.kinds = [*sorted(set(ok if side == "ours" else tk)), APPEND]
    nb = _rows(project, plan, plan.base)
    _check_unpurged(project, plan, appends_v, _appended_names(project, plan, appends_v, nb))


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
    nb = _rows(project, plan, plan.base) if plan.after is None else plan.after
    theirs = _appended_names(project, plan, plan.theirs, nb)
    both = set(_appended_names(project, plan, plan.ours, nb)) & set(theirs)
    if both:
        raise _conflict(plan.name, f"got episode {sorted(both)[0]!r} on both sides", ok, tk)
    _check_unpurged(project, plan, plan.theirs, theirs)


def _check_unpurged(
    project: Merging, plan: TablePlan, version: int | None, names: list[str]
) -> None:
    """:class:`Purged` when rows the merge copies from ``version`` are a purged episode's
    (a commit made before the purge, merged after it: its rows are blanked, not data)."""
    assert version is not None
    purged = project.lance.purged(plan.name, version, fresh=True)
    hit = [n for n in names if n in purged]
    if hit:
        e = purged[hit[0]]
        assert isinstance(e, Purged)
        raise Purged(
            f"table {plan.name!r}: the merged side appended episode {hit[0]!r}, purged by "
            f"commit {e.commit[:8]} ({e.reason!r}) after: its rows are blanked; delete it "
            "on that side (or merge a commit made after the purge); nothing was written "
            "and no branch moved",
            episode=e.episode, table=e.table, commit=e.commit, reason=e.reason,
        )  # fmt: skip


def _deleted(project: Merging, name: str, head: Commit, base: Commit) -> set[str] | None:
    """The episode names that ``head``'s side deleted since ``base`` (by ``delete_episodes``
    alone in a commit), when it otherwise only appended; None when it did anything else (or
    the walk back, through the parent each version came from, does not meet ``base``)."""
    walk = table_changes(project, name, head, base)
    if walk is None:
        return None
    out: set[str] = set()
    for cur, parents in walk:
        kinds = set(cur.kinds(name))
        if kinds == {DELETE} and name in parents[0].tables:
            before = _table_of(project, name, parents[0]).episodes().names
            out |= set(before) - set(_table_of(project, name, cur).episodes().names)
        elif kinds != {APPEND}:
            return None
    return out


def _plan_deletes(
    project: Merging,
    plan: TablePlan,
    base: Commit,
    ours: Commit,
    theirs: Commit,
    ok: list[str],
    tk: list[str],
) -> None:
    """Both sides deleted the same episodes of the base (a purge deletes on every branch)
    and otherwise only appended: ours, then their appended rows (``plan.take`` None when
    they appended none). Else :class:`MergeConflict`. A base episode's name may be appended
    again only after it was deleted (names are unique in a version), so a deleted name the
    base has is the base's episode."""
    base_names = list(_table_of(project, plan.name, base).episodes().names)
    gone = [_deleted(project, plan.name, c, base) for c in (ours, theirs)]
    if gone[0] is None or gone[1] is None:
        raise _conflict(plan.name, "was changed on both sides", ok, tk)
    lost = [set(base_names) & g for g in gone]
    if lost[0] != lost[1]:
        raise _conflict(plan.name, f"lost different episodes on each side ({sorted(lost[0])[:5]} "
                        f"and {sorted(lost[1])[:5]})", ok, tk)  # fmt: skip
    kept = [n for n in base_names if n not in lost[0]]
    ends = []
    for c in (ours, theirs):
        idx = _table_of(project, plan.name, c).episodes()
        if list(idx.names[: len(kept)]) != kept:  # deletions keep the order: never here
            raise _conflict(plan.name, "does not start with the episodes both sides kept", ok, tk)
        ends.append(int(idx.starts[len(kept)]) if len(idx) > len(kept) else None)
    plan.after = int(sum(_table_of(project, plan.name, ours).episodes().lengths[: len(kept)]))
    if ends[1] is None:
        plan.take = None  # they appended nothing we lack
    elif ends[0] is None:
        plan.take, plan.kinds = "theirs", list(tk)  # we appended nothing they lack
    else:
        plan.take = "appends"
    if plan.take is not None:
        _check_appends(project, plan, ok, tk)


def _table_of(project: Merging, name: str, commit: Commit) -> Any:
    return project.table_at(name, commit.tables[name], commit.id)


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


def merged_version(
    project: Merging, plan: TablePlan, before_write: Callable[[], None]
) -> tuple[int, str | None]:
    """The Lance version the merge commits for one table, and a note for its message
    (``before_write``: called before each object is written, the gc lease's beat)."""
    if plan.take == "theirs":
        assert plan.theirs is not None
        return plan.theirs, None
    lance = project.lance
    nb = _rows(project, plan, plan.base) if plan.after is None else plan.after
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
    schema = merge_records(ds.schema, renamed_schema(src.schema, plan.renames))
    note = None
    if isinstance(tail, pa.Table):
        where = f"merging table {plan.name!r}"
        tail = renamed_rows(tail, plan.renames)
        rows = conform(tail, ds.schema, where)
        added = [c for c in ds.schema.names if c not in tail.column_names]
        if added:
            note = (f"table {plan.name}: {rows.num_rows} appended moments take the default "
                    f"or null of {', '.join(added)}")  # fmt: skip
        before_write()
        tail = lance.write_fragments(rows, ds) if rows.num_rows else []
    version = lance.commit(plan.name, schema, ds, tail, before_write)
    stored = store_episode_index(project, plan.name, version, target)
    lance.episode_names.remember(plan.name, stored)
    return version, note

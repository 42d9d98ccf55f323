"""Merging one branch into another, and diffs (``project.merge``, ``project.diff``).

A **fast-forward** is used where the target's head is an ancestor of the source's: the
target then points at the source's head. Otherwise the merge is **three-way by table**,
against the most recent common ancestor of the two heads (several of them, as after
criss-cross merges: :class:`MergeConflict` naming them). What each side did to a table
is read from the operation kinds its commits recorded (``Commit.changes``: append,
add_column, update, ...), never guessed from fragments (tail compaction rewrites them):

- a table changed on one side only takes that side's version;
- both sides only appended episodes (distinct names): the base's rows, then ours, then
  theirs (:mod:`treadle.catalog.merge_tables`);
- one side only added, renamed or dropped columns, the other only appended: both; the
  appended episodes take the new names (:mod:`treadle.catalog.merge_columns`) and each
  added column's default or null, and the commit message says so;
- both sides deleted the same episodes of the base (a purge deletes on every branch) and
  otherwise only appended: ours, then their appended episodes;
- rows the merge would copy that a purge blanked (a commit made before the purge, merged
  after it) are :class:`~treadle.errors.Purged`;
- anything else changed on both sides is a :class:`MergeConflict` naming the table and
  what each side did. Nothing is written and no branch moves.

Merging a commit retention expired, or one whose common ancestor it expired where the rows
must be counted (appends on both sides), is an :class:`ExpiredCommit` naming it; nothing
moves (a branch fast-forwarded to an expired commit, or a merge naming its gone table
version, would read nothing). A gc that expires it while the merge moves the branch is
found after the move (:func:`~treadle.catalog.expiry.settle`, as for every pin): what it
deleted is put back to the branch's versions, and :class:`CommitConflict` says so.

The merge commit has two parents (target head, source head) and moves the target with
one compare-and-swap; a target that moved meanwhile is merged again (a few times).

A merge that would change a table a purge is purging now is a :class:`CommitConflict`,
and a purge that starts meanwhile waits for the merge to end
(:mod:`treadle.catalog.purgeguard`): a merge beside a purge kept the purged rows.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from treadle import layout
from treadle.catalog.commit import Commit
from treadle.catalog.diff import Diff, diff, resolve
from treadle.catalog.expiry import expired_error, settle
from treadle.catalog.history import Merging
from treadle.catalog.leases import Lease
from treadle.catalog.merge_tables import merged_version, plan_table
from treadle.catalog.purgeguard import merge_lease, refuse_running, running_purges
from treadle.errors import CommitConflict, ExpiredCommit, MergeConflict, NotFound, TreadleError
from treadle.names import check_name

_ATTEMPTS = 5


def ancestors(project: Merging, commit_id: str) -> dict[str, int]:
    """Every commit reachable from ``commit_id`` (itself included), with its distance."""
    seen = {commit_id: 0}
    todo = deque([commit_id])
    while todo:
        cid = todo.popleft()
        for p in project.load_commit(cid).parents:
            if p not in seen:
                seen[p] = seen[cid] + 1
                todo.append(p)
    return seen


def merge_base(project: Merging, ours: str, theirs: str) -> str:
    """The most recent common ancestor of two commits (:class:`MergeConflict` when
    there are several)."""
    a, b = ancestors(project, ours), ancestors(project, theirs)
    common = set(a) & set(b)
    if not common:
        raise MergeConflict(f"commits {ours[:8]} and {theirs[:8]} have no common ancestor")
    # ancestors of a common ancestor are common too, so one is below another exactly when
    # it is a parent of a common one: no walk per common commit (quadratic in history)
    below = {p for c in common for p in project.load_commit(c).parents}
    best = sorted(common - below)
    if len(best) > 1:
        raise MergeConflict(
            f"commits {ours[:8]} and {theirs[:8]} have {len(best)} most recent common "
            f"ancestors ({', '.join(c[:8] for c in best)}); merge one into the other first"
        )
    return best[0]


def side_kinds(project: Merging, head: str, base: str) -> dict[str, list[str]]:
    """Per table, the operation kinds the commits after ``base`` up to ``head`` applied
    (``"unknown"`` for a commit that changed a table and recorded nothing). A merge commit
    does nothing of its own: it keeps one parent's version of a table or combines both
    parents' changes, and the commits that made those are on this side too (or before
    ``base``, whose version has them), and count for themselves. (A merge's recorded kinds
    are what it did to its first parent: counted, a labels branch merged once was refused
    its next merge, main having 'added' the labels' column.)"""
    before = ancestors(project, base)
    kinds: dict[str, list[str]] = {}
    for cid in ancestors(project, head):
        if cid in before:
            continue
        c = project.load_commit(cid)
        if len(c.parents) > 1:
            continue
        parents = [project.load_commit(p) for p in c.parents]
        for name, v in c.tables.items():
            if parents and any(p.tables.get(name) == v for p in parents):
                continue
            got = c.kinds(name) or ["unknown"]
            kinds.setdefault(name, [])
            kinds[name].extend(k for k in got if k not in kinds[name])
    return kinds


def readable(project: Merging, name: str, version: int) -> bool:
    """Whether ``version`` of table ``name`` still has its manifest and data files."""
    v = project.lance.resolve(name, version)
    try:
        ds = project.lance.load(name, v, f"table {name!r} version {v}")
    except TreadleError:
        return False
    base = layout.table_key(project.place.prefix, name)
    files = [df.path for f in ds.get_fragments() for df in f.metadata.files]
    return all(project.place.store.exists(f"{base}/data/{p}") for p in files)


def put_back(project: Merging, into: str, ours: Commit, lost: dict[str, int]) -> str:
    """A commit on branch ``into`` whose tables ``lost`` (name -> the version a merge
    brought) are ``ours``' again (absent where ``ours`` had none); its id."""
    for _ in range(_ATTEMPTS):
        head = project.refs.head(into)
        assert head is not None
        now = project.load_commit(head.commit_id)
        tables = dict(now.tables)
        for name, v in lost.items():
            if tables.get(name) == v:
                tables.pop(name)
                if name in ours.tables:
                    tables[name] = ours.tables[name]
        text = f"put back {sorted(lost)}: a gc deleted what a merge brought"
        c = Commit.create([now.id], text, tables, None, now.time)
        project.save_commit(c)
        if project.refs.try_advance(into, head.seq + 1, c.id):
            return c.id
    raise CommitConflict(f"branch {into!r} kept moving while a merge was put back")


class MergesAndDiffs:
    """``project.merge`` and ``project.diff`` (mixed into :class:`treadle.Project`)."""

    name: str
    refs: Any
    place: Any

    def diff(self, a: str, b: str) -> Diff:
        """What changed from ``a`` to ``b`` (commit ids or prefixes, branch names, tags),
        per table: episodes, columns, moments (:class:`treadle.Diff`)."""
        return diff(self, a, b)  # type: ignore[arg-type]

    def merge(self, branch: str, into: str = "main", message: str | None = None) -> Commit:
        """Merge branch (or tag, or commit) ``branch`` into branch ``into``: a fast-forward
        where possible, else a three-way merge by table (see :mod:`treadle.catalog.merge`).
        Returns the new head of ``into``; :class:`MergeConflict` writes nothing."""
        check_name(into, "branch")
        guard = merge_lease(self.place)  # before any head is read: see catalog/purgeguard.py
        try:
            purging = running_purges(self.place)
            for _ in range(_ATTEMPTS):
                head = self.refs.head(into)
                if head is None:
                    raise NotFound(f"branch {into!r} not found in project {self.name!r}")
                theirs = resolve(self, branch)
                try:
                    done = self._merge_once(head, theirs, branch, into, message, purging)
                except ExpiredCommit as e:
                    raise ExpiredCommit(
                        f"merging {branch!r} into {into!r}: {e}; nothing was written and no "
                        "branch moved"
                    ) from None
                if done is not None:
                    return done
        finally:
            guard.release()
        raise CommitConflict(
            f"branch {into!r} of project {self.name!r} kept moving while merging {branch!r}; "
            "nothing was committed"
        )

    def _merge_once(
        self,
        head: Any,
        theirs: Commit,
        branch: str,
        into: str,
        message: str | None,
        purging: set[str],
    ) -> Commit | None:
        project: Any = self
        ours = project.load_commit(head.commit_id)
        base = merge_base(project, ours.id, theirs.id)
        if base == theirs.id:
            return ours  # already merged
        gone = expired_error(self.place, theirs.id, None)
        if gone is not None:  # its versions are gone: the target would read nothing
            raise gone
        merging = f"merging {branch!r} into {into!r}"
        if base == ours.id:  # fast-forward
            moved = {n for n in {*ours.tables, *theirs.tables}
                     if ours.tables.get(n) != theirs.tables.get(n)}  # fmt: skip
            refuse_running(purging, moved, merging)
            if not self.refs.try_advance(into, head.seq + 1, theirs.id):
                return None
            self._check_kept(into, theirs, ours, theirs)
            return theirs
        plans = self._plans(base, ours, theirs, branch, into)
        refuse_running(purging, {p.name for p in plans if p.take is not None}, merging)
        # a gc lease while the merged versions are unnamed: gc (any grace) keeps them
        lease = Lease(self.place.store, self.place.prefix)
        try:
            lease.beat()
            tables, changes, notes = dict(ours.tables), {}, []
            for plan in plans:  # every table checked above: only now is anything written
                if plan.take is None:
                    continue
                version, note = merged_version(project, plan, lease.beat)
                tables[plan.name] = version
                changes[plan.name] = plan.kinds
                notes.extend([note] if note else [])
            text = "; ".join([message or f"merge {branch} into {into}", *notes])
            commit = Commit.create([ours.id, theirs.id], text, tables, changes,
                                   max(ours.time, theirs.time))  # fmt: skip
            project.save_commit(commit)
            if not self.refs.try_advance(into, head.seq + 1, commit.id):
                return None
        finally:
            lease.release()
        self._check_kept(into, commit, ours, theirs)
        for name, v in tables.items():
            if ours.tables.get(name) != v:
                project.lance.protect(name, v)
        return commit

    def _plans(self, base: str, ours: Commit, theirs: Commit, branch: str, into: str) -> list[Any]:
        """Each table's :class:`~treadle.catalog.merge_tables.TablePlan`, all checked before
        anything is written (:class:`MergeConflict` naming the sides)."""
        project: Any = self
        base_c = project.load_commit(base)
        our_kinds, their_kinds = (
            side_kinds(project, ours.id, base),
            side_kinds(project, theirs.id, base),
        )
        plans = []
        for name in sorted(set(ours.tables) | set(theirs.tables)):
            try:
                plans.append(
                    plan_table(project, name, base_c, ours, theirs, our_kinds, their_kinds)
                )
            except MergeConflict as e:  # name the sides (merge_tables says "this side")
                why = str(e).replace("this side did", f"{into!r} did")
                why = why.replace("the merged side did", f"{branch!r} did")
                raise MergeConflict(
                    f"merging {branch!r} into {into!r} (common ancestor {base[:8]}): {why}"
                ) from None
        return plans

    def _check_kept(self, into: str, moved: Commit, ours: Commit, theirs: Commit) -> None:
        """After ``into`` moved from ``ours`` to ``moved``: a gc that expired ``theirs`` before
        it saw the new head (:func:`settle`) may have deleted the table versions (or data
        files) the merge brought. Those that are gone are put back to ``ours``' versions, one
        commit on top, and :class:`CommitConflict` says so (the head read nothing before)."""
        if not settle(self.place, [theirs.id]):
            return
        project: Any = self
        lost = [n for n, v in moved.tables.items()
                if ours.tables.get(n) != v and not readable(project, n, v)]  # fmt: skip
        if not lost:
            return
        back = put_back(project, into, ours, {n: moved.tables[n] for n in lost})
        raise CommitConflict(
            f"merging {theirs.short_id} into {into!r} of project {self.name!r}: a gc expired "
            f"that commit while the merge moved {into!r}, and deleted what it named of "
            f"tables {lost}; {into!r} was put back to its versions before the merge (commit "
            f"{back[:8]}); merge a commit that is kept (a branch head or a tag)"
        )

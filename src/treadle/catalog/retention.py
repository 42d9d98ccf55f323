"""Tags and retention: commits named forever, and the old commits gc may expire.

- A **tag** (``<project>/tags/<name>.json``) names one commit, written once
  (put-if-absent): it never moves, and gc keeps everything the commit names.
- **Retention** (``gc --keep-days N``): the table versions a commit names are kept
  while the commit is younger than N days or *pinned*: a branch head, a tagged commit,
  or a commit (or a table version) named by a run record in a checkpoint row (a table
  with ``run_id``/``record``/``digests`` columns, see :mod:`treadle.torch.checkpoints`)
  of a head or tagged commit. Every other commit reachable from a head or tag is
  *expired*, in two phases: gc writes a *pending* marker of its own
  ``<project>/retention/pending/<commit>/<gc>.json``, reads the heads, tags and pins again,
  writes the final marker ``<project>/retention/expired/<commit>.json`` for the commits
  still unpinned, and only then may delete the versions no kept commit names. Reading
  such a commit raises :class:`ExpiredCommit` naming it. An expired commit stays expired
  (a later gc without ``--keep-days`` never expects its versions back).
- A **pin made while gc runs** (a checkpoint row, a tag) is safe by the same order: the
  pin is committed first, then :func:`~treadle.catalog.expiry.settle` reads the markers
  of the commits it names. No marker: gc's second read comes later and sees the pin. A
  pending one (any gc's): wait until every gc deciding has decided. A final one: gc decided before it saw the pin, and
  the caller says so. The markers themselves are :mod:`treadle.catalog.expiry`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from treadle import layout
from treadle.catalog.expiry import expired_key, expired_message, settle
from treadle.catalog.place import ProjectPlace
from treadle.errors import AlreadyExists, CorruptData, ExpiredCommit, NotFound
from treadle.names import check_case_apart, check_name

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.catalog.history import History

EXPIRED = layout.EXPIRED
_CHECKPOINT_COLUMNS = {"run_id", "record", "digests"}  # what makes a table a checkpoint table


def tag(place: ProjectPlace, name: str, commit_id: str) -> str:
    """Name ``commit_id`` (a full id) ``name`` forever; the same tag again is a no-op. The
    project exists (the caller created it)."""
    check_name(name, "tag")
    store = place.store
    if store.exists(expired_key(place.prefix, commit_id)):
        raise ExpiredCommit(expired_message(place, commit_id, None))
    body = json.dumps({"commit": commit_id, "time": datetime.now(UTC).isoformat()}).encode()
    key = layout.tag_key(place.prefix, name)
    if not store.put(key, body, if_absent=True):
        there = tags(place).get(name)
        if there != commit_id:
            shown = there[:8] if there else "?"
            raise AlreadyExists(
                f"tag {name!r} of project {place.name!r} already names commit {shown}; "
                "tags never move"
            )
        return commit_id
    if settle(place, [commit_id]):  # a gc expired it before it saw the new tag
        store.delete(key)
        raise ExpiredCommit(expired_message(place, commit_id, None))
    return commit_id


def branch(place: ProjectPlace, refs: Any, name: str, commit_id: str) -> None:
    """Make branch ``name`` at ``commit_id`` (a full id) in ``refs`` (a
    :class:`~treadle.catalog.refs.RefLog`): :class:`AlreadyExists` if it exists,
    :class:`ExpiredCommit` if retention expired the commit (a head is a pin, as a tag is:
    one made while a gc decides is settled the same way, and refs are never deleted)."""
    if place.store.exists(expired_key(place.prefix, commit_id)):
        raise ExpiredCommit(expired_message(place, commit_id, None))
    check_case_apart(name, refs.branches(), "branch", f"project {place.name!r}")
    if refs.head(name) is not None or not refs.try_advance(name, 0, commit_id):
        raise AlreadyExists(f"branch {name!r} already exists in project {place.name!r}")
    if settle(place, [commit_id]):  # a gc expired it before it saw the new branch
        raise ExpiredCommit(
            f"branch {name!r} was made, but at the same time a gc expired its commit: "
            + expired_message(place, commit_id, None)
        )


def tags(place: ProjectPlace) -> dict[str, str]:
    """Tag name -> full commit id."""
    store, out = place.store, {}
    for key in store.list(layout.folder(place.prefix, layout.TAGS)):
        name = key.rsplit("/", 1)[-1]
        if not name.endswith(".json"):
            continue
        try:
            out[name[:-5]] = str(json.loads(store.get(key))["commit"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(f"tag object {key} is not a valid tag ({type(e).__name__})") from None
    return dict(sorted(out.items()))


@dataclass
class Retention:
    """What gc keeps: table versions, and the commits it expires (with their tables)."""

    versions: dict[str, set[int]] = field(default_factory=dict)
    expired: dict[str, dict[str, int]] = field(default_factory=dict)  # new this run


def plan_retention(history: History, keep_days: float | None, now: datetime) -> Retention:
    """The table versions to keep: every reachable commit's (no ``keep_days``), or only
    those of pinned or young commits; commits expired before stay expired. A version a
    purge replaced counts as its replacement (:mod:`treadle.catalog.purgemap`)."""
    place = history.place
    resolve = _resolver(history)
    gone = {
        k.rsplit("/", 1)[-1][:-5] for k in place.store.list(layout.folder(place.prefix, EXPIRED))
    }
    heads = [h.commit_id for b in history.branches() if (h := history.refs.head(b))]
    roots = set(heads) | set(tags(place).values())
    pinned, pinned_versions = set(roots), set()
    if keep_days is not None:
        for cid in roots - gone:
            c, v = _run_record_pins(history, history.load_commit(cid), gone)
            pinned |= c
            pinned_versions |= v
    horizon = now.timestamp() - (keep_days or 0) * 86400.0
    out = Retention()
    named: set[tuple[str, int]] = set()
    candidates: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    stack = sorted(roots) + sorted(pinned - roots)
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        try:
            c = history.load_commit(cid)
        except NotFound:
            if cid in roots:
                raise
            continue  # a run record naming a commit of another store: its versions count
        stack.extend(c.parents)
        named.update(c.tables.items())
        if cid in gone:
            continue
        if keep_days is None or cid in pinned or c.time >= horizon:
            for name, v in c.tables.items():
                out.versions.setdefault(name, set()).add(resolve(name, v))
        else:
            candidates[cid] = dict(c.tables)
    for name, v in pinned_versions & named:
        out.versions.setdefault(name, set()).add(resolve(name, v))
    for cid, tables in candidates.items():
        lost = {n: v for n, v in tables.items() if resolve(n, v) not in out.versions.get(n, set())}
        if lost:
            out.expired[cid] = lost
    return out


def _resolver(history: History) -> Callable[[str, int], int]:
    """``(table, version) -> the version holding its rows now`` (purges read once per
    table, from storage)."""
    maps: dict[str, Any] = {}

    def resolve(name: str, version: int) -> int:
        if name not in maps:
            maps[name] = history.lance.purge_map(name, fresh=True)
        return int(maps[name].resolve(version))

    return resolve


def _run_record_pins(
    history: History, commit: Commit, gone: set[str]
) -> tuple[set[str], set[tuple[str, int]]]:
    """Commits and (table, version) pairs named by run records in the checkpoint tables of
    ``commit``; a record gc cannot parse stops gc (it never guesses what a run needs).

    A table entry whose commit was expired (in ``gone``) pins no version: its row came too
    late (its save raised ExpiredCommit, "cannot resume") and its versions may be gone
    already, so keeping them would stop every later gc on a missing manifest."""
    commits: set[str] = set()
    versions: set[tuple[str, int]] = set()
    for name, v in sorted(commit.tables.items()):
        ds = history.lance.open(name, v)
        if not _CHECKPOINT_COLUMNS <= set(ds.schema.names):
            continue
        for row, text in enumerate(ds.to_table(columns=["record"]).column("record").to_pylist()):
            try:
                record = json.loads(text)
                if record.get("project") not in (None, history.place.name):
                    continue
                for t in record["tables"]:
                    if t.get("commit") and str(t["commit"]) in gone:
                        continue
                    versions.add((str(t["name"]), int(t["version"])))
                    if t.get("commit"):
                        commits.add(str(t["commit"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise CorruptData(
                    f"gc of project {history.place.name!r} stopped before deleting anything: "
                    f"checkpoint table {name!r} version {v} row {row}: its run record cannot "
                    "be parsed, so what it pins is unknown"
                ) from None
    return commits, versions

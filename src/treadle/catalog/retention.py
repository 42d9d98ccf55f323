"""Tags and retention: commits named forever, and the old commits gc may expire.

- A **tag** (``<project>/tags/<name>.json``) names one commit, written once
  (put-if-absent): it never moves, and gc keeps everything the commit names.
- **Retention** (``gc --keep-days N``): the table versions a commit names are kept
  while the commit is younger than N days or *pinned*: a branch head, a tagged commit,
  or a commit (or a table version) named by a run record in a checkpoint row (a table
  with ``run_id``/``record``/``digests`` columns, see :mod:`treadle.torch.checkpoints`)
  of a head or tagged commit. Every other commit reachable from a head or tag is
  *expired*, in two phases: gc writes a *pending* marker
  ``<project>/retention/pending/<commit>.json``, reads the heads, tags and pins again,
  writes the final marker ``<project>/retention/expired/<commit>.json`` for the commits
  still unpinned, and only then may delete the versions no kept commit names. Reading
  such a commit raises :class:`ExpiredCommit` naming it. An expired commit stays expired
  (a later gc without ``--keep-days`` never expects its versions back).
- A **pin made while gc runs** (a checkpoint row, a tag) is safe by the same order: the
  pin is committed first, then :func:`settle` reads the markers of the commits it names.
  No marker: gc's second read comes later and sees the pin. A pending one: wait until gc
  decides. A final one: gc decided before it saw the pin, and the caller says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from treadle import layout
from treadle.errors import AlreadyExists, CorruptData, ExpiredCommit, NotFound
from treadle.names import check_name

if TYPE_CHECKING:
    from treadle.catalog.client import Project

EXPIRED = layout.EXPIRED
_SETTLE_S = 300.0  # how long a pending marker is waited for (a gc that died leaves it)
_CHECKPOINT_COLUMNS = {"run_id", "record", "digests"}  # what makes a table a checkpoint table


def tag(project: Project, name: str, commit_id: str) -> str:
    """Name ``commit_id`` (a full id) ``name`` forever; the same tag again is a no-op."""
    check_name(name, "tag")
    project.create()
    if project.client.store.exists(expired_key(project.prefix, commit_id)):
        raise ExpiredCommit(_expired_message(project, commit_id, None))
    body = json.dumps({"commit": commit_id, "time": datetime.now(UTC).isoformat()}).encode()
    key = layout.tag_key(project.prefix, name)
    if not project.client.store.put(key, body, if_absent=True):
        there = tags(project).get(name)
        if there != commit_id:
            shown = there[:8] if there else "?"
            raise AlreadyExists(
                f"tag {name!r} of project {project.name!r} already names commit {shown}; "
                "tags never move"
            )
        return commit_id
    if settle(project, [commit_id]):  # a gc expired it before it saw the new tag
        project.client.store.delete(key)
        raise ExpiredCommit(_expired_message(project, commit_id, None))
    return commit_id


def tags(project: Project) -> dict[str, str]:
    """Tag name -> full commit id."""
    store, out = project.client.store, {}
    for key in store.list(layout.folder(project.prefix, layout.TAGS)):
        name = key.rsplit("/", 1)[-1]
        if not name.endswith(".json"):
            continue
        try:
            out[name[:-5]] = str(json.loads(store.get(key))["commit"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(f"tag object {key} is not a valid tag ({type(e).__name__})") from None
    return dict(sorted(out.items()))


def expired_key(prefix: str, commit_id: str, pending: bool = False) -> str:
    return layout.retention_key(prefix, commit_id, pending)


def settle(project: Project, commit_ids: list[str]) -> list[str]:
    """Those of ``commit_ids`` a gc expired, read *after* the caller committed a pin of
    them: a pending marker is waited for until that gc makes it final or drops it."""
    store, prefix, out = project.client.store, project.prefix, []
    for cid in sorted(set(commit_ids)):
        deadline = time.monotonic() + _SETTLE_S
        # pending first: gc writes the final marker before it drops the pending one
        while store.exists(expired_key(prefix, cid, pending=True)):
            if time.monotonic() > deadline:
                break  # a gc that died while deciding: it deleted nothing of this commit
            time.sleep(0.02)
        if store.exists(expired_key(prefix, cid)):
            out.append(cid)
    return out


def expired_error(project: Project, commit_id: str, table: str) -> ExpiredCommit | None:
    """The error for reading ``table`` at an expired commit, or None if it was not expired."""
    try:
        body = json.loads(project.client.store.get(expired_key(project.prefix, commit_id)))
    except NotFound:
        return None
    except ValueError:
        body = {}
    return ExpiredCommit(_expired_message(project, commit_id, table, body))


def _expired_message(
    project: Project, cid: str, table: str | None, body: dict | None = None
) -> str:
    body = body or {}
    what = f"table {table!r} at commit {cid[:8]}" if table else f"commit {cid[:8]}"
    days = body.get("keep_days")
    when = f" on {body['expired_at'][:10]}" if body.get("expired_at") else ""
    rule = f"gc --keep-days {days:g}" if isinstance(days, (int, float)) else "gc --keep-days"
    return (
        f"{what} of project {project.name!r} was expired by retention ({rule}{when}): its "
        "table versions are gone; tag commits (project.tag) to keep them readable"
    )


@dataclass
class Retention:
    """What gc keeps: table versions, and the commits it expires (with their tables)."""

    versions: dict[str, set[int]] = field(default_factory=dict)
    expired: dict[str, dict[str, int]] = field(default_factory=dict)  # new this run


def plan_retention(project: Project, keep_days: float | None, now: datetime) -> Retention:
    """The table versions to keep: every reachable commit's (no ``keep_days``), or only
    those of pinned or young commits; commits expired before stay expired."""
    store = project.client.store
    gone = {k.rsplit("/", 1)[-1][:-5] for k in store.list(layout.folder(project.prefix, EXPIRED))}
    heads = [h.commit_id for b in project.branches() if (h := project.refs.head(b))]
    roots = set(heads) | set(tags(project).values())
    pinned, pinned_versions = set(roots), set()
    if keep_days is not None:
        for cid in roots - gone:
            c, v = _run_record_pins(project, project.load_commit(cid))
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
            c = project.load_commit(cid)
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
                out.versions.setdefault(name, set()).add(v)
        else:
            candidates[cid] = dict(c.tables)
    for name, v in pinned_versions & named:
        out.versions.setdefault(name, set()).add(v)
    for cid, tables in candidates.items():
        lost = {n: v for n, v in tables.items() if v not in out.versions.get(n, set())}
        if lost:
            out.expired[cid] = lost
    return out


def mark_expired(
    project: Project, expired: dict[str, dict[str, int]], keep_days: float, pending: bool = False
) -> None:
    """Write the marker (``pending``: the first phase's) of every commit expired this run,
    before anything is deleted."""
    when = datetime.now(UTC).isoformat()
    for cid, tables in sorted(expired.items()):
        body = {"commit": cid, "tables": tables, "keep_days": keep_days, "expired_at": when}
        key = expired_key(project.prefix, cid, pending)
        project.client.store.put(key, json.dumps(body).encode())


def drop_pending(project: Project, commits: dict[str, dict[str, int]]) -> None:
    """Delete the pending markers of ``commits`` (after their final markers, if any)."""
    for cid in sorted(commits):
        project.client.store.delete(expired_key(project.prefix, cid, pending=True))


def _run_record_pins(project: Project, commit: object) -> tuple[set[str], set[tuple[str, int]]]:
    """Commits and (table, version) pairs named by run records in the checkpoint tables of
    ``commit``; a record gc cannot parse stops gc (it never guesses what a run needs)."""
    commits: set[str] = set()
    versions: set[tuple[str, int]] = set()
    for name, v in sorted(commit.tables.items()):
        ds = project.lance.open(name, v)
        if not _CHECKPOINT_COLUMNS <= set(ds.schema.names):
            continue
        for row, text in enumerate(ds.to_table(columns=["record"]).column("record").to_pylist()):
            try:
                record = json.loads(text)
                if record.get("project") not in (None, project.name):
                    continue
                for t in record["tables"]:
                    versions.add((str(t["name"]), int(t["version"])))
                    if t.get("commit"):
                        commits.add(str(t["commit"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise CorruptData(
                    f"gc of project {project.name!r} stopped before deleting anything: "
                    f"checkpoint table {name!r} version {v} row {row}: its run record cannot "
                    "be parsed, so what it pins is unknown"
                ) from None
    return commits, versions

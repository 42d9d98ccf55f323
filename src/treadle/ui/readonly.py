"""What keeps a GET from writing: a store that skips writes, and the table versions a
commit names (any other Lance version is a 404, never read as a table).

A read can want to write: the first read of a table version whose episode index is not
stored yet computes it and keeps it. The viewer's GETs read through a
:class:`ReadOnlyStore`, which computes the same values and keeps nothing. One
``append_episode`` moves a table from v1 to v3: v2 is a step of that commit, not a table
version anyone pinned, so the viewer serves only versions some commit names
(:class:`NamedVersions`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from treadle.catalog.client import Client
from treadle.errors import NotFound
from treadle.storage import Store

log = logging.getLogger("treadle.ui")


class ReadOnlyStore(Store):
    """``store``'s objects, read as ``store`` reads them; :meth:`put` and :meth:`delete`
    write nothing (what a read would have kept, it computes again next time)."""

    def __init__(self, store: Store):
        super().__init__(store.url, store._inner, store._lance_root, store._lance_options,
                         store.place)  # fmt: skip
        self.skipped = 0
        """Writes skipped so far (each read that wanted to keep something)."""

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if not self.skipped:
            log.info("treadle ui: a read wanted to keep %s; the viewer writes nothing", key)
        self.skipped += 1
        return False

    def delete(self, key: str) -> None:
        self.skipped += 1


class ViewerClient(Client):
    """The client of the viewer's GETs: ``client``'s root and options, a store that writes
    nothing, and only the table versions a commit names (:meth:`table`)."""

    def __init__(self, client: Client):
        super().__init__(client.root, client.storage_options)
        self.store = ReadOnlyStore(client.store)
        self.versions = NamedVersions(self)

    def table(self, project: str, table: str, version: int) -> Any:
        """Table ``table`` of ``project`` at ``version``, if a commit names that version."""
        proj = self.project(project, create=False)
        self.versions.check(project, table, version)
        return proj.table_at(table, version)


class NamedVersions:
    """The ``(table, version)`` pairs the commits of a project name: every commit
    reachable (through all parents) from a branch head or a tag. Commits are read newest
    first and only until the version asked for is found (a head's version costs one
    commit read, not the history); what was read is kept. A version still not found when
    every reachable commit has been read is NotFound."""

    def __init__(self, client: Client):
        self.client = client
        self._lock = threading.Lock()
        self._walked: dict[str, set[str]] = {}
        self._todo: dict[str, list[str]] = {}
        self._named: dict[str, set[tuple[str, int]]] = {}

    def check(self, project: str, table: str, version: int) -> None:
        """Nothing when a commit of ``project`` names ``table`` at ``version``; else NotFound."""
        with self._lock:
            if (table, version) in self._named.get(project, ()):
                return
        if self._walk(project, (table, version)):
            return
        with self._lock:
            versions = sorted(v for t, v in self._named[project] if t == table)
        if not versions:
            raise NotFound(f"no commit of project {project!r} names a table {table!r}")
        raise NotFound(
            f"table {table!r} v{version}: no commit of project {project!r} names this version "
            f"(the versions commits name: {', '.join(map(str, versions[-10:]))})"
        )

    def _walk(self, name: str, want: tuple[str, int]) -> bool:
        """Read commits of project ``name`` not read yet (the heads' first) until one
        names ``want``; whether one does."""
        project = self.client.project(name, create=False)
        starts = [project.branch(b).commit_id for b in project.branches()]
        starts += list(project.tags().values())
        with self._lock:  # one walker per viewer at a time: the walk state is shared
            walked = self._walked.setdefault(name, set())
            named = self._named.setdefault(name, set())
            todo = self._todo.setdefault(name, [])
            todo.extend(c for c in reversed(starts) if c not in walked)
            while todo and want not in named:
                cid = todo.pop()
                if cid in walked:
                    continue
                walked.add(cid)
                commit = project.load_commit(cid)
                named.update((t, int(v)) for t, v in commit.tables.items())
                todo.extend(p for p in reversed(commit.parents) if p not in walked)
            return want in named

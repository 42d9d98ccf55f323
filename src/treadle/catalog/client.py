"""The catalog: a :class:`Client` on a root holds projects; a project holds branches and commits."""

from __future__ import annotations

import difflib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from treadle import layout
from treadle.catalog import retention
from treadle.catalog.commit import Commit
from treadle.catalog.diff import resolve
from treadle.catalog.expiry import expired_error
from treadle.catalog.gc import GcReport, collect_garbage
from treadle.catalog.lance import LanceTables
from treadle.catalog.lru import Lru
from treadle.catalog.merge import MergesAndDiffs
from treadle.catalog.pins import check_pinned
from treadle.catalog.place import ProjectPlace
from treadle.catalog.purge import Purges
from treadle.catalog.refs import RefLog
from treadle.catalog.tableref import TableRef
from treadle.catalog.transaction import Transaction
from treadle.errors import ExpiredCommit, NotFound, StorageError
from treadle.names import check_case_apart, check_name
from treadle.stats.plan_stats import plan_stats
from treadle.stats.table_stats import table_stats
from treadle.storage import Store, redact
from treadle.table.table import EpisodeIndex, Table

if TYPE_CHECKING:
    import lance

MARKER = layout.MARKER  # written at a root on its first write: "this folder is a treadle store"
_COMMITS_KEPT = 16384  # commits a project keeps loaded (a long-lived writer makes one a write)
_LAYOUT = {MARKER, "projects"}  # what a root holds; a root with anything else is not ours


class Client:
    """Entry point: a store root (local path or ``s3://``/``gs://``/``az://``/``file://`` URL).

    ``root=None`` uses ``$TREADLE_ROOT`` or ``~/.treadle`` (created if missing). An
    explicit local root must exist unless ``create=True``. Credentials come from
    ``storage_options`` or the environment and are never printed or stored.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        create: bool = False,
    ):
        self.store = Store.open(root, storage_options, create=create)
        self._storage_options = dict(storage_options or {})
        self._projects: dict[str, Project] = {}
        self._lock = threading.Lock()
        self._marked = False

    @property
    def root(self) -> str:
        return self.store.url

    @property
    def storage_options(self) -> dict[str, Any]:
        """The options this client was opened with (pass them on to other processes)."""
        return dict(self._storage_options)

    def __repr__(self) -> str:
        opts = f", storage_options={redact(self._storage_options)}" if self._storage_options else ""
        return f"Client({self.root!r}{opts})"

    def projects(self) -> list[str]:
        """Names of the projects under this root."""
        return [
            p
            for p in self.store.list_dirs(layout.PROJECTS)
            if self.store.list_dirs(layout.folder(layout.project_prefix(p), layout.REFS))
        ]

    def project(self, name: str, *, create: bool = True) -> Project:
        """Open project ``name``.

        A project that does not exist yet is created by its first write (a transaction or
        :meth:`Project.create_branch`), not by this call: until then reading from it (its
        log, its tables) raises :class:`NotFound` naming it, with close matches. With
        ``create=False`` a missing project raises :class:`NotFound` here.
        """
        check_name(name, "project")
        with self._lock:
            proj = self._projects.get(name)
        if proj is None:
            proj = Project(self, name)
        if not proj.exists() and not create:  # one LIST: a wrong root or credentials fail here
            raise proj.not_found()
        with self._lock:
            return self._projects.setdefault(name, proj)

    def foreign_entries(self) -> list[str]:
        """Names at the root that are not treadle's: a root with any is not a treadle store."""
        return [n for n in self.store.entries("") if n not in _LAYOUT]

    def prepare_write(self) -> None:
        """Check (once per client) that the root is a treadle store before the first write.

        A root with the marker object is one; so is an empty root, or one holding only
        treadle's layout (stores written before the marker existed): the marker is written.
        Anything else (a folder with other files) is refused with :class:`StorageError`.
        """
        if self._marked:
            return
        if not self.store.exists(MARKER):
            foreign = self.foreign_entries()
            if foreign:
                more = ", ..." if len(foreign) > 5 else ""
                shown = ", ".join(repr(n) for n in foreign[:5]) + more
                raise StorageError(
                    f"root {self.root!r} is not a treadle store: it holds {shown} and no "
                    f"{MARKER}; use an empty folder (or a new prefix) or an existing treadle root"
                )
            body = json.dumps({"treadle": "store", "format": 1}).encode()
            self.store.put(MARKER, body, if_absent=True)
        self._marked = True

    def _suggest(self, name: str) -> str:
        """``"; did you mean 'x'?"`` for close project names (or the list, or none)."""
        names = self.projects()
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if close:
            return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
        if names:
            return f"; projects: {', '.join(names[:10])}" + (", ..." if len(names) > 10 else "")
        return "; the root has no projects"


class Project(MergesAndDiffs, Purges):
    """A namespace of tables with git-like history (:mod:`.merge`, :mod:`.purge`)."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name
        self.prefix = layout.project_prefix(name)
        self.place = ProjectPlace(client.store, self.prefix, name)  # what gc, retention see
        self.refs = RefLog(client.store, self.prefix)
        self._commits: Lru[str, Commit] = Lru(_COMMITS_KEPT)  # a writer's: bounded
        self.lance = LanceTables(self.place, self._absent)  # every Lance call on its tables
        self._exists = False

    def __repr__(self) -> str:
        return f"Project({self.name!r})"

    @property
    def store(self) -> Store:
        """The store of the project's client (every key under :attr:`prefix`)."""
        return self.client.store

    def exists(self) -> bool:
        """Whether the project has been created (it has a branch) in the store."""
        if not self._exists:
            self._exists = self.refs.head("main") is not None or bool(self.refs.branches())
        return self._exists

    def _absent(self) -> NotFound | None:
        return None if self.exists() else self.not_found()

    def not_found(self) -> NotFound:
        """The error for reading from this project while it does not exist."""
        return NotFound(
            f"project {self.name!r} not found under {self.client.root}"
            + self.client._suggest(self.name)
        )

    def create(self) -> None:
        """Create the project now (an empty ``main``) unless it exists; every write calls this
        first, after checking the root is a treadle store."""
        self.client.prepare_write()
        if self.exists():
            return
        check_case_apart(self.name, self.client.projects(), "project", "this root")
        root = Commit.create([], f"create project {self.name}", {})
        self.save_commit(root)
        self.refs.try_advance("main", 0, root.id)  # a racing creator may win: fine
        self._exists = True

    def branch(self, name: str = "main") -> Branch:
        """An existing branch (:class:`NotFound` otherwise; ``main`` of a project not yet
        created is a handle whose first write creates the project)."""
        check_name(name, "branch")
        if self.refs.head(name) is None:
            if not self.exists():
                if name == "main":
                    return Branch(self, name)
                raise self.not_found()
            raise NotFound(
                f"branch {name!r} not found in project {self.name!r}; branches: {self.branches()}"
            )
        return Branch(self, name)

    def create_branch(self, name: str, from_: str = "main") -> Branch:
        """A new branch at ``from_``: a branch's head, a tag's commit or a commit id/prefix;
        a commit retention expired is :class:`ExpiredCommit`."""
        check_name(name, "branch")
        self.create()
        commit_id = resolve(self, from_).id
        retention.branch(self.place, self.refs, name, commit_id)
        return Branch(self, name)

    def branches(self) -> list[str]:
        return self.refs.branches()

    # -- commits -----------------------------------------------------------------------
    def save_commit(self, commit: Commit) -> None:
        key = layout.commit_key(self.prefix, commit.id)
        self.client.store.put(key, commit.to_bytes(), if_absent=True)
        self._commits.setdefault(commit.id, commit)

    def load_commit(self, commit_id: str) -> Commit:
        c = self._commits.get(commit_id)
        if c is None:
            data = self.client.store.get(layout.commit_key(self.prefix, commit_id))
            c = self._commits.setdefault(commit_id, Commit.from_bytes(data, expect_id=commit_id))
        return c

    def commit(self, id_or_prefix: str) -> Commit:
        """A commit by full id or unique prefix (at least 4 hex characters)."""
        s = str(id_or_prefix).lower()
        if len(s) < 4 or any(ch not in "0123456789abcdef" for ch in s):
            raise NotFound(f"{id_or_prefix!r} is not a commit id or prefix (4+ hex characters)")
        if len(s) == 64:
            try:
                return self.load_commit(s)
            except NotFound:
                raise NotFound(f"commit {s[:8]} not found in project {self.name!r}") from None
        ids = [
            k.rsplit("/", 1)[-1][:-5]
            for k in self.client.store.list(layout.folder(self.prefix, layout.COMMITS))
            if k.rsplit("/", 1)[-1].startswith(s)
        ]
        if not ids:
            if not self.exists():
                raise self.not_found()
            raise NotFound(f"commit {s!r} not found in project {self.name!r}")
        if len(ids) > 1:
            raise NotFound(f"commit prefix {s!r} is ambiguous in project {self.name!r}: {ids[:5]}")
        return self.load_commit(ids[0])

    def iter_commits(self, start: str) -> Iterator[Commit]:
        """``start`` and its first-parent ancestors, newest first."""
        cid: str | None = start
        while cid:
            c = self.load_commit(cid)
            yield c
            cid = c.parents[0] if c.parents else None

    def table_uri(self, name: str) -> str:  # where table ``name``'s Lance dataset lives
        return self.lance.uri(name)

    def open_dataset(
        self, name: str, version: int, commit_id: str | None = None
    ) -> lance.LanceDataset:
        """Lance ``version`` of table ``name`` (cached); ``commit_id``, the commit it was
        read through, names it in the :class:`ExpiredCommit` raised if retention took it."""
        return self.lance.open(name, version, commit_id)

    def expired(self, name: str, commit_id: str) -> ExpiredCommit | None:
        """:class:`ExpiredCommit` of table ``name`` at ``commit_id`` if retention took it."""
        return expired_error(self.place, commit_id, name)

    def table_at(self, name: str, version: int, commit_id: str | None = None) -> Table:
        """Table ``name`` pinned at Lance ``version`` (what a run record names), through
        ``commit_id`` if given: a commit of this project naming that version."""
        check_name(name, "table")
        check_pinned(self, name, version, commit_id)  # not the version alone: another store's
        self.lance.open(name, version, commit_id)
        return Table(self, name, version, commit_id)

    def episode_index(self, table: Table) -> EpisodeIndex:
        """The episode index of a pinned table of this project (cached per version)."""
        return self.lance.episode_index(table)

    # -- statistics, computed here and kept in the project -------------------------------
    def table_stats(
        self, table: Table, columns: Sequence[str] | str | None = None, **options: Any
    ) -> dict[str, Any]:
        """:meth:`Table.stats` of a pinned table of this project (``options``: its keywords);
        an executor's tasks open the project from its :class:`ProjectAddress`."""
        return table_stats(table, columns, address=ProjectAddress.of(self), **options)

    def plan_stats(
        self, plan: Any, columns: Sequence[str] | str | None = None, **options: Any
    ) -> dict[str, Any]:
        """``plan.stats`` (``options``: its keywords) of a plan whose first table is this
        project's: its statistics are kept here."""
        return plan_stats(plan, columns, **options)

    def gc(
        self, older_than: timedelta = timedelta(hours=1), *, keep_days: float | None = None
    ) -> GcReport:
        """Remove table versions and media no commit reaches (see :mod:`treadle.catalog.gc`).

        ``keep_days``: also expire the table versions of commits older than that which no
        branch head, tag or checkpoint run record pins (reading them then raises
        :class:`ExpiredCommit`); None (the default) keeps every reachable commit readable.
        """
        return collect_garbage(self, older_than, keep_days=keep_days)

    def address(self) -> ProjectAddress:  # how another process (a Ray task) opens it
        return ProjectAddress.of(self)

    def tag(self, name: str, commit: str) -> Commit:
        """Name ``commit`` (an id or unique prefix) ``name`` forever: gc keeps it readable
        whatever the retention. Tags never move (:class:`AlreadyExists` otherwise)."""
        c = self.commit(commit)
        check_name(name, "tag")
        self.create()
        retention.tag(self.place, name, c.id)
        return c

    def tags(self) -> dict[str, str]:
        """Tag name -> full commit id."""
        return retention.tags(self.place)


@dataclass(frozen=True)
class ProjectAddress:
    """A project as another process opens it (the Ray tasks of an import and of
    ``table.stats(executor=...)``): root URL, storage options (never shown), name."""

    root: str
    storage_options: dict[str, Any]
    name: str

    @classmethod
    def of(cls, project: Project) -> ProjectAddress:
        return cls(project.client.root, project.client.storage_options, project.name)

    def open(self) -> Project:
        """The project, opened here (it must exist: :class:`NotFound` otherwise)."""
        return Client(self.root, self.storage_options).project(self.name, create=False)

    def __repr__(self) -> str:  # never show storage options
        return f"ProjectAddress({self.root!r}, {self.name!r})"


class Branch:
    """A named, moving pointer to a commit of a project."""

    def __init__(self, project: Project, name: str):
        self.project = project
        self.name = name

    def __repr__(self) -> str:
        return f"Branch({self.project.name}/{self.name})"

    @property
    def commit_id(self) -> str:
        head = self.project.refs.head(self.name)
        if head is None:
            if not self.project.exists():
                raise self.project.not_found()
            raise NotFound(f"branch {self.name!r} of project {self.project.name!r} is gone")
        return head.commit_id

    def head(self) -> Commit:
        return self.project.load_commit(self.commit_id)

    def log(self, limit: int | None = None) -> list[Commit]:
        """Commits of this branch, newest first (first-parent history)."""
        out = []
        for c in self.project.iter_commits(self.commit_id):
            if limit is not None and len(out) >= limit:
                break
            out.append(c)
        return out

    def tables(self) -> list[str]:
        return sorted(self.head().tables)

    def table(self, name: str) -> TableRef:
        check_name(name, "table")
        return TableRef(self, name)

    def transaction(self, message: str = "transaction") -> Transaction:
        """Several writes as one commit: ``with branch.transaction("msg") as tx: ...``
        (the first write to a project not yet created creates it and marks the root)."""
        self.project.create()
        return Transaction(self, message)

"""What gc and retention read of a project (:class:`History`), and what a transaction
writes through (:class:`Repository`): Protocols a :class:`~treadle.catalog.client.Project`
satisfies, so that neither module imports the client (which creates them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from treadle.table.table import TableSource

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.catalog.lance import LanceTables
    from treadle.catalog.place import ProjectPlace
    from treadle.catalog.refs import RefLog
    from treadle.table.table import Table


class History(Protocol):
    """A project's place, its branches' refs, its commits and its Lance handle."""

    refs: RefLog

    @property
    def place(self) -> ProjectPlace: ...

    @property
    def lance(self) -> LanceTables: ...

    def branches(self) -> list[str]: ...

    def load_commit(self, commit_id: str) -> Commit: ...


class Repository(History, TableSource, Protocol):
    """A :class:`History` a transaction commits to: it saves commits, and its tables'
    versions are read (a :class:`~treadle.table.table.TableSource`)."""

    def save_commit(self, commit: Commit) -> None: ...

    def address(self) -> Any:
        """How another process opens the project (a ``ProjectAddress``)."""
        ...


class Merging(Repository, Protocol):
    """A :class:`Repository` whose branches merge and whose commits are compared
    (:mod:`treadle.catalog.merge`, :mod:`treadle.catalog.diff`)."""

    name: str

    def table_at(self, name: str, version: int, commit_id: str | None = None) -> Table: ...

    def commit(self, id_or_prefix: str) -> Commit: ...

    def tags(self) -> dict[str, str]: ...

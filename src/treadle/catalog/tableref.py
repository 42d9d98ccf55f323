"""A table by name on a branch (:class:`TableRef`): pinned to a :class:`Table` when read.

Writes through a reference are one commit each on its branch; reads resolve the branch
head (or a commit, or a Lance version) to a pinned :class:`~treadle.table.table.Table`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from treadle.catalog.commit import Commit
from treadle.catalog.ref_edits import EditsInOneCommit
from treadle.errors import NotFound
from treadle.table.table import ScanRequest, Table, TableSource

if TYPE_CHECKING:
    from treadle.catalog.transaction import Transaction


class TablesOf(TableSource, Protocol):
    """What a :class:`TableRef` uses of its branch's project (a :class:`treadle.Project`)."""

    def table_at(self, name: str, version: int, commit_id: str | None = None) -> Table: ...

    def commit(self, id_or_prefix: str) -> Commit: ...


class BranchOf(Protocol):
    """What a :class:`TableRef` uses of its branch (a :class:`treadle.Branch`, which makes
    references: this module does not import it)."""

    name: str

    @property
    def project(self) -> TablesOf: ...

    def head(self) -> Commit: ...

    def transaction(self, message: str = ...) -> Transaction: ...


class TableRef(EditsInOneCommit):
    """A table by name on a branch; resolved to a :class:`Table` when read or planned."""

    def __init__(self, branch: BranchOf, name: str):
        self.branch = branch
        self.name = name

    def __repr__(self) -> str:
        return f"TableRef({self.branch.project.name}/{self.name} @ {self.branch.name})"

    def pin(self) -> Table:
        """The table at the branch head, now."""
        head = self.branch.head()
        return self._from_commit(head)

    def at(self, commit_or_version: str | int) -> Table:
        """The table as of a commit (id or unique prefix) or a Lance version number."""
        if isinstance(commit_or_version, int) and not isinstance(commit_or_version, bool):
            try:
                return self.branch.project.table_at(self.name, commit_or_version)
            except NotFound as e:
                raise NotFound(self._no_version(commit_or_version, e)) from None
        return self._from_commit(self.branch.project.commit(str(commit_or_version)))

    def _no_version(self, version: int, e: NotFound) -> str:
        """Why Lance ``version`` of this table cannot be read, with the versions that can."""
        named: list[int] = []
        for c in self.branch.log():  # newest first: the versions this branch's commits name
            v = c.tables.get(self.name)
            if v is not None and v not in named:
                named.append(v)
            if len(named) == 10:
                break
        return (
            f"table {self.name!r} of project {self.branch.project.name!r} has no version "
            f"{version}: gc removes a version no commit names (a write inside a transaction, "
            f"a compaction's step), and some were never made; versions "
            f"branch {self.branch.name!r}'s commits name, newest first: {named} "
            f"(Lance said: {str(e)[:200]})"
        )

    def _from_commit(self, commit: Commit) -> Table:
        if self.name not in commit.tables:
            close = difflib.get_close_matches(self.name, list(commit.tables), n=3, cutoff=0.8)
            guess = "; did you mean " + " or ".join(map(repr, close)) + "?" if close else ""
            raise NotFound(
                f"table {self.name!r} not found in project {self.branch.project.name!r} at "
                f"{commit.short_id} (branch {self.branch.name!r}){guess}; tables: "
                f"{sorted(commit.tables)}"
            )
        return Table(self.branch.project, self.name, commit.tables[self.name], commit.id)

    # writes: each is one commit on the branch
    def append(self, data: pa.Table | dict[str, Any], message: str | None = None) -> Commit:
        """Append rows (an Arrow table or a dict of columns) in one commit."""
        with self.branch.transaction(message or f"append to {self.name}") as tx:
            tx.table(self.name).append(data)
        return tx.commit

    def append_episode(
        self,
        columns: dict[str, Any],
        episode: str | None = None,
        message: str | None = None,
        fps: float | None = None,
        column_metadata: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Commit:
        """Append one episode (every column ``[T, ...]``, video columns as ``VideoFrames``);
        ``fps`` sets the table's frame rate (a video column's rate does too);
        ``column_metadata`` (``{column: {name: JSON value}}``): :meth:`column_metadata`."""
        with self.branch.transaction(message or f"append episode to {self.name}") as tx:
            tx.table(self.name).append_episode(
                columns, episode=episode, fps=fps, column_metadata=column_metadata
            )
        return tx.commit

    # reads of the head
    @property
    def num_moments(self) -> int:
        return self.pin().num_moments

    @property
    def num_episodes(self) -> int:
        return self.pin().num_episodes

    @property
    def schema(self) -> pa.Schema:
        return self.pin().schema

    @property
    def fps(self) -> float | None:
        return self.pin().fps

    @property
    def metadata(self) -> dict[str, Any]:
        """:attr:`Table.metadata` at the branch head (what an import's source said)."""
        return self.pin().metadata

    def episode_sets(self) -> dict[str, list[str]]:
        """:meth:`Table.episode_sets` at the branch head (robomimic's filter keys)."""
        return self.pin().episode_sets()

    def column_metadata(self, column: str) -> dict[str, Any]:
        """:meth:`Table.column_metadata` at the branch head (a column's joint names)."""
        return self.pin().column_metadata(column)

    def to_arrow(self, columns: Sequence[str] | None = None, filter: str | None = None) -> pa.Table:
        return self.pin().to_arrow(columns, filter)

    def take(
        self, rows: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return self.pin().take(rows, columns)

    def scan_request(self, columns: Sequence[str], filter: str | None = None) -> ScanRequest:
        return self.pin().scan_request(columns, filter)

    def stats(self, columns: Sequence[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """:meth:`Table.stats` of the table at the branch head."""
        return self.pin().stats(columns, **kwargs)

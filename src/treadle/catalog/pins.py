"""A table pinned through a commit: the commit must be one of the project's, naming that version.

A run record (a loader state, a checkpoint row) names its project by name and each table by
commit and Lance version, not the store. Opened in another store whose project of that name
has the table at the same version number, the version alone would read that store's rows
as the run's; the commit, which only the run's store (or a copy of it) holds, tells them apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from treadle.errors import NotFound

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.storage import Store


class Commits(Protocol):
    """What is read of a project: its name, its store and its commits."""

    name: str

    @property
    def store(self) -> Store: ...

    def load_commit(self, commit_id: str) -> Commit: ...


def check_pinned(project: Commits, name: str, version: int, commit_id: str | None) -> None:
    """:class:`NotFound` unless commit ``commit_id`` (None: nothing to check) of ``project``
    names table ``name`` at Lance ``version``: a record of a project of the same name in
    another store."""
    if commit_id is None:
        return
    where = f"project {project.name!r} under {project.store.url!r}"
    try:
        named = project.load_commit(commit_id).tables.get(name)
    except NotFound:
        raise NotFound(
            f"table {name!r} version {version} is pinned through commit {commit_id[:8]}, which "
            f"{where} does not hold: the run record is of a project {project.name!r} in another "
            "store; open the store (root, endpoint) the run was planned in"
        ) from None
    if named != int(version):
        raise NotFound(
            f"commit {commit_id[:8]} of {where} names table {name!r} at version {named}, not "
            f"version {version} as pinned: the run record is of another store's project"
        )

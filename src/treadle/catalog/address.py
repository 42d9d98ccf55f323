"""A project as another process opens it (:class:`ProjectAddress`): the Ray tasks of an
import (:mod:`treadle.importers.ray_executor`) and of ``table.stats(executor=...)``
(:mod:`treadle.stats.table_stats`) each open the project from this value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treadle.catalog.client import Client, Project


@dataclass(frozen=True)
class ProjectAddress:
    """A project's root URL, the storage options its client was opened with, and its name:
    picklable, and its repr never shows the options."""

    root: str
    storage_options: dict[str, Any]
    name: str

    @classmethod
    def of(cls, project: Project) -> ProjectAddress:
        client = project.client
        return cls(client.root, client.storage_options, project.name)

    def open(self) -> Project:
        """The project, opened here (it must exist: :class:`NotFound` otherwise)."""
        return Client(self.root, self.storage_options).project(self.name, create=False)

    def __repr__(self) -> str:  # never show storage options
        return f"ProjectAddress({self.root!r}, {self.name!r})"

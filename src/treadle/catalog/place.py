"""Where a project's objects are (:class:`ProjectPlace`): its store and key prefix.

gc, retention, the expiry markers and the project's Lance handle
(:mod:`treadle.catalog.lance`) are given this value, not the
:class:`~treadle.catalog.client.Project`: they read and write under the prefix and reach
nothing of the client.
"""

from __future__ import annotations

from dataclasses import dataclass

from treadle.storage import Store


@dataclass(frozen=True)
class ProjectPlace:
    """A project's store, its key prefix (:func:`treadle.layout.project_prefix`) and its name
    (for messages)."""

    store: Store
    prefix: str
    name: str

    def __repr__(self) -> str:  # never the store's options
        return f"ProjectPlace({self.name!r})"

"""Metadata and named episode sets an import's source shipped (robomimic's ``env_args`` and
filter keys), kept beside the table version the import committed.

``table.metadata`` and ``table.episode_sets()`` read the newest kept record of a version on
the pinned version's own history (the commits it was read through and their ancestors), so
they survive later appends; ``episode_sets`` lists only the episodes the pinned version
still has. Branches share one Lance dataset, so a record of a higher version number may be
another branch's import: numbers alone are used only for a version pinned by number.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Protocol

from treadle import layout
from treadle.errors import CorruptData

if TYPE_CHECKING:
    from treadle.storage import Store

_VERSION = re.compile(r"/v(\d+)/meta\.json$")


class _Place(Protocol):
    prefix: str

    @property
    def store(self) -> Store: ...

    def load_commit(self, commit_id: str) -> Any: ...


class Pinned(Protocol):
    """What this module uses of a pinned :class:`~treadle.table.table.Table`."""

    name: str
    version: int
    commit_id: str | None

    @property
    def project(self) -> _Place: ...


def put_source_meta(
    table: Pinned, metadata: dict[str, Any], episode_sets: dict[str, list[str]], source: str
) -> None:
    """Keep ``metadata`` (JSON values) and ``{set name: [episode, ...]}`` from ``source``."""
    body = {"source": source, "metadata": metadata, "episode_sets": episode_sets}
    key = layout.source_meta_key(table.project.prefix, table.name, table.version)
    table.project.store.put(key, json.dumps(body, sort_keys=True, default=str).encode())


def source_meta(table: Pinned) -> dict[str, Any]:
    """The newest record :func:`put_source_meta` kept of a version on ``table``'s history:
    ``{"source", "metadata", "episode_sets"}`` ({} when no import kept one)."""
    store = table.project.store
    folder = layout.stats_folder(table.project.prefix, table.name, 0).rsplit("/", 1)[0]
    records: dict[int, str] = {}
    for key in store.list(folder):
        m = _VERSION.search("/" + key)
        if m and int(m.group(1)) <= table.version:
            records[int(m.group(1))] = key
    version = _on_history(table, set(records)) if records else None
    if version is None:
        return {}
    key = records[version]
    try:
        body = json.loads(store.get(key))
        return {k: body[k] for k in ("source", "metadata", "episode_sets")}
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptData(f"table {table.name!r}: malformed {key}: {e}") from None


def _on_history(table: Pinned, versions: set[int]) -> int | None:
    """The newest of ``versions`` the table's history holds: walking back from the commit
    it was read through (a table's versions only grow along its history, so a path stops
    below the best found); the newest by number for a version pinned by number."""
    if table.commit_id is None:
        return max(versions)
    project, name, floor = table.project, table.name, min(versions)
    best: int | None = None
    seen, todo = {table.commit_id}, [table.commit_id]
    while todo:
        commit = project.load_commit(todo.pop())
        v = commit.tables.get(name)
        if v is None or v < floor or (best is not None and v <= best):
            continue
        if v in versions:
            best = v
            continue
        for parent in commit.parents:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return best

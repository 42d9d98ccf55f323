"""Metadata and named episode sets an import's source shipped (robomimic's ``env_args`` and
filter keys), kept beside the table version the import committed.

``table.metadata`` and ``table.episode_sets()`` read the newest kept record at or before the
pinned version, so they survive later appends; ``episode_sets`` lists only the episodes the
pinned version still has.
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


class Pinned(Protocol):
    """What this module uses of a pinned :class:`~treadle.table.table.Table`."""

    name: str
    version: int

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
    """The newest record :func:`put_source_meta` kept at or before ``table.version``:
    ``{"source", "metadata", "episode_sets"}`` ({} when no import kept one)."""
    store = table.project.store
    folder = layout.stats_folder(table.project.prefix, table.name, 0).rsplit("/", 1)[0]
    best: tuple[int, str] | None = None
    for key in store.list(folder):
        m = _VERSION.search("/" + key)
        if m and int(m.group(1)) <= table.version and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), key)
    if best is None:
        return {}
    key = best[1]
    try:
        body = json.loads(store.get(key))
        return {k: body[k] for k in ("source", "metadata", "episode_sets")}
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptData(f"table {table.name!r}: malformed {key}: {e}") from None

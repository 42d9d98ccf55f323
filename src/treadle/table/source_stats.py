"""Statistics a source shipped for a table version (e.g. LeRobot's ``meta/stats.json``),
kept as given beside the version's own statistics."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from treadle import layout
from treadle.errors import NotFound

if TYPE_CHECKING:
    from treadle.storage import Store


class _Place(Protocol):
    prefix: str

    @property
    def store(self) -> Store: ...


class Pinned(Protocol):
    """What this module uses of a pinned :class:`~treadle.table.table.Table` (which reads
    it: this module does not import it)."""

    name: str
    version: int

    @property
    def project(self) -> _Place: ...


def _key(table: Pinned) -> str:
    return layout.source_stats_key(table.project.prefix, table.name, table.version)


def put_source_stats(table: Pinned, columns: dict[str, dict[str, Any]], source: str) -> None:
    """Keep ``{column: {"mean": [...], ...}}`` from ``source`` beside this version's stats."""
    body = {"source": source, "columns": columns}
    table.project.store.put(_key(table), json.dumps(body, sort_keys=True).encode())


def source_stats(table: Pinned) -> dict[str, dict[str, Any]]:
    """What :func:`put_source_stats` kept for this version: ``{column: {field: array}}``
    plus ``"source"`` in each entry ({} when the source had none)."""
    try:
        body = json.loads(table.project.store.get(_key(table)))
    except NotFound:
        return {}
    return {
        c: {"source": body["source"], **{k: np.asarray(v) for k, v in d.items()}}
        for c, d in body["columns"].items()
    }

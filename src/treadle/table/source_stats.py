"""Statistics a source shipped for a table version (e.g. LeRobot's ``meta/stats.json``),
kept as given beside the version's own statistics."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from treadle.errors import NotFound


def _key(table: Any) -> str:
    return f"{table.project.prefix}/stats/{table.name}/v{table.version}/source.json"


def put_source_stats(table: Any, columns: dict[str, dict[str, Any]], source: str) -> None:
    """Keep ``{column: {"mean": [...], ...}}`` from ``source`` beside this version's stats."""
    body = {"source": source, "columns": columns}
    table.project.client.store.put(_key(table), json.dumps(body, sort_keys=True).encode())


def source_stats(table: Any) -> dict[str, dict[str, Any]]:
    """What :func:`put_source_stats` kept for this version: ``{column: {field: array}}``
    plus ``"source"`` in each entry ({} when the source had none)."""
    try:
        body = json.loads(table.project.client.store.get(_key(table)))
    except NotFound:
        return {}
    return {
        c: {"source": body["source"], **{k: np.asarray(v) for k, v in d.items()}}
        for c, d in body["columns"].items()
    }

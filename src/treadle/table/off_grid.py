"""Video columns whose frames are not shown on the table's fps grid, kept in the schema.

A table's rows are moments at its fps and a video's display frame ``k`` is row ``k``; a
window in seconds becomes frame offsets with the fps alone, which is right only where
frame ``k`` is shown at ``k / fps``. Each write measures how far its streams' frame times
are off that grid (:mod:`treadle.video.frame_grid`: a variable-frame-rate file, or a
``VideoFile`` whose timestamps do not follow its rate) and records, per video column, the
largest deviation any episode has and that episode, under ``treadle:off_grid`` in the
schema's metadata (``{column: {"deviation_s": s, "episode": name}}``). A plan reads it
with the table's fps and refuses ``Video(seconds=...)`` over a column recorded further
off than the spec's ``tolerance_s`` (frame offsets are not affected). Streams on the grid
record nothing; tables written before the record was kept have none.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

__all__ = ["OFF_GRID_KEY", "merge_off_grid", "recorded_off_grid", "with_off_grid"]

OFF_GRID_KEY = b"treadle:off_grid"


def recorded_off_grid(schema: pa.Schema | None) -> dict[str, dict[str, Any]]:
    """``{column: {"deviation_s": seconds, "episode": name}}`` of the off-grid columns."""
    raw = (schema.metadata or {}).get(OFF_GRID_KEY) if schema is not None else None
    return json.loads(raw) if raw else {}


def _recording(schema: pa.Schema, record: dict[str, dict[str, Any]]) -> pa.Schema:
    meta = dict(schema.metadata or {})
    meta[OFF_GRID_KEY] = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return schema.with_metadata(meta)


def _merged(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any] | None:
    """``mine`` with each column's larger deviation of the two; None when unchanged."""
    out, changed = dict(mine), False
    for col, rec in theirs.items():
        if col not in out or rec["deviation_s"] > out[col]["deviation_s"]:
            out[col], changed = dict(rec), True
    return out if changed else None


def with_off_grid(schema: pa.Schema, column: str, deviation_s: float, episode: str) -> pa.Schema:
    """``schema`` recording that ``episode``'s stream of ``column`` is ``deviation_s`` off
    the grid (kept only where it is the column's largest so far)."""
    if not deviation_s > 0:
        return schema
    rec = {column: {"deviation_s": float(deviation_s), "episode": episode}}
    out = _merged(recorded_off_grid(schema), rec)
    return schema if out is None else _recording(schema, out)


def merge_off_grid(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the off-grid columns of both (rows staged or committed apart)."""
    out = _merged(recorded_off_grid(schema), recorded_off_grid(other))
    return schema if out is None else _recording(schema, out)

"""Video columns whose frames are not shown on the table's fps grid, kept in the schema.

A table's rows are moments at its fps and a video's display frame ``k`` is row ``k``; a
window in seconds becomes frame offsets with the fps alone, which is right only where
frame ``k`` is shown at ``k / fps``. Each write measures how far its streams' frame times
are off that grid (:mod:`treadle.video.frame_grid`: a variable-frame-rate file, or a
``VideoFile`` whose timestamps do not follow its rate) and records it per video column and
episode under ``treadle:off_grid`` in the schema's metadata::

    {column: {"episodes": {name: deviation_s, ...},      # at most MAX_EPISODES, the largest
              "more_s": s, "more_episode": name | None,   # a bound on the episodes left out
              "deviation_s": s, "episode": name | None}}  # the largest of all (its episode)

so that deleting or purging episodes (:func:`off_grid_without`) takes theirs out and the
largest left is known again. Past ``MAX_EPISODES`` the smallest deviation leaves the list
for ``more_s``, the largest deviation of an episode not listed: a bound kept after its
episode is deleted (``more_episode`` None), so a plan may refuse where no episode left is
that far off, never the other way. A record written by an earlier treadle kept only
``deviation_s`` and ``episode`` (the largest): it is read as that bound.

A plan reads :func:`recorded_off_grid` with the table's fps and refuses
``Video(seconds=...)`` over a column recorded further off than the spec's ``tolerance_s``
(frame offsets are not affected). Streams on the grid record nothing; tables written
before the record was kept have none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from treadle.errors import PlanError

__all__ = [
    "MAX_EPISODES",
    "OFF_GRID_KEY",
    "check_on_grid",
    "merge_off_grid",
    "off_grid_without",
    "recorded_off_grid",
    "with_off_grid",
]

OFF_GRID_KEY = b"treadle:off_grid"
#: Episodes a column's record names (the furthest off); the others are one bound.
MAX_EPISODES = 64


def _raw(schema: pa.Schema | None) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(OFF_GRID_KEY) if schema is not None else None
    return json.loads(raw) if raw else {}


def _entry(rec: dict[str, Any]) -> dict[str, Any]:
    """A column's record as ``{"episodes", "more_s", "more_episode"}`` (an earlier
    treadle's ``{"deviation_s", "episode"}``: that bound)."""
    if "episodes" not in rec:
        return {
            "episodes": {},
            "more_s": float(rec["deviation_s"]),
            "more_episode": rec.get("episode"),
        }
    return {
        "episodes": {str(k): float(v) for k, v in rec["episodes"].items()},
        "more_s": float(rec.get("more_s", 0.0)),
        "more_episode": rec.get("more_episode"),
    }


def _finished(entry: dict[str, Any]) -> dict[str, Any] | None:
    """``entry`` trimmed to :data:`MAX_EPISODES` (the smallest left out, into the bound),
    with its largest deviation and that episode; None when nothing is off the grid."""
    eps = dict(sorted(entry["episodes"].items(), key=lambda kv: (-kv[1], kv[0])))
    more_s, more_ep = entry["more_s"], entry["more_episode"]
    while len(eps) > MAX_EPISODES:
        name, dev = eps.popitem()
        if dev > more_s:
            more_s, more_ep = dev, name
    if not eps and not more_s > 0:
        return None
    out: dict[str, Any] = {"episodes": eps}
    if more_s > 0:
        out["more_s"], out["more_episode"] = more_s, more_ep
    top = next(iter(eps.items()), (None, 0.0))
    if top[1] >= more_s:
        out["deviation_s"], out["episode"] = top[1], top[0]
    else:
        out["deviation_s"], out["episode"] = more_s, more_ep
    return out


def recorded_off_grid(schema: pa.Schema | None) -> dict[str, dict[str, Any]]:
    """``{column: {"deviation_s": seconds, "episode": name or None, ...}}`` of the off-grid
    columns (``episode`` None: the episode of the largest deviation is not known, see the
    module docstring)."""
    out = {}
    for col, rec in _raw(schema).items():
        entry = _finished(_entry(rec))
        if entry is not None:
            out[col] = entry
    return out


def _recording(schema: pa.Schema, record: dict[str, dict[str, Any]]) -> pa.Schema:
    meta = dict(schema.metadata or {})
    text = _text(record)
    if text is None:
        meta.pop(OFF_GRID_KEY, None)
    else:
        meta[OFF_GRID_KEY] = text.encode()
    return schema.with_metadata(meta)


def _text(record: dict[str, dict[str, Any]]) -> str | None:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) if record else None


def _merged(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any] | None:
    """``mine`` with ``theirs``'s episodes too (each episode's larger deviation, the larger
    bound); None when unchanged."""
    out = dict(mine)
    for col, rec in theirs.items():
        a = (
            _entry(mine[col])
            if col in mine
            else {"episodes": {}, "more_s": 0.0, "more_episode": None}
        )
        b = _entry(rec)
        for name, dev in b["episodes"].items():
            a["episodes"][name] = max(dev, a["episodes"].get(name, 0.0))
        if b["more_s"] > a["more_s"]:
            a["more_s"], a["more_episode"] = b["more_s"], b["more_episode"]
        entry = _finished(a)
        if entry is not None:
            out[col] = entry
    return out if out != mine else None


def with_off_grid(schema: pa.Schema, column: str, deviation_s: float, episode: str) -> pa.Schema:
    """``schema`` recording that ``episode``'s stream of ``column`` is ``deviation_s`` off
    the grid."""
    if not deviation_s > 0:
        return schema
    rec = {column: {"episodes": {episode: float(deviation_s)}}}
    out = _merged(_raw(schema), rec)
    return schema if out is None else _recording(schema, out)


def merge_off_grid(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the off-grid columns of both (rows staged or committed apart)."""
    out = _merged(_raw(schema), _raw(other))
    return schema if out is None else _recording(schema, out)


def off_grid_without(schema: pa.Schema, episodes: Iterable[str]) -> str | None | bool:
    """The record's text once ``episodes`` are deleted or purged (None: no record left;
    False: unchanged). Their entries go; a bound whose episode is one of them stays,
    without the name."""
    gone = set(episodes).__contains__
    raw = _raw(schema)
    out: dict[str, dict[str, Any]] = {}
    for col, rec in raw.items():
        entry = _entry(rec)
        entry["episodes"] = {k: v for k, v in entry["episodes"].items() if not gone(k)}
        if gone(entry["more_episode"]):
            entry["more_episode"] = None
        done = _finished(entry)
        if done is not None:
            out[col] = done
    return False if out == raw else _text(out)


_UNNAMED = (
    "an episode its writes did not name (the record names the episodes furthest off and "
    "bounds the others: an episode deleted since may have set the bound)"
)


def check_on_grid(
    seconds: Any, tolerance_s: float, rec: dict[str, Any], fps: float | None, where: str
) -> None:
    """:class:`PlanError` when a ``Video(seconds=...)`` window reads a column recorded
    further off the grid than ``tolerance_s`` (``rec``: its :func:`recorded_off_grid`)."""
    dev = float(rec["deviation_s"])
    if dev <= tolerance_s:
        return
    rate = "its fps" if fps is None else f"{fps:g} fps"
    who = f"episode {rec['episode']!r}" if rec.get("episode") is not None else _UNNAMED
    raise PlanError(
        f"{where}: seconds={list(seconds or ())[:5]} cannot be read from this column: "
        f"{who} shows its frames up to {dev:.6g} s away from the frame "
        f"times at {rate} (a variable-frame-rate video, or timestamps that do not follow its "
        f"rate), more than tolerance_s={tolerance_s:g}; frame k is row k, so a time "
        "would pick a frame shown at another time. Give frame offsets instead, or re-encode "
        "the video at a constant rate"
    )

"""The frame sizes of each video column, per episode, recorded when the column is written.

A plan checks that every episode its anchors reach decodes to one size per output
(:mod:`treadle.plan.video_sizes`). Reading that from the video index is a ``take`` of
each reached episode's first row at every plan: on an object store, scattered reads of a
million episodes. Instead each write records, under ``treadle:video_sizes`` in the
table's schema metadata (so it travels with every Lance version), per video column::

    {column: {"held": {"WxH": [episode, ...], "none": [episode, ...]},
              "more": ["WxH", ...],     # sizes more episodes hold than "held" lists
              "many": true}}            # (only when) more than MAX_SIZES sizes were seen

``"none"`` holds the episodes whose rows of the column are null. Each key lists at most
:data:`MAX_NAMES` episodes (the first written); past it the key is in ``more``. A column
is recorded only when the record covers every row of it: from the write that created the
table on. A table written before this (its video columns lack an entry) gets none later,
since an entry would cover the new rows only; a merge of a side without an entry drops it
(:func:`merge_frame_sizes`). Deleting or purging episodes takes their names out
(:func:`frame_sizes_without`), and a key no episode holds any more goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle.table.episodes import EPISODE
from treadle.table.tensors import is_video

VIDEO_SIZES_KEY = b"treadle:video_sizes"
#: Episodes a key lists (the first written); past it the key is in ``more``.
MAX_NAMES = 32
#: Distinct keys a column records; past it the column is ``many`` (not resolved by it).
MAX_SIZES = 16
NONE = "none"


def recorded_frame_sizes(schema: pa.Schema | None) -> dict[str, dict[str, Any]]:
    """``{column: {"held": {key: [episode, ...]}, "more": [key, ...], ...}}`` as recorded
    (a damaged record: nothing, so plans read the index)."""
    raw = (schema.metadata or {}).get(VIDEO_SIZES_KEY) if schema is not None else None
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def size_key(width: int, height: int) -> str:
    return f"{width}x{height}"


def parse_key(key: str) -> tuple[int, int] | None:
    """``(height, width)`` of a key, None for ``"none"``."""
    if key == NONE:
        return None
    w, h = key.split("x")
    return int(h), int(w)


def _text(record: dict[str, Any]) -> str | None:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) if record else None


def _with_record(schema: pa.Schema, record: dict[str, Any]) -> pa.Schema:
    meta = dict(schema.metadata or {})
    text = _text(record)
    if text is None:
        meta.pop(VIDEO_SIZES_KEY, None)
    else:
        meta[VIDEO_SIZES_KEY] = text.encode()
    return schema.with_metadata(meta) if meta else schema.remove_metadata()


def _hold(entry: dict[str, Any], key: str, episode: str | None) -> None:
    """Record that ``episode`` holds ``key`` (None: a row of no episode)."""
    held = entry["held"]
    if key not in held and len(held) >= MAX_SIZES:
        entry["many"] = True
        return
    names = held.setdefault(key, [])
    if episode is None or (episode not in names and len(names) >= MAX_NAMES):
        if key not in entry["more"]:
            entry["more"] = sorted([*entry["more"], key])
    elif episode not in names:
        names.append(episode)


def _runs(rows: pa.Table, column: str) -> Iterable[tuple[str | None, str]]:
    """``(episode, key)`` of each run of rows of one episode and one size."""
    col = rows.column(column).combine_chunks()
    n = len(col)
    if n == 0:
        return []
    w = pc.struct_field(col, "width").fill_null(-1).to_numpy(zero_copy_only=False)
    h = pc.struct_field(col, "height").fill_null(-1).to_numpy(zero_copy_only=False)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    w, h = np.where(valid, w, -1), np.where(valid, h, -1)
    change = np.ones(n, bool)
    change[1:] = (w[1:] != w[:-1]) | (h[1:] != h[:-1])
    names = None
    if EPISODE in rows.column_names:
        ep = rows.column(EPISODE).combine_chunks()
        change[1:] |= (
            pc.not_equal(ep.slice(1), ep.slice(0, n - 1))
            .fill_null(True)
            .to_numpy(zero_copy_only=False)
        )
        names = ep.take(pa.array(np.flatnonzero(change))).to_pylist()
    out = []
    for k, i in enumerate(np.flatnonzero(change).tolist()):
        key = NONE if w[i] < 0 else size_key(int(w[i]), int(h[i]))
        out.append((names[k] if names else None, key))
    return out


def with_frame_sizes(schema: pa.Schema, rows: pa.Table, fresh: bool) -> pa.Schema:
    """``schema`` recording the frame sizes of the video columns of ``rows`` (``fresh``:
    these rows create the table, so every video column gets an entry; else only columns
    already recorded do)."""
    record = {} if fresh else recorded_frame_sizes(schema)
    changed = fresh and VIDEO_SIZES_KEY in (schema.metadata or {})
    for f in schema:
        if not is_video(f) or f.name not in rows.column_names:
            continue
        if f.name not in record and not fresh:
            continue  # written before sizes were recorded: an entry would miss its rows
        entry = record.setdefault(f.name, {"held": {}, "more": []})
        before = json.dumps(entry, sort_keys=True)
        for episode, key in _runs(rows, f.name):
            _hold(entry, key, episode)
        changed |= json.dumps(entry, sort_keys=True) != before or fresh
    return _with_record(schema, record) if changed else schema


def merge_frame_sizes(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the episodes of both (rows written apart meet); a column
    recorded on one side only is recorded on neither (the other side's rows are not)."""
    mine, theirs = recorded_frame_sizes(schema), recorded_frame_sizes(other)
    if not mine and not theirs:
        return schema
    out = {}
    for col in set(mine) | set(theirs):
        if col not in mine or col not in theirs:
            lacking = schema if col not in mine else other
            if col in lacking.names:
                continue  # its rows there were written before sizes were recorded
        entry = json.loads(json.dumps(mine.get(col) or {"held": {}, "more": []}))
        rec = theirs.get(col) or {"held": {}, "more": []}
        for key, names in (rec.get("held") or {}).items():
            for name in names:
                _hold(entry, key, name)
            if key in (rec.get("more") or ()):
                _hold(entry, key, None)
        if rec.get("many"):
            entry["many"] = True
        out[col] = entry
    return schema if out == mine else _with_record(schema, out)


def frame_sizes_without(schema: pa.Schema, episodes: Iterable[str]) -> str | None | bool:
    """The record's text once ``episodes`` are deleted or purged (None: no record left;
    False: unchanged): their names go, and a key no episode holds any more."""
    gone = set(episodes).__contains__
    raw = recorded_frame_sizes(schema)
    out: dict[str, Any] = {}
    for col, rec in raw.items():
        entry = dict(rec)
        held = {}
        for key, names in (rec.get("held") or {}).items():
            left = [n for n in names if not gone(n)]
            if left or key in (rec.get("more") or ()):
                held[key] = left
        entry["held"] = held
        out[col] = entry
    return False if out == raw else _text(out)


def named_episodes(schema: pa.Schema) -> set[str]:
    """Every episode the record names."""
    return {
        n
        for rec in recorded_frame_sizes(schema).values()
        for names in (rec.get("held") or {}).values()
        for n in names
    }

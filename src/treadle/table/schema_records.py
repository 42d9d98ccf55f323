"""What a write records of its own rows in a table's schema metadata, taken together.

Four records travel with every Lance version: the image sizes of image columns
(:mod:`~treadle.table.image_sizes`), the columns a write put a null in
(:mod:`~treadle.table.null_columns`), the video columns whose frames are not shown on
the fps grid (:mod:`~treadle.table.off_grid`) and the frame sizes of video columns
(:mod:`~treadle.table.frame_sizes`). Where rows written apart meet (a distributed
import's processes, a transaction rebased on a newer version, a merge of two branches),
both sides' records are kept (:func:`merge_records`); schemas staged apart are compared
without them (:func:`without_records`). Each record names its columns, so a renamed column's
entries move with it and a dropped column's leave (:func:`renamed_records`); the off-grid,
image and frame-size records name episodes, whose entries leave with them when they are
deleted or purged (:func:`records_without`). Another record joins here, once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import pyarrow as pa

from treadle.table.fps import merge_fps
from treadle.table.frame_sizes import (
    VIDEO_SIZES_KEY,
    frame_sizes_without,
    merge_frame_sizes,
    named_episodes,
)
from treadle.table.image_sizes import (
    IMAGES_KEY,
    images_without,
    merge_images,
    recorded_images,
    without_images,
)
from treadle.table.null_columns import NULLS_KEY, merge_nulls
from treadle.table.off_grid import (
    OFF_GRID_KEY,
    merge_off_grid,
    off_grid_without,
    recorded_off_grid,
)

__all__ = [
    "merge_records",
    "rebased_records",
    "records_without",
    "renamed_records",
    "without_records",
]


def merge_records(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` keeping what ``other`` recorded of its rows too (every record, and the
    frame rate: :class:`~treadle.errors.SchemaMismatch` when the two name different ones)."""
    merged = merge_off_grid(merge_nulls(merge_images(schema, other), other), other)
    return merge_fps(merge_frame_sizes(merged, other), other)


def without_records(schema: pa.Schema) -> pa.Schema:
    """``schema`` without any record of its rows (to compare schemas staged apart)."""
    schema = without_images(schema)  # the image fields' hints too
    meta = dict(schema.metadata or {})
    if not {NULLS_KEY, OFF_GRID_KEY, VIDEO_SIZES_KEY} & meta.keys():
        return schema
    meta = {k: v for k, v in meta.items() if k not in (NULLS_KEY, OFF_GRID_KEY, VIDEO_SIZES_KEY)}
    return schema.with_metadata(meta) if meta else schema.remove_metadata()


def renamed_records(schema: pa.Schema, names: Mapping[str, str | None]) -> dict[str, str | None]:
    """The schema metadata entries that change when columns are renamed (``{old: new}``) or
    dropped (``{old: None}``): each record's entry of ``old`` under ``new``, or gone (a key
    mapped to None: no entry left). Without this a renamed off-grid video was planned in
    seconds, and a renamed column's nulls and image sizes went unchecked."""
    meta = schema.metadata or {}
    out: dict[str, str | None] = {}
    for key in (IMAGES_KEY, OFF_GRID_KEY, VIDEO_SIZES_KEY):
        try:
            record = json.loads(meta.get(key) or "null")
        except ValueError:
            continue  # a damaged image record is not trusted anyway (recorded_images)
        if not isinstance(record, dict) or not set(record) & set(names):
            continue
        moved = {new: v for c, v in record.items() if (new := names.get(c, c)) is not None}
        text = json.dumps(moved, sort_keys=True, separators=(",", ":"))
        out[key.decode()] = text if moved else None
    raw = meta.get(NULLS_KEY)
    nulls = set(json.loads(raw)) if raw else set()
    if nulls & set(names):
        kept = sorted(new for c in nulls if (new := names.get(c, c)) is not None)
        out[NULLS_KEY.decode()] = json.dumps(kept, separators=(",", ":")) if kept else None
    return out


def records_without(schema: pa.Schema, episodes: Iterable[str]) -> dict[str, str | None]:
    """The schema metadata entries that change when ``episodes`` are deleted or purged
    (a key mapped to None: no entry left): the off-grid record's entries of them and their
    names in the image record go, so a plan no longer refuses for them nor names them."""
    gone = set(episodes)
    out: dict[str, str | None] = {}
    for key, text in ((OFF_GRID_KEY, off_grid_without(schema, gone)),
                      (IMAGES_KEY, images_without(schema, gone)),
                      (VIDEO_SIZES_KEY, frame_sizes_without(schema, gone))):  # fmt: skip
        if text is not False:
            out[key.decode()] = text
    return out


def _named(schema: pa.Schema) -> set[str]:
    """The episodes the off-grid, image and frame-size records of ``schema`` name."""
    out: set[str] = set()
    for rec in recorded_off_grid(schema).values():
        out |= set(rec["episodes"]) | {rec.get("more_episode")}
    for rec in recorded_images(schema).values():
        out |= {e for _, _, e in rec.get("sizes") or []} | {(rec.get("odd") or [None])[0]}
        out |= {n for v in (rec.get("names") or {}).values() for n in v}
    return (out | named_episodes(schema)) - {None}


def rebased_records(staged: pa.Schema, head: pa.Schema, episodes: Iterable[str]) -> pa.Schema:
    """``staged`` (rows of ``episodes`` staged against an older version) keeping what
    ``head`` records too (:func:`merge_records`), less the entries of the older version's
    episodes that ``head`` no longer records: a delete or purge since took them out, and a
    rebased append must not bring them back."""
    merged = merge_records(staged, head)
    stale = _named(staged) - set(episodes) - _named(head)
    changed = records_without(merged, stale) if stale else {}
    if not changed:
        return merged
    meta = dict(merged.metadata or {})
    for key, text in changed.items():
        if text is None:
            meta.pop(key.encode(), None)
        else:
            meta[key.encode()] = text.encode()
    return merged.with_metadata(meta)

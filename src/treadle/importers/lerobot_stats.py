"""``meta/stats.json`` of a LeRobot dataset: the statistics it ships, kept as given."""

from __future__ import annotations

from typing import Any

import numpy as np

from treadle.errors import CorruptData, NotFound
from treadle.importers.lerobot_meta import MAX_META_BYTES, load_json, read_meta_file
from treadle.importers.sources import Source

STATS_SOURCE = "lerobot meta/stats.json"


def read_source_stats(
    source: Source, max_meta_bytes: int = MAX_META_BYTES
) -> dict[str, dict[str, list[Any]]]:
    """``meta/stats.json`` (``{feature: {"mean": [...], "std": [...], ...}}``) as given, or {}
    when the dataset has none; anything but numbers (nested lists) is :class:`CorruptData`,
    a file over ``max_meta_bytes`` :class:`UnsafeInput`."""
    where = source.describe("meta/stats.json")
    try:
        raw = read_meta_file(source, "meta/stats.json", max_meta_bytes)
    except NotFound:
        return {}
    body = load_json(raw, where)
    if not isinstance(body, dict):
        raise CorruptData(f"{where} is not a JSON object")
    out: dict[str, dict[str, list[Any]]] = {}
    for feature, fields in body.items():
        if not isinstance(fields, dict):
            raise CorruptData(f"{where}: field {feature!r} is not an object")
        for name, value in fields.items():
            try:
                arr = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise CorruptData(f"{where}: {feature}.{name} is not numbers") from None
            out.setdefault(feature, {})[name] = arr.tolist()
    return out

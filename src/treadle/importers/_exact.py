"""Does an Arrow array hold exactly the Python values it was built from?

``pa.array(values, type)`` silently truncates ``1.5`` to ``1`` in an ``int64`` column and
drops struct keys the type does not have. An importer fixes a column's type from the
first chunk it sees, so a later chunk that does not fit would lose data without a word.
:func:`first_difference` compares the values with what the array reads back and names
the first one that changed, so the importer can raise instead.

What counts as the same value:

- a ``None``-valued struct field for a key the source did not have (Arrow fills
  the union of the keys with nulls; JSON's "absent" and ``null`` read back alike);
- an integer read back as a float of exactly the same value (``3`` -> ``3.0``);
- a float read back as an integer of exactly the same value (``2.0`` -> ``2``);
- NaN for NaN.

Everything else must compare equal and keep its kind (``True`` is not ``1``).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

#: what a struct key the Arrow value lacks reads back as
ABSENT = object()


def first_difference(values: list[Any], array: pa.Array) -> tuple[int, str, Any, Any] | None:
    """``(row, path, source value, stored value)`` of the first value ``array`` changed.

    ``path`` is ``""`` for the value itself, else the key/index path inside it
    (``.score``, ``.tags[2]``). ``None`` when every value reads back the same.
    """
    for i, (src, got) in enumerate(zip(values, array.to_pylist())):
        d = _diff(src, got, "")
        if d is not None:
            return (i, *d)
    return None


def _diff(src: Any, got: Any, path: str) -> tuple[str, Any, Any] | None:
    if src is None or got is None or got is ABSENT:
        return None if src is got or (src is None and got is ABSENT) else (path, src, got)
    if isinstance(src, bool) or isinstance(got, bool):
        same = isinstance(src, bool) and isinstance(got, bool) and src == got
        return None if same else (path, src, got)
    if isinstance(src, (int, float)) and isinstance(got, (int, float)):
        if isinstance(src, float) and isinstance(got, float) and math.isnan(src):
            return None if math.isnan(got) else (path, src, got)
        return None if src == got else (path, src, got)
    if isinstance(src, dict):
        if not isinstance(got, dict):
            return (path, src, got)
        for k, v in src.items():
            d = _diff(v, got.get(k, ABSENT), f"{path}.{k}")
            if d is not None:
                return d
        for k, v in got.items():
            if k not in src and v is not None:
                return (f"{path}.{k}", ABSENT, v)
        return None
    if isinstance(src, (list, tuple)):
        if not isinstance(got, list) or len(got) != len(src):
            return (path, src, got)
        for j, (a, b) in enumerate(zip(src, got)):
            d = _diff(a, b, f"{path}[{j}]")
            if d is not None:
                return d
        return None
    try:
        same = bool(src == got)
    except Exception:  # exotic objects (an opted-in pickle): equality may not be a bool
        same = False
    return None if same else (path, src, got)


def show(value: Any, limit: int = 80) -> str:
    """A short repr of a value for an error message (``(absent)`` for a missing key)."""
    if value is ABSENT:
        return "(absent)"
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."

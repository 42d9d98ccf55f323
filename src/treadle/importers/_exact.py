"""Arrow arrays that hold exactly the Python values they were built from, or an error.

``pa.array(values, type)`` silently truncates ``1.5`` to ``1`` in an ``int64`` column and
drops struct keys the type does not have. An importer fixes a column's type from the
first chunk it sees, so a later chunk that does not fit would lose data without a word.
:func:`exact_array` builds the array and compares the values with what it reads back
(:func:`first_difference`), raising :class:`SchemaMismatch` for the first that changed.

What counts as the same value:

- a ``None``-valued struct field for a key the source did not have (Arrow fills
  the union of the keys with nulls; JSON's "absent" and ``null`` read back alike);
- an integer read back as a float of exactly the same value (``3`` -> ``3.0``);
- a float read back as an integer of exactly the same value (``2.0`` -> ``2``, but not
  ``-0.0`` -> ``0``);
- NaN for NaN.

Everything else must compare equal and keep its kind (``True`` is not ``1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import SchemaMismatch

#: what a struct key the Arrow value lacks reads back as
ABSENT = object()


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)


def exact_array(
    values: list[Any],
    col: str,
    where: Callable[[int], str],
    typ: pa.DataType | None,
    hint: str = "",
) -> pa.Array:
    """``pa.array(values, typ)``, refused (:class:`SchemaMismatch`) unless it holds them exactly.

    ``typ`` is the type the first chunk set (``None`` for the first chunk): a later value
    it cannot hold (a float in an integer field, a key the struct lacks) is named, never
    truncated or dropped. Integers read back as floats only when exact. ``hint`` ends
    every error message (what the user can do about it).
    """
    try:
        a = pa.array(values, typ)
    except _ARROW_ERRORS as e:
        bad, bad_typ = _first_bad(values, typ)
        path = _bad_path(values[bad], bad_typ)
        kind = f"field {col}{path}" if path else f"{col!r}"
        why = "an integer outside int64" if isinstance(e, OverflowError) else str(e)
        raise SchemaMismatch(
            f"{where(bad)}: {kind} does not fit the column type: {why}{hint}"
        ) from None
    diff = first_difference(values, a)
    if diff is not None:
        row, path, src, got = diff
        kind = f"field {col}{path}" if path else f"{col!r}"
        typ_s = str(a.type) if len(str(a.type)) <= 160 else str(a.type)[:157] + "..."
        if got is ABSENT:
            raise SchemaMismatch(
                f"{where(row)}: {kind} is not in the column type {typ_s} (fixed by the "
                f"first chunk of samples): a key that first appears here would be dropped{hint}"
            )
        raise SchemaMismatch(
            f"{where(row)}: {kind} = {show(src)} would be stored as {show(got)} by the column "
            f"type {typ_s} (fixed by the first chunk of samples){hint}"
        )
    return a


def _first_bad(values: list[Any], typ: pa.DataType | None) -> tuple[int, pa.DataType | None]:
    """The first value ``typ`` cannot hold, and the type it was tried against."""
    for i, v in enumerate(values):  # a value that fits no type on its own (an int beyond int64)
        if not _fits(v, typ):
            return i, typ
    if typ is None:  # values of mixed kinds: the first that differs from the first value's
        return _first_bad(values, pa.array(values[:1]).type)
    return 0, typ


def _fits(value: Any, typ: pa.DataType | None) -> bool:
    try:
        pa.array([value], typ)
        return True
    except _ARROW_ERRORS:
        return False


def _bad_path(value: Any, typ: pa.DataType | None, path: str = "") -> str:
    """The path (``.score``, ``.tags[2]``) of the part of ``value`` that ``typ`` cannot hold.

    With ``typ=None``: the part that no type can hold (mixed kinds, an int beyond int64).
    """
    parts: list[tuple[str, Any, pa.DataType | None]] = []
    if isinstance(value, dict) and (typ is None or pa.types.is_struct(typ)):
        for k, v in value.items():
            i = typ.get_field_index(k) if typ is not None else -2
            if i != -1:  # a key the struct lacks is found by first_difference
                parts.append((f".{k}", v, typ.field(i).type if typ is not None else None))
    elif isinstance(value, (list, tuple)) and (
        typ is None or isinstance(typ, (pa.ListType, pa.LargeListType))
    ):
        sub = typ.value_type if typ is not None else None
        parts = [(f"[{j}]", v, sub) for j, v in enumerate(value)]
    for name, v, sub in parts:
        if not _fits(v, sub):
            return _bad_path(v, sub, path + name)
    return path


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
    if isinstance(src, (np.ndarray, np.generic)):  # inside an opted-in pickle
        src = src.tolist()
    if src is None or got is None or got is ABSENT:
        return None if src is got or (src is None and got is ABSENT) else (path, src, got)
    if isinstance(src, bool) or isinstance(got, bool):
        same = isinstance(src, bool) and isinstance(got, bool) and src == got
        return None if same else (path, src, got)
    if isinstance(src, (int, float)) and isinstance(got, (int, float)):
        if isinstance(src, float) and isinstance(got, float) and math.isnan(src):
            return None if math.isnan(got) else (path, src, got)
        negative_zero = isinstance(src, float) and src == 0 and math.copysign(1, src) < 0
        if negative_zero and not isinstance(got, float):
            return (path, src, got)  # the integer 0 has no sign
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

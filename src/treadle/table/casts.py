"""Casts that keep every value: a column is widened to a table's type, or refused.

``Array.cast(type, safe=True)`` refuses an integer that does not fit and a float with a
fraction cast to an integer, but it parses text into numbers (``"007"`` -> ``7``), prints
numbers as text, turns ``True`` into ``1``, rounds float64 to float32 and drops the
struct fields the target type lacks, all without a word. :func:`exact_cast` allows only
casts between numbers (integer or float) and between the string (or binary) types,
nested through lists and structs, and checks that every value reads back the same.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from treadle.errors import SchemaMismatch

_FAMILIES = (
    (pa.types.is_integer, pa.types.is_floating),
    (pa.types.is_string, pa.types.is_large_string),
    (pa.types.is_binary, pa.types.is_large_binary),
)


def _is_list(t: pa.DataType) -> bool:
    return isinstance(t, (pa.ListType, pa.LargeListType, pa.FixedSizeListType))


def cast_change(src: pa.DataType, dst: pa.DataType) -> tuple[str, str] | None:
    """``(path, why)`` of the first part of ``src`` a cast to ``dst`` would drop or turn
    into another kind of value (``path`` like ``.meta.extra`` or ``[]``), else None.

    Allowed: equal types, nulls to anything, numbers to numbers, text to text, bytes to
    bytes, through lists and structs (whose values :func:`exact_cast` then checks).
    """
    if src == dst or pa.types.is_null(src):
        return None
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        for f in src:
            i = dst.get_field_index(f.name)
            if i < 0:
                return f".{f.name}", "is not in the column type; it would be dropped"
            deeper = cast_change(f.type, dst.field(i).type)
            if deeper is not None:
                return f".{f.name}{deeper[0]}", deeper[1]
        return None
    if _is_list(src) and _is_list(dst):
        deeper = cast_change(src.value_type, dst.value_type)
        return None if deeper is None else (f"[]{deeper[0]}", deeper[1])
    for family in _FAMILIES:
        if any(k(src) for k in family) and any(k(dst) for k in family):
            return None
    return "", f"has type {src}: storing it as {dst} would change its values"


def exact_cast(
    values: pa.Array | pa.ChunkedArray, dst: pa.DataType, what: str, context: str = ""
) -> pa.Array | pa.ChunkedArray:
    """``values`` cast to ``dst``, or :class:`SchemaMismatch` ``f"{what}{path} {why}{context}"``
    when the cast would drop a value or change one (``what`` names the column)."""
    if values.type == dst:
        return values
    change = cast_change(values.type, dst)
    if change is None:
        try:
            out = values.cast(dst, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            change = ("", f"does not fit the column type {dst}: {e}")
        else:
            if _same_values(values, out.cast(values.type, safe=False)):
                return out
            change = ("", f"has type {values.type}: storing it as {dst} would change its values")
    path, why = change
    raise SchemaMismatch(f"{what}{path} {why}{context}")


def _same_values(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> bool:
    """Whether two arrays of one type hold the same values (NaN equal to NaN)."""
    if isinstance(a, pa.ChunkedArray):
        a, b = a.combine_chunks(), b.combine_chunks()
    if pa.types.is_struct(a.type):
        return all(_same_values(x, y) for x, y in zip(a.flatten(), b.flatten()))
    if _is_list(a.type):
        lengths = pc.list_value_length(a), pc.list_value_length(b)
        return lengths[0].equals(lengths[1]) and _same_values(a.flatten(), b.flatten())
    same = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        same = pc.or_kleene(same, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    return a.null_count == b.null_count and bool(pc.all(pc.fill_null(same, True)).as_py())

"""Decoded source values -> Arrow: column names, and rows of Python/numpy values -> tables.

The importers decode each sample to ``{column: value}``; :func:`rows_to_table` turns a
chunk of them into one Arrow table whose tensor columns are written by
:mod:`treadle.table.tensors` (the one place that writes tensor metadata) and whose other
columns hold exactly the source's values (:mod:`treadle.importers._exact`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import InvalidName, NotFound, SchemaMismatch
from treadle.importers._exact import exact_array
from treadle.table.tensors import SHAPE_KEY, tensor_column, tensor_shape

_COLUMN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: rows per appended chunk (each importer may pick smaller chunks for wide rows)
DEFAULT_CHUNK_ROWS = 1024
#: bytes per appended chunk, whichever limit comes first
DEFAULT_CHUNK_BYTES = 32 << 20
#: the most decoded bytes (images counted as their pixels) an importer decodes at once,
#: beyond one chunk
IN_FLIGHT_BYTES = 512 << 20
#: the end of an error about a JSON value that does not fit its column's type
JSON_HINT = "; import with json_as='text' (--json-as text) to store this JSON as its text"


def check_json_as(json_as: str) -> None:
    """Refuse a ``json_as`` option other than ``"typed"`` and ``"text"``."""
    if json_as not in ("typed", "text"):
        raise ValueError(f"json_as must be 'typed' or 'text', got {json_as!r}")


def column_name(name: str, where: str, rename: dict[str, str] | None = None) -> str:
    """The table column for a source column ``name`` (``rename`` maps source names first).

    Lance refuses ``.`` in top-level field names, so dots become ``_``
    (``observation.images.top`` -> ``observation_images_top``, a WebDataset member
    ``seg.png`` -> ``seg_png``). Anything else unsafe raises :class:`InvalidName`.
    """
    if rename and name in rename:
        name = rename[name]
    out = name.replace(".", "_") if isinstance(name, str) else name
    if not isinstance(out, str) or not _COLUMN.fullmatch(out):
        raise InvalidName(
            f"{where}: column name {name!r} is not allowed (1-128 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)"
        )
    return out


def check_rename(rename: dict[str, str] | None, columns: Iterable[str], where: str) -> None:
    """Refuse a ``rename`` of a column the source does not have (:class:`NotFound`).

    A typo would otherwise be ignored silently, and since the rename is part of the
    import id, re-running without it would import the same rows again.
    """
    have = sorted(set(columns))
    unused = [c for c in rename or {} if c not in have]
    if unused:
        raise NotFound(
            f"{where}: rename names column(s) {unused} the source does not have; "
            f"its columns: {have}"
        )


def rows_to_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    where: Callable[[int], str],
    schema: pa.Schema | None = None,
    hints: dict[str, str] | None = None,
) -> pa.Table:
    """Python/numpy values per row -> one Arrow table.

    numpy arrays become tensor columns (every row must have the same dtype and
    shape), bytes become ``large_binary``, everything else is inferred by Arrow. With
    ``schema`` (fixed by the first chunk) the result is cast to it. A value that does
    not fit, or that the type would change (a float in an integer field, a struct key
    the type lacks, an integer beyond int64), raises :class:`SchemaMismatch` naming the
    sample (``where(row)``) and the field, ending with ``hints[column]`` if given;
    integers are widened to floats only when exact.
    """
    fields: list[pa.Field] = []
    arrays: list[pa.Array] = []
    for col in columns:
        values = [r.get(col) for r in rows]
        missing = [i for i, r in enumerate(rows) if col not in r]  # a JSON null is a value
        if missing:
            have = sorted(rows[missing[0]])
            raise SchemaMismatch(
                f"{where(missing[0])} has no {col!r} (it has {have}); every sample must have "
                "the same members"
            )
        want = schema.field(col) if schema is not None and col in schema.names else None
        f, a = _column(col, values, where, want, (hints or {}).get(col, ""))
        if want is not None and (f.type != want.type or f.metadata != want.metadata):
            f, a = _fit(col, values, f, a, want, where)
        fields.append(f)
        arrays.append(a)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _column(
    col: str, values: list[Any], where: Callable[[int], str], want: pa.Field | None, hint: str
) -> tuple[pa.Field, pa.Array]:
    """One column of a chunk: a tensor, a numpy scalar, bytes, or an exact Arrow value."""
    first = values[0]
    if isinstance(first, np.ndarray):
        for i, v in enumerate(values):
            if not isinstance(v, np.ndarray) or v.shape != first.shape or v.dtype != first.dtype:
                got = f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else type(v)
                raise SchemaMismatch(
                    f"{where(i)}: {col!r} is {got}, earlier samples have "
                    f"{first.dtype}{list(first.shape)}"
                )
        if first.ndim == 0:
            return pa.field(col, pa.from_numpy_dtype(first.dtype)), pa.array(np.asarray(values))
        return tensor_column(col, np.stack(values))
    if isinstance(first, (bytes, bytearray, memoryview)):
        return pa.field(col, pa.large_binary()), pa.array(values, pa.large_binary())
    a = exact_array(values, col, where, want.type if want is not None else None, hint)
    return pa.field(col, a.type), a


def _fit(
    col: str,
    values: list[Any],
    f: pa.Field,
    a: pa.Array,
    want: pa.Field,
    where: Callable[[int], str],
) -> tuple[pa.Field, pa.Array]:
    """A chunk's column cast to the type the first chunk fixed, or :class:`SchemaMismatch`."""
    if isinstance(values[0], np.ndarray) and not values[0].ndim:
        # as within a chunk: a cast would round float64 to float32 without a word
        have = np.dtype(want.type.to_pandas_dtype())
        raise SchemaMismatch(
            f"{where(0)}: {col!r} is {values[0].dtype}, earlier samples have {have}"
        )
    if f.metadata != want.metadata or SHAPE_KEY in (want.metadata or {}):
        raise _mismatch(col, f, want, where)
    try:
        return want, a.cast(want.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _mismatch(col, f, want, where) from None


def _mismatch(col: str, f: pa.Field, want: pa.Field, where: Callable[[int], str]) -> SchemaMismatch:
    return SchemaMismatch(
        f"{where(0)}: {col!r} is {_describe(f)}, earlier samples have {_describe(want)}"
    )


def _describe(f: pa.Field) -> str:
    """A field's type for an error: ``uint8[16, 16, 3]`` for a tensor, else the Arrow type."""
    shape = tensor_shape(f)
    if shape is None:
        return str(f.type)
    leaf = f.type.value_type
    while pa.types.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    return f"{np.dtype(leaf.to_pandas_dtype()).name}{list(shape)}"

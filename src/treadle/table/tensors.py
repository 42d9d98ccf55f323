"""Arrow <-> numpy for table columns.

Fixed-shape tensors (``action: float32[7]``, ``image: uint8[64,64,3]``) are stored
as a flat ``fixed_size_list<dtype, prod(shape)>`` with field metadata
``treadle:shape`` (JSON list) so that reading a batch back is one zero-copy
reshape, whatever the number of dimensions.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import SchemaMismatch

SHAPE_KEY = b"treadle:shape"
KIND_KEY = b"treadle:kind"


def tensor_shape(field: pa.Field) -> tuple[int, ...] | None:
    """The per-row shape of a tensor column, or None for other columns."""
    meta = field.metadata or {}
    if SHAPE_KEY in meta:
        return tuple(json.loads(meta[SHAPE_KEY]))
    return None


def is_video(field: pa.Field) -> bool:
    return (field.metadata or {}).get(KIND_KEY) == b"video"


def tensor_field(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> pa.Field:
    value_type = pa.from_numpy_dtype(dtype)
    size = math.prod(shape)
    return pa.field(
        name,
        pa.list_(value_type, size),
        metadata={SHAPE_KEY: json.dumps(list(shape)).encode()},
    )


def column_from_values(
    name: str, values: Any, rows: int | None = None
) -> tuple[pa.Field, pa.Array]:
    """Turn one user column (numpy array, list, arrow array) into a field and an array.

    A numpy array of shape ``[n, *shape]`` with ``shape`` non-empty becomes a tensor
    column; ``[n]`` becomes a scalar column. ``rows``, when given, is the required length.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        arr, field = values, pa.field(name, values.type)
    else:
        if not isinstance(values, np.ndarray):
            try:
                probe = np.asarray(values)
            except (ValueError, TypeError):
                probe = None
            if probe is not None and probe.dtype.kind in "biuf" and probe.ndim >= 1:
                values = probe
        if isinstance(values, np.ndarray):
            if values.ndim == 0:
                raise SchemaMismatch(f"column {name!r}: expected one value per row, got a scalar")
            if values.dtype.kind not in "biufU" or values.dtype.kind == "c":
                if values.dtype.kind == "O":
                    values = list(values)
                else:
                    raise SchemaMismatch(f"column {name!r}: unsupported dtype {values.dtype}")
        if isinstance(values, np.ndarray) and values.ndim > 1:
            shape = tuple(int(s) for s in values.shape[1:])
            field = tensor_field(name, values.dtype, shape)
            flat = np.ascontiguousarray(values).reshape(-1)
            arr = pa.FixedSizeListArray.from_arrays(pa.array(flat), math.prod(shape))
        else:
            try:
                arr = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise SchemaMismatch(f"column {name!r}: cannot store values: {e}") from None
            field = pa.field(name, arr.type)
    if rows is not None and len(arr) != rows:
        raise SchemaMismatch(f"column {name!r} has {len(arr)} rows, expected {rows}")
    return field, arr


def to_numpy(column: pa.Array | pa.ChunkedArray, field: pa.Field) -> np.ndarray:
    """A tensor or scalar column as a numpy array ``[n, *shape]`` (zero-copy where possible)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    shape = tensor_shape(field)
    if shape is None:
        return column.to_numpy(zero_copy_only=False)
    flat = column.values.to_numpy(zero_copy_only=False)
    if column.offset:
        size = math.prod(shape)
        flat = flat[column.offset * size : (column.offset + len(column)) * size]
    return flat.reshape((len(column), *shape))


def conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """Check ``table`` against an existing ``schema``: same columns, same types.

    Scalar columns may be cast when the cast is lossless (e.g. int64 -> int32 of small
    values); tensors must match dtype and shape exactly.
    """
    have, want = set(table.column_names), set(schema.names)
    if have != want:
        missing, extra = sorted(want - have), sorted(have - want)
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unknown columns {extra}")
        raise SchemaMismatch(f"{where}: rows do not match the table schema: " + "; ".join(parts))
    arrays = []
    for field in schema:
        col = table.column(field.name)
        got = table.schema.field(field.name)
        if tensor_shape(field) != tensor_shape(got) and tensor_shape(field) is not None:
            raise SchemaMismatch(
                f"{where}: column {field.name!r} has shape {tensor_shape(got)}, "
                f"table has {tensor_shape(field)}"
            )
        if col.type != field.type:
            if tensor_shape(field) is not None or is_video(field):
                raise SchemaMismatch(
                    f"{where}: column {field.name!r} has type {col.type}, table has {field.type}"
                )
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise SchemaMismatch(
                    f"{where}: column {field.name!r} has type {got.type}, table has {field.type}"
                ) from None
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)

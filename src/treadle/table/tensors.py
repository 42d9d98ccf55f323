"""Arrow <-> numpy for table columns.

Fixed-shape tensors (``action: float32[7]``, ``image: uint8[64,64,3]``) are stored
as a flat ``fixed_size_list<dtype, prod(shape)>`` with field metadata
``treadle:shape`` (JSON list) so that reading a batch back is one zero-copy
reshape, whatever the number of dimensions.

A fixed-size list of numbers written without that metadata (plain Arrow
``fixed_size_list<float>[7]``, Hugging Face ``Sequence(length=7)``, nested
fixed-size lists) is a tensor too, its shape read from the nesting. Arrow's
``fixed_shape_tensor`` and Hugging Face ``Array2D``..``Array5D`` extension
columns are turned into the flat form on write (:func:`normalise_column`).

:func:`batch_kind` says how a batch holds a column; a column it cannot hold is
refused by name (never dropped).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, SchemaMismatch
from treadle.table.casts import exact_cast
from treadle.table.column_meta import check_same_meta, keep_meta
from treadle.table.defaults import fill_added

SHAPE_KEY = b"treadle:shape"
KIND_KEY = b"treadle:kind"


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _nesting(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    """(list sizes, leaf type) of nested fixed-size lists; ``((), t)`` for anything else."""
    sizes = []
    while pa.types.is_fixed_size_list(t):
        sizes.append(t.list_size)
        t = t.value_type
    return tuple(sizes), t


def tensor_shape(field: pa.Field) -> tuple[int, ...] | None:
    """The per-row shape of a tensor column, or None for other columns.

    ``treadle:shape`` metadata on a flat fixed-size list gives the shape; without it a
    (nested) fixed-size list of numbers is a tensor shaped by its nesting.
    """
    sizes, leaf = _nesting(field.type)
    meta = field.metadata or {}
    if SHAPE_KEY in meta:
        try:
            shape = tuple(int(v) for v in json.loads(meta[SHAPE_KEY]))
        except (ValueError, TypeError):
            shape = None
        if shape is None or len(sizes) != 1 or math.prod(shape) != sizes[0]:
            raise CorruptData(
                f"column {field.name!r}: tensor shape metadata {meta[SHAPE_KEY]!r} does not fit "
                f"its type {field.type}"
            )
        return shape
    if sizes and _is_number(leaf):
        return sizes
    return None


def batch_kind(field: pa.Field) -> str | None:
    """How a batch holds this column: ``"video"``, ``"tensor"``, ``"scalar"``, or None
    when it cannot (strings, variable-length lists, structs...)."""
    if is_video(field):
        return "video"
    if tensor_shape(field) is not None:
        return "tensor"
    if _is_number(field.type):
        return "scalar"
    return None


def is_video(field: pa.Field) -> bool:
    return (field.metadata or {}).get(KIND_KEY) == b"video"


def tensor_field(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> pa.Field:
    """A fixed-shape tensor field as tables store it: a flat fixed-size list, the shape in
    ``treadle:shape``. This is the one writer of tensor metadata; tensor fields that earlier
    importers wrote also carry a ``treadle:dtype`` key, which nothing reads."""
    value_type = pa.from_numpy_dtype(dtype)
    size = math.prod(shape)
    return pa.field(
        name,
        pa.list_(value_type, size),
        metadata={SHAPE_KEY: json.dumps(list(shape)).encode()},
    )


def tensor_column(name: str, stack: np.ndarray) -> tuple[pa.Field, pa.Array]:
    """``[n, *shape]`` numpy (``shape`` non-empty) -> a tensor field and its flat
    fixed-size-list array (zero-copy for contiguous input)."""
    shape = tuple(int(s) for s in stack.shape[1:])
    if math.prod(shape) == 0:
        raise SchemaMismatch(
            f"column {name!r} has shape {list(shape)} per moment: no values (a dimension of "
            "size 0); drop the column or give every dimension a size"
        )
    flat = np.ascontiguousarray(stack).reshape(-1)
    array = pa.FixedSizeListArray.from_arrays(pa.array(flat), math.prod(shape))
    return tensor_field(name, stack.dtype, shape), array


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
        field, arr = normalise_column(pa.field(name, values.type), values)
    else:
        if not isinstance(values, np.ndarray):
            try:
                probe = np.asarray(values)
            except (ValueError, TypeError):
                probe = None
            if probe is not None and probe.dtype.kind in "biuf" and probe.ndim >= 1:
                values = probe
        if isinstance(values, np.ndarray):
            if not values.dtype.isnative:  # big-endian HDF5/Zarr: Arrow holds native only
                values = values.astype(values.dtype.newbyteorder("="))
            if values.ndim == 0:
                raise SchemaMismatch(f"column {name!r}: expected one value per row, got a scalar")
            if values.dtype.kind not in "biufU" or values.dtype.kind == "c":
                if values.dtype.kind == "O":
                    values = list(values)
                else:
                    raise SchemaMismatch(f"column {name!r}: unsupported dtype {values.dtype}")
        if isinstance(values, np.ndarray) and values.ndim > 1:
            field, arr = tensor_column(name, values)
        else:
            try:
                arr = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise SchemaMismatch(f"column {name!r}: cannot store values: {e}") from None
            field = pa.field(name, arr.type)
    if rows is not None and len(arr) != rows:
        raise SchemaMismatch(f"column {name!r} has {len(arr)} rows, expected {rows}")
    return field, arr


def normalise_column(
    field: pa.Field, array: pa.Array | pa.ChunkedArray
) -> tuple[pa.Field, pa.Array | pa.ChunkedArray]:
    """One column as treadle stores it: fixed-size lists of numbers (plain, nested, Arrow
    ``fixed_shape_tensor``, Hugging Face ``ArrayND``) become flat tensors with their shape
    in the field metadata, keeping their ``treadle:meta:*`` column metadata; every other
    column is returned unchanged."""
    t = field.type
    if isinstance(t, pa.FixedShapeTensorType):
        if list(t.permutation or range(len(t.shape))) != list(range(len(t.shape))):
            raise SchemaMismatch(
                f"column {field.name!r}: fixed_shape_tensor with permutation {t.permutation} "
                "is not supported; store it in row-major order"
            )
        shape = tuple(int(v) for v in t.shape)
    elif isinstance(t, pa.ExtensionType):
        shape = _hf_array_shape(t)
    elif SHAPE_KEY not in (field.metadata or {}):
        shape = tensor_shape(field)
    else:
        shape = None
    if shape is None:
        return field, array
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(t, pa.BaseExtensionType):
        array = array.storage
    flat, values = flat_tensor(field.name, array, shape)
    return keep_meta(field, flat), values


def _hf_array_shape(t: pa.ExtensionType) -> tuple[int, ...] | None:
    """The shape of a Hugging Face ``Array2D``..``Array5D`` column (nested lists of numbers)."""
    shape = getattr(t, "shape", None)
    _, leaf = _list_nesting(t.storage_type)
    if not isinstance(shape, tuple) or not shape or not _is_number(leaf):
        return None
    if len(_list_nesting(t.storage_type)[0]) != len(shape) or None in shape:
        return None
    return tuple(int(s) for s in shape)


def _list_nesting(t: pa.DataType) -> tuple[list[pa.DataType], pa.DataType]:
    levels = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        levels.append(t)
        t = t.value_type
    return levels, t


def flat_tensor(name: str, array: pa.Array, shape: tuple[int, ...]) -> tuple[pa.Field, pa.Array]:
    """Lists (nested one level per dimension, or one flat level) holding exactly ``shape``
    values in every row -> a flat tensor column."""
    levels = _list_nesting(array.type)[0]
    if len(levels) == len(shape):
        sizes = list(shape)
    elif len(levels) == 1:
        sizes = [math.prod(shape)]
    else:
        raise SchemaMismatch(
            f"column {name!r}: {array.type} does not hold tensors of shape {list(shape)}"
        )
    values = array
    for depth, size in enumerate(sizes):
        if values.null_count:
            raise SchemaMismatch(f"column {name!r}: null values cannot be stored in a tensor")
        if pa.types.is_fixed_size_list(values.type):
            lengths = np.full(len(values), values.type.list_size)
        else:
            lengths = values.value_lengths().to_numpy(zero_copy_only=False)
        if lengths.size and not np.all(lengths == size):
            bad = int(np.flatnonzero(lengths != size)[0])
            raise SchemaMismatch(
                f"column {name!r} has shape {list(shape)}, but a list at depth {depth} "
                f"(entry {bad}) has {int(lengths[bad])} values, not {size}"
            )
        values = values.flatten()
    if values.null_count:
        raise SchemaMismatch(f"column {name!r}: null values cannot be stored in a tensor")
    field = tensor_field(name, np.dtype(values.type.to_pandas_dtype()), shape)
    return field, pa.FixedSizeListArray.from_arrays(values, math.prod(shape))


def to_numpy(column: pa.Array | pa.ChunkedArray, field: pa.Field, where: str = "") -> np.ndarray:
    """A tensor or scalar column as a numpy array ``[n, *shape]`` (zero-copy where possible).

    Nulls are refused (a batch has no way to hold them, and numpy would turn them into
    NaN or garbage); ``where`` names the table in that error.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    shape = tensor_shape(field)
    values = column
    for _ in range(len(_nesting(field.type)[0]) if shape is not None else 0):
        _refuse_nulls(values, field, where)
        values = values.flatten()  # honours slice offsets at every level
    _refuse_nulls(values, field, where)
    flat = values.to_numpy(zero_copy_only=False)
    if shape is None:
        return flat
    return flat.reshape((len(column), *shape))


def _refuse_nulls(values: pa.Array, field: pa.Field, where: str) -> None:
    if values.null_count:
        at = f"{where}: " if where else ""
        raise CorruptData(f"{at}column {field.name!r} holds null values, which a batch cannot hold")


def conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """Check ``table`` against an existing ``schema``: same columns, same types.

    Other columns are cast only when every value stays the same (int64 -> int32 of small
    values, :func:`treadle.table.casts.exact_cast`); tensors must match dtype and shape
    exactly.
    """
    table = fill_added(table, schema)
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
        check_same_meta(field, got, where)
        if tensor_shape(field) != tensor_shape(got) and tensor_shape(field) is not None:
            raise SchemaMismatch(
                f"{where}: column {field.name!r} has shape {_shape_text(tensor_shape(got))}, "
                f"table has {_shape_text(tensor_shape(field))}"
            )
        if col.type != field.type:
            if tensor_shape(field) is not None or is_video(field):
                raise SchemaMismatch(
                    f"{where}: column {field.name!r} has type {col.type}, table has {field.type}"
                )
            if not same_fields(got.type, field.type):  # a cast would drop or invent one
                raise SchemaMismatch(
                    f"{where}: column {field.name!r} has type {got.type}, table has {field.type}"
                )
            col = exact_cast(
                col,
                field.type,
                f"{where}: column {field.name!r}",
                f" (convert the values to {field.type} first to store them so)",
            )
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def same_fields(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two types have the same struct field names at every depth, so that casting
    one to the other (Arrow matches struct fields by name) drops and invents nothing."""
    if pa.types.is_struct(a) or pa.types.is_struct(b):
        if not (pa.types.is_struct(a) and pa.types.is_struct(b)):
            return False
        fa, fb = {f.name: f.type for f in a}, {f.name: f.type for f in b}
        return fa.keys() == fb.keys() and all(same_fields(fa[k], fb[k]) for k in fa)
    nested = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(t(a) or t(b) for t in nested):
        return (
            any(t(a) for t in nested)
            and any(t(b) for t in nested)
            and same_fields(a.value_type, b.value_type)
        )
    if pa.types.is_map(a) or pa.types.is_map(b):
        return pa.types.is_map(a) and pa.types.is_map(b) and same_fields(a.item_type, b.item_type)
    return True


def schema_difference(table: pa.Schema, mine: pa.Schema) -> str | None:
    """How ``mine`` differs from a table's ``table`` schema, naming the column; None if
    they are the same. Tensor shapes and column kinds are part of a schema: two flat
    ``fixed_size_list<float>[6]`` columns shaped ``[2, 3]`` and ``[3, 2]`` differ."""
    if table.names != mine.names:
        return f"columns {table.names} in the table, {mine.names} in this write"
    for a, b in zip(table, mine):
        if a.type != b.type:
            return f"column {a.name!r} is {a.type} in the table, {b.type} in this write"
        sa, sb = tensor_shape(a), tensor_shape(b)
        if sa != sb:
            return (
                f"column {a.name!r} has shape {_shape_text(sa)} in the table, "
                f"{_shape_text(sb)} in this write"
            )
        if (a.metadata or {}) != (b.metadata or {}):
            return (
                f"column {a.name!r} has metadata {dict(a.metadata or {})} in the table, "
                f"{dict(b.metadata or {})} in this write"
            )
    return None


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "none (not a tensor)" if shape is None else str(list(shape))

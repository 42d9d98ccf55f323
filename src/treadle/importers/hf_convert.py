"""Hugging Face batches -> table batches: ``Image`` and ``ArrayND`` columns mapped, extension
types unwrapped, and batches cut for their decoded pixels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import SchemaMismatch
from treadle.importers.arrow import DEFAULT_CHUNK_BYTES, column_name
from treadle.importers.images import decode_image, decoded_bytes
from treadle.table.tensors import flat_tensor, tensor_column


def _is_image(feature: Any, typ: pa.DataType) -> bool:
    return (
        isinstance(feature, dict)
        and feature.get("_type") == "Image"
        and pa.types.is_struct(typ)
        and typ.get_field_index("bytes") >= 0
    )


_ARRAY_TYPES = ("Array2D", "Array3D", "Array4D", "Array5D")


def _array_shape(feature: Any) -> tuple[int, ...] | None:
    """The fixed shape of an ``ArrayND`` feature (its first dimension fixed too), else None."""
    if not isinstance(feature, dict) or feature.get("_type") not in _ARRAY_TYPES:
        return None
    shape = feature.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
        return None  # a dynamic first dimension (None) is a ragged list: refused at plan time
    return tuple(shape)


def convert_batch(
    batch: pa.RecordBatch,
    features: dict[str, Any],
    images: str,
    where: str,
    rename: dict[str, str] | None = None,
) -> pa.Table:
    """One source batch -> a table batch (image columns mapped, extension types unwrapped)."""
    fields, arrays = [], []
    for i, field in enumerate(batch.schema):
        name = column_name(field.name, where, rename)
        col = batch.column(i)
        shape = _array_shape(features.get(field.name))
        if shape is not None:
            # datasets stores ArrayND as variable-size lists (an extension type only where
            # datasets is imported), the shape in its metadata: every row is checked
            storage = col.storage if isinstance(col.type, pa.ExtensionType) else col
            try:
                f, a = flat_tensor(name, storage, shape)
            except SchemaMismatch as e:
                raise SchemaMismatch(f"{where}: {e}") from None
            fields.append(f)
            arrays.append(a)
            continue
        if isinstance(col.type, pa.ExtensionType):
            col = col.storage
        if _is_image(features.get(field.name), col.type):
            raw = col.field("bytes")
            if raw.null_count:
                bad = next(j for j in range(len(raw)) if not raw[j].is_valid)
                raise SchemaMismatch(
                    f"{where}, row {bad}: image column {name!r} has no embedded bytes "
                    "(only a path); save the dataset with embedded images"
                )
            if images == "decoded":
                frames = [
                    decode_image(b.as_py(), "", f"{where}, row {j}, column {name!r}")
                    for j, b in enumerate(raw)
                ]
                shapes = {a.shape for a in frames}
                if len(shapes) > 1:
                    raise SchemaMismatch(
                        f"{where}: image column {name!r} has several shapes {sorted(shapes)}; "
                        "use images='encoded'"
                    )
                f, a = tensor_column(name, np.stack(frames))
                fields.append(f)
                arrays.append(a)
            else:
                fields.append(pa.field(name, pa.large_binary()))
                arrays.append(raw.cast(pa.large_binary()))
            continue
        fields.append(pa.field(name, col.type))
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def pixel_slices(
    batch: pa.RecordBatch, features: dict[str, Any]
) -> Iterator[tuple[int, pa.RecordBatch, int]]:
    """``(first row, slice, bytes)``: ``batch`` in slices of at most ``DEFAULT_CHUNK_BYTES``
    once its images are decoded (one row at least), each image counted as its pixels, read
    from its header (a 10 KB PNG of zeros may be 100 MB of pixels)."""
    sizes = np.zeros(batch.num_rows, np.int64)
    for i, field in enumerate(batch.schema):
        col = batch.column(i)
        if isinstance(col.type, pa.ExtensionType):
            col = col.storage
        if _is_image(features.get(field.name), col.type):
            raw = col.field("bytes")
            sizes += [0 if b is None else decoded_bytes(b) for b in raw.to_pylist()]
    ends = np.cumsum(sizes)
    start = 0
    while start < batch.num_rows:
        before = int(ends[start - 1]) if start else 0
        end = int(np.searchsorted(ends, before + DEFAULT_CHUNK_BYTES, side="right"))
        end = max(start + 1, end)
        yield start, batch.slice(start, end - start), int(ends[end - 1]) - before
        start = end

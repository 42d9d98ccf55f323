"""The true layout of Lance tables for ``treadle simulate``: the pages of the columns a loader
reads through the chunk cache, at the byte offsets their data files' footers give.

:meth:`treadle.plan.simlayout.TableBytes.of` lays a table out without reading it (all of a
row's bytes in one column from byte 0 of each data file). :func:`page_layout` reads each data
file's footer instead, as the loader does (:mod:`treadle.read.chunk_rows`), so the simulator
maps rows to the chunks the loader fetches, and knows the sizes of data files and manifests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from treadle.errors import TreadleError
from treadle.plan.simlayout import Pages, TableBytes
from treadle.read.chunk_media import window_chunks
from treadle.read.chunk_rows import ChunkedColumn, chunked_path
from treadle.read.fixed import (
    FULL_ZIP_ROW_BYTES,
    FixedReader,
    fixed_width,
    page_span,
)
from treadle.read.local_copies import data_file
from treadle.table.tensors import tensor_shape

if TYPE_CHECKING:
    from treadle.read.sample_reader import SampleReader
    from treadle.storage.chunkstore import ChunkStore
    from treadle.table.table import Table

__all__ = ["media_windows", "page_layout"]


def page_layout(tables: Sequence[Table], chunks: ChunkStore,
                reader: FixedReader | None = None) -> list[TableBytes]:  # fmt: skip
    """Per table, the pages of its wide fixed-width columns that a loader's reader reads
    through ``chunks`` past the object cache; a table with none has no columns. Nothing
    but footers (all of them, where the loader reads each when first needed) and manifest
    sizes is read. ``reader``: a loader's own
    (``loader.lookahead_stage.reader.fixed``), to take its columns as it chose them."""
    out, first = [], 0
    for table in tables:
        objects: dict[str, int] = {}
        sizes: list[int] = []
        keys: list[str] = []
        columns = []
        for f in table.dataset.schema:
            if reader is not None:
                col = reader.chunked(table, f.name) if fixed_width(f) else None
            else:
                col = _chunked(table, f, chunks)
            if col is None:
                continue
            starts, files, positions = col.pages()  # every footer read
            ids = []
            for i in files.tolist():
                obj = col.objects[i]
                if obj.name not in objects:
                    objects[obj.name] = len(sizes)
                    sizes.append(obj.size)
                    keys.append(obj.key)
                ids.append(objects[obj.name])
            columns.append(
                Pages(starts, np.asarray(ids, np.int64), positions, col.row_bytes, f.name)
            )
        layout = TableBytes(table.name, int(table.num_moments), columns,
                            np.asarray(sizes, np.int64), first, _manifest_bytes(table),
                            keys=keys)  # fmt: skip
        out.append(layout)
        first += layout.num_objects
    return out


def _chunked(table: Table, f: pa.Field, chunks: ChunkStore) -> ChunkedColumn | None:
    """A wide fixed-width column's pages (the reader's ``chunked`` path), or None: narrow
    (read whole or taken, as the reader does)."""
    shape = tensor_shape(f)
    if shape is None or not pa.types.is_fixed_size_list(f.type):
        return None
    vt = f.type.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        return None
    dtype = np.dtype(vt.to_pandas_dtype()).newbyteorder("<")
    if f.type.list_size * dtype.itemsize < FULL_ZIP_ROW_BYTES:
        return None
    return chunked_path(table, f, dtype, shape, chunks, (data_file, page_span))


def _manifest_bytes(table: Table) -> int:
    """The size of the manifest of the table's pinned version (Lance's V2 names, then V1's),
    or 0 where it cannot be found."""
    store = table.project.store
    version = int(table.dataset.version)
    base = store.relative_key(f"{table.uri}/_versions")
    for name in (f"{(1 << 64) - 1 - version}.manifest", f"{version}.manifest"):
        try:
            return int(store.size(f"{base}/{name}"))
        except TreadleError:  # not this naming scheme
            continue
    return 0


def media_windows(reader: SampleReader) -> Callable[..., list[tuple[str, int, np.ndarray, int]]]:
    """``treadle simulate``'s ``media``: the video windows ``reader`` (of the plan's
    components, as a loader's) reads for samples ``(component, moment)``, each as ``(stream
    key, stream bytes, chunk ids, range bytes)``: the byte ranges the loader's lookahead
    fetches (:func:`treadle.read.chunk_media.window_chunks`, from the pinned stream index)."""

    def windows(component: np.ndarray, moment: np.ndarray, chunk_bytes: int
                ) -> list[tuple[str, int, np.ndarray, int]]:  # fmt: skip
        got = window_chunks(reader, component, moment, chunk_bytes)
        return [(key, int(index.extent), ids, n) for key, index, ids, n in got]

    return windows

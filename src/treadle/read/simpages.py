"""The true layout of Lance tables for ``treadle simulate``: the pages of the columns a loader
reads through the chunk cache, at the byte offsets their data files' footers give.

:meth:`treadle.plan.simlayout.TableBytes.of` lays a table out without reading it (all of a
row's bytes in one column from byte 0 of each data file). :func:`page_layout` reads each data
file's footer instead, as the loader does (:mod:`treadle.read.chunk_rows`), so the simulator
maps rows to the chunks the loader fetches, and knows the sizes of data files and manifests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from treadle.errors import TreadleError
from treadle.plan.simlayout import Pages, TableBytes
from treadle.read.fixed import RESIDENT_BYTES, FixedReader, fixed_width

if TYPE_CHECKING:
    from treadle.storage.chunkstore import ChunkStore
    from treadle.table.table import Table

__all__ = ["page_layout"]


def page_layout(tables: Sequence[Table], chunks: ChunkStore, resident_bytes: int = RESIDENT_BYTES,
                reader: FixedReader | None = None) -> list[TableBytes]:  # fmt: skip
    """Per table, the pages of its fixed-width columns that a loader's reader (keeping
    ``resident_bytes`` of narrow columns in memory) reads through ``chunks``; a table with
    none has no columns (it is not read through the chunk cache). ``reader``: a loader's
    own (``loader.lookahead_stage.reader.fixed``: its columns as it chose them)."""
    reader = FixedReader(resident_bytes, chunks=chunks) if reader is None else reader
    out, first = [], 0
    for table in tables:
        objects: dict[str, int] = {}
        sizes: list[int] = []
        columns = []
        for f in table.dataset.schema:
            col = reader.chunked(table, f.name) if fixed_width(f) else None
            if col is None:
                continue
            ids = []
            for obj in col.objects:
                if obj.name not in objects:
                    objects[obj.name] = len(sizes)
                    sizes.append(obj.size)
                ids.append(objects[obj.name])
            columns.append(Pages(np.asarray(col.starts, np.int64), np.asarray(ids, np.int64),
                                 np.asarray(col.positions, np.int64), col.row_bytes))  # fmt: skip
        layout = TableBytes(table.name, int(table.num_moments), columns,
                            np.asarray(sizes, np.int64), first, _manifest_bytes(table))  # fmt: skip
        out.append(layout)
        first += layout.num_objects
    return out


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

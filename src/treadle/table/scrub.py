"""Blanking rows of a table version in new data files (what a purge writes).

:func:`scrub_version` takes an opened Lance version and the episode names to remove, and
returns the version's fragments with every fragment that holds one of their rows written
again as a new data file: the same rows in the same order, the purged rows' values
blanked in every column but ``episode`` and ``frame`` (which keep the episode index, and
so every moment id, as it was). Blank is zero for numbers and tensors (a reader of a
whole column needs values), null for the rest, and a value no byte of the old one
survives in: zeros and empty strings under a null struct (a video column's index entry,
whose children may not be null), so neither the media key nor any value is left in the
file. Other fragments are listed as they were. Nothing here commits or deletes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import FragmentMetadata, write_fragments

from treadle.table.episodes import EPISODE, FRAME
from treadle.table.evolve import Edited, schema_without


def _numeric(t: pa.DataType) -> bool:
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def blank(f: pa.Field) -> pa.Array:
    """One blank value of field ``f``: zeros for numbers and tensors (readers of a whole
    column, statistics among them, need values), else null where ``f`` may be null,
    else empty."""
    t = f.type
    if pa.types.is_struct(t):
        children = [blank(t.field(i)) for i in range(t.num_fields)]
        mask = pa.array([f.nullable])
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if f.nullable and not _numeric(t):
        return pa.nulls(1, t)
    if pa.types.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(
            blank(t.value_field).take([0] * t.list_size), t.list_size
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.array([[]], t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([""], t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([b""], t)
    if pa.types.is_boolean(t):
        return pa.array([False], t)
    return pa.array([0], pa.int64()).cast(t)


def scrub_rows(data: pa.Table, purge: np.ndarray) -> pa.Table:
    """``data`` with the rows ``purge`` marks blanked (``episode``/``frame`` kept)."""
    pick = np.arange(data.num_rows, dtype=np.int64)
    pick[purge] = data.num_rows  # the blank value, after the old ones
    take = pa.array(pick)
    columns = []
    for f, col in zip(data.schema, data.columns, strict=True):
        if f.name in (EPISODE, FRAME):
            columns.append(col)
            continue
        whole = pa.concat_arrays([*col.chunks, blank(f)]) if col.num_chunks else blank(f)
        columns.append(whole.take(take))
    return pa.Table.from_arrays(columns, schema=data.schema)


@dataclass
class Scrubbed:
    """A version's fragments after :func:`scrub_version`, and what it replaced."""

    edited: Edited | None  # None: the version held no purged row
    replaced: list[FragmentMetadata] = field(default_factory=list)
    streams: set[str] = field(default_factory=set)  # media keys the purged rows named
    written: list[str] = field(default_factory=list)  # the new data files (paths in data/)


def scrub_version(
    ds: Any,
    episodes: set[str],
    video: list[str],
    rows_of: Callable[[Any], np.ndarray],
    before_write: Callable[[], None],
    memo: dict[Any, list[FragmentMetadata]],
) -> Scrubbed:
    """``ds`` with each fragment holding a row of ``episodes`` written again, those rows
    blanked (``rows_of(fragment)``: the rows to blank; ``video``: the video columns, whose
    purged entries' media keys are collected; ``memo``: fragments written for an earlier
    version that lists the same one, under the same schema, are listed again)."""
    metas: list[FragmentMetadata] = []
    out = Scrubbed(None)
    for frag in ds.get_fragments():
        purge = rows_of(frag)
        if not purge.any():
            metas.append(frag.metadata)
            continue
        out.replaced.append(frag.metadata)
        key = (tuple((df.path, tuple(df.fields)) for df in frag.metadata.files), str(ds.schema))
        if key in memo:
            metas.extend(memo[key])
            continue
        before_write()
        data = frag.to_table()
        for col in video:
            streams = pc.struct_field(data.column(col).filter(pa.array(purge)), "stream")
            out.streams.update(s for s in streams.to_pylist() if s is not None)
        new = scrub_rows(data, purge)
        written = write_fragments(new, ds, schema=ds.schema, max_rows_per_file=1 << 30)
        metas.extend(written)
        memo[key] = written
        out.written.extend(df.path for meta in written for df in meta.files)
    if out.replaced:  # what the schema records of the purged episodes goes too
        out.edited = Edited(schema_without(ds, episodes), metas)
    return out

"""Which chunks a loader's steps need, for its ``lookahead`` stage (:mod:`treadle.read.lookahead`).

A step's samples read rows of chunked columns (:mod:`treadle.read.chunk_rows`: each row a byte
range of a data file) and video windows (:mod:`treadle.read.chunk_media`: a byte range of a
stream); each range touches chunks of its object in the chunk store. :func:`step_needs` maps
the samples of several steps to their chunks in one vectorised pass (the footers they need read
at once), and splits them per step: per object, in the order of the reader's takes (columns as
the reader reads them, data files ascending), then the video streams; the chunk ids sorted.
The stage plans a round of steps at a time with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.read.chunk_media import media_chunks
from treadle.read.chunk_rows import ChunkedColumn, read_footers
from treadle.read.rows import padded_rows

if TYPE_CHECKING:
    from treadle.read.sample_reader import SampleReader
    from treadle.read.step_chunks import StepTakes
    from treadle.storage.chunkstore import ObjectChunks

__all__ = ["Need", "chunked_rows", "step_needs"]

Need = list[tuple[Any, "ObjectChunks", np.ndarray]]
"""One step's chunks: ``(store, object, chunk ids)`` per object it reads."""

Samples = tuple[np.ndarray, np.ndarray]  # (component, moment) of one step's samples


def step_needs(reader: SampleReader | StepTakes, steps: list[Samples]) -> list[Need]:
    """Per step (its samples' ``(component, moment)``), the chunks its rows of chunked columns
    and its video windows need."""
    if not steps:
        return []
    component = np.concatenate([np.asarray(c) for c, _ in steps])
    moment = np.concatenate([np.asarray(m) for _, m in steps])
    owner = np.repeat(np.arange(len(steps)), [len(c) for c, _ in steps])  # each sample's step
    rows = chunked_rows(reader, component, moment)
    read_footers((col, col.files_of(r)) for col, r, _ in rows)  # every table's at once
    by_step: list[dict[str, tuple[Any, ObjectChunks, list[np.ndarray]]]] = [{} for _ in steps]
    for col, r, slots in rows:
        for f, (who, ids) in col.owned_chunk_ids(r, owner[slots]).items():
            obj = col.objects[f]
            cut = np.flatnonzero(np.diff(who)) + 1  # who is sorted: one run per step
            for w, part in zip(who[np.r_[0, cut]].tolist(), np.split(ids, cut)):
                by_step[w].setdefault(obj.name, (col.store, obj, []))[2].append(part)
    for w, (c, m) in enumerate(steps):
        for store, obj, ids in media_chunks(reader, np.asarray(c), np.asarray(m)):
            by_step[w].setdefault(obj.name, (store, obj, []))[2].append(ids)
    return [[(s, o, np.unique(np.concatenate(v))) for s, o, v in d.values()] for d in by_step]


def chunked_rows(reader: SampleReader | StepTakes, component: np.ndarray, moment: np.ndarray
                 ) -> list[tuple[ChunkedColumn, np.ndarray, np.ndarray]]:  # fmt: skip
    """The rows these samples read of each chunked column: ``(column, rows, the sample of
    each row)``, in the reader's order of takes; a padded window's rows as the reader takes
    them (:func:`~treadle.read.rows.padded_rows`: clamped to the moment's episode)."""
    fixed = reader.fixed
    out = []
    for take in reader.takes(component, moment):
        if take.fixed is None:
            continue
        spec = take.group[0].spec
        offsets = np.asarray(spec.offsets if spec is not None else [0], np.int64)
        if spec is not None and spec.pad:  # past its episode: the episode's nearest row
            rows = padded_rows(take.table, take.moments, offsets)[0].reshape(-1)
        else:
            rows = (take.moments[:, None] + offsets[None, :]).reshape(-1)
            rows = np.minimum(np.maximum(rows, 0), take.table.num_moments - 1)
        slots = np.repeat(take.slots, len(offsets))
        for cs in take.group:
            col = fixed.chunked(take.table, cs.column) if fixed is not None else None
            if col is not None:
                out.append((col, rows, slots))
    return out

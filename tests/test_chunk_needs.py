"""A round of steps' chunk needs in one pass (treadle.read.chunk_needs.step_needs) equals the
needs each step had when the stage computed them one step at a time (the reference below is
that per-step computation, kept as it was)."""

from __future__ import annotations

import numpy as np
import pytest

from test_lookahead import CHUNK as LCHUNK
from test_lookahead import _recipe, roots, small_caches  # noqa: F401


def _old_need_of(reader, component, moment):
    """The stage's per-step needs before they were planned a round at a time (0b2e33f)."""
    from treadle.read.chunk_media import media_chunks
    from treadle.read.chunk_rows import read_footers

    fixed, rows = reader.fixed, []
    for take in reader.takes(component, moment):
        if take.fixed is None:
            continue
        spec = take.group[0].spec
        offsets = np.asarray(spec.offsets if spec is not None else [0], np.int64)
        r = (take.moments[:, None] + offsets[None, :]).reshape(-1)
        r = np.minimum(np.maximum(r, 0), take.table.num_moments - 1)
        for cs in take.group:
            col = fixed.chunked(take.table, cs.column) if fixed is not None else None
            if col is not None:
                rows.append((col, r))
    read_footers((col, col.files_of(r)) for col, r in rows)
    by_obj = {}
    for col, r in rows:
        file, start = col.locate(np.unique(r))
        size = col.chunks.chunk_bytes
        from treadle.read.chunk_rows import chunk_span

        for i in np.unique(file[file >= 0]).tolist():
            s = start[file == i]
            ids = np.unique(chunk_span(s // size, (s + col.row_bytes - 1) // size))
            obj = col.objects[i]
            by_obj.setdefault(obj.name, (col.store, obj, []))[2].append(ids)
    for store, obj, ids in media_chunks(reader, component, moment):
        by_obj.setdefault(obj.name, (store, obj, []))[2].append(ids)
    return [(s, o, np.unique(np.concatenate(v))) for s, o, v in by_obj.values()]


@pytest.mark.s3
def test_a_round_of_needs_equals_the_per_step_needs(roots, small_caches, monkeypatch):  # noqa: F811
    """Real steps, a step of no samples, one sample read again, one component only: the
    same objects in the same order, the same chunk ids."""
    import treadle as td
    from treadle.read.chunk_needs import step_needs

    _, s3 = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * LCHUNK))
    loader = td.TrainLoader(_recipe(s3), steps=12, lookahead=2)
    [dict(b) for b in loader]
    stage = loader.lookahead_stage
    batches = [stage.samples(s) for s in range(12)]
    steps = [(b.component, b.moment) for b in batches]
    steps.insert(3, (np.zeros(0, np.int64), np.zeros(0, np.int64)))  # a step of no samples
    steps.append((steps[0][0][:1], steps[0][1][:1]))  # one sample, the same rows again
    steps.append((np.ones(5, np.int64), np.full(5, 3, np.int64)))  # one component only
    got = step_needs(stage.reader, steps)
    for k, (c, m) in enumerate(steps):
        want = _old_need_of(stage.reader, c, m)
        assert [o.name for _, o, _ in got[k]] == [o.name for _, o, _ in want], k
        for (_, _, a), (_, _, b) in zip(got[k], want):
            assert a.tolist() == b.tolist(), k

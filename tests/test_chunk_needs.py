"""A round of steps' chunk needs in one pass (treadle.read.chunk_needs.step_needs) equals the
needs each step had when the stage computed them one step at a time (the reference below is
that per-step computation, kept as it was, for windows without padding); a padded window
asks for the rows the reader reads."""

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


@pytest.fixture(scope="module")
def episodes(s3_server, tmp_path_factory):
    """A table of 12 episodes of 7 to 17 rows (16x16x3 images: 768 B rows) on S3."""
    import treadle as td
    from treadle.storage import Store

    path = tmp_path_factory.mktemp("episodes")
    table = td.Client(str(path), create=True).project("p").branch().table("e")
    rng = np.random.default_rng(9)
    for e in range(12):
        n = int(rng.integers(7, 18))
        table.append_episode({"image": rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)},
                             episode=f"ep-{e}")  # fmt: skip
    url = s3_server.url(f"needs-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return str(path), url, s3_server.storage_options()


@pytest.mark.s3
def test_padded_windows_ask_for_the_rows_their_episode_gives(episodes, tmp_path, monkeypatch):
    """A padded window's offsets past its episode read the episode's nearest row (LeRobot's
    edge padding): each step asks for the chunks of the rows its reader reads, not of the
    rows of the neighbouring episode that ``moment + offset`` would be (it asked for those:
    the reader then took the episodes' edge rows with Lance where no chunk held them)."""
    import treadle as td
    from treadle.read.chunk_needs import step_needs
    from treadle.read.rows import padded_rows

    local, url, options = episodes
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")  # no data file copied whole
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "1K")  # a row and a bit a chunk
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "4M")
    offsets = [-6, 0, 5]

    def recipe(client):
        comp = td.Component(client.project("p").branch().table("e"),
                            td.Windows({"image": td.Rows(offsets, pad=True)}))  # fmt: skip
        return td.Recipe(seed=4, batch_size=8, components=[comp])

    want = [dict(b) for b in td.TrainLoader(recipe(td.Client(local)), steps=12)]
    loader = td.TrainLoader(recipe(td.Client(url, storage_options=options)), steps=12,
                            lookahead=2)  # fmt: skip
    got = [dict(b) for b in loader]
    for a, b in zip(got, want):
        assert np.array_equal(a["image"], b["image"])
        assert np.array_equal(a["image_is_pad"], b["image_is_pad"])
    stage = loader.lookahead_stage
    table = stage.reader.tables[0]
    col = stage.reader.fixed.chunked(table, "image")
    assert col is not None  # read from chunks
    edges = 0
    for step in range(12):
        batch = stage.samples(step)
        (need,) = step_needs(stage.reader, [(batch.component, batch.moment)])
        asked = {(o.name, c) for _, o, ids in need for c in ids.tolist()}
        grid, pad = padded_rows(table, np.asarray(batch.moment), np.asarray(offsets))
        read = {(col.objects[f].name, c)
                for f, ids in col.chunk_ids(grid.reshape(-1)).items() for c in ids.tolist()}  # fmt: skip
        assert read <= asked, (step, sorted(read - asked))
        edges += int(pad.sum())
    assert edges > 0  # windows did cross their episodes

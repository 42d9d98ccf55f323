"""``workers=2`` with ``lookahead`` past the chunk cache: the workers read (nearly) every row
from chunks, as ``workers=0`` does. The stage's position is where the workers have read
(``treadle.read.shared_window.ReadFrontier``), its window what the slowest worker reads
ahead of it; the chunks of steps read but not yet taken back are not held (a window sized
for the workers' prefetched batches and slots did not fit the cache: rows were taken)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import treadle as td
from loader_helpers import same_batches
from treadle import fastpaths, reaper
from treadle.read import lookahead as lookahead_mod
from treadle.read.fixed import FixedReader
from treadle.storage import Store
from treadle.torch.delivery import StepLoader

ROWS, BATCH, CHUNK = 1200, 16, 16 << 10
STEPS = 40


@pytest.fixture(scope="module")
def roots(s3_server, tmp_path_factory):
    """One table of 768-byte rows (20 a chunk) on local disk and its copy on S3."""
    path = tmp_path_factory.mktemp("local")
    local = td.Client(str(path), create=True)
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, (ROWS, 16, 16, 3), dtype=np.uint8)
    local.project("p").branch().table("a").append({"image": image}, message="a")
    url = s3_server.url(f"lookw-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return local, td.Client(url, storage_options=s3_server.storage_options())


def _recipe(client: td.Client) -> td.Recipe:
    comps = [td.Component(client.project("p").branch().table("a"), None)]
    return td.Recipe(seed=4, batch_size=BATCH, components=comps,
                     shuffle=td.BlockShuffle(block_rows=64, window_blocks=2))  # fmt: skip


def _run(client: td.Client, **kw) -> tuple[td.TrainLoader, list[dict]]:
    loader = td.TrainLoader(_recipe(client), steps=STEPS, prefetch=2, read_ahead=2, **kw)
    return loader, [dict(b) for b in loader]


@pytest.mark.s3
@pytest.mark.slow  # worker processes (~5 s)
def test_workers_past_the_chunk_cache_read_rows_from_chunks(roots, tmp_path, monkeypatch):
    local, s3 = roots
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")  # no data file fits the object cache
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(8 * CHUNK))  # a sixth of the table
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", str(CHUNK))
    monkeypatch.setattr(fastpaths, "_OFF", {})
    keep = partial(FixedReader, resident_bytes=0)  # every reader reads rows from chunks
    from treadle.read import sample_reader

    monkeypatch.setattr(sample_reader, "FixedReader", keep)
    monkeypatch.setattr(StepLoader, "_resident_bytes", 0)
    _, want = _run(local)
    reports = {}
    for workers in (0, 2):
        monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / f"cache{workers}"))
        loader, got = _run(s3, lookahead=4, workers=workers)
        same_batches(got, want)
        assert reaper.drain(30)
        reports[workers] = dict(lookahead_mod.LAST)
        cs = loader.lookahead_stage.chunks
        assert cs.used() <= cs.max_bytes == 8 * CHUNK
    # was 0.27 and 0.39: a window sized for the workers' slots found no room, the stage
    # gave up and rows were taken
    assert reports[2]["samples"] == STEPS * BATCH
    assert reports[2]["rows_from_chunks"] >= 0.95, reports
    assert reports[2]["hit_rate"] >= reports[0]["hit_rate"] - 0.05, reports

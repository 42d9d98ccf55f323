"""A loader's ``lookahead`` fetches the stream bytes of the video windows of the steps ahead
into the chunk cache (treadle.read.chunk_media), and the reader reads windows from there:
frames are the same as without it, the bound holds, and with ``td.BlockShuffle`` each
stream chunk is fetched once for all the samples that read it."""

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
from treadle.storage.filecache import copy_name
from treadle.video._testing import synthetic_frames

pytestmark = pytest.mark.s3

EPISODES, FRAMES, BATCH, STEPS, CHUNK = 6, 40, 8, 12, 1 << 10


def _write(client: td.Client) -> None:
    branch = client.project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(EPISODES):
            cams = {f"cam{k}": td.VideoFrames(synthetic_frames(FRAMES, 32, 32, seed=2 * e + k),
                                              fps=10) for k in range(2)}  # fmt: skip
            action = np.arange(FRAMES * 3, dtype=np.float32).reshape(FRAMES, 3) + 1000 * e
            image = np.random.default_rng(e).integers(0, 256, (FRAMES, 16, 16, 3), np.uint8)
            tx.table("v").append_episode({**cams, "action": action, "image": image},
                                         episode=f"ep-{e}")  # fmt: skip


@pytest.fixture(scope="module")
def roots(s3_server, tmp_path_factory):
    """Six episodes of two cameras, an action and a wide image column (768 B rows, read
    from chunks too) on local disk, and their byte-for-byte copy on S3."""
    path = tmp_path_factory.mktemp("local")
    local = td.Client(str(path), create=True)
    _write(local)
    url = s3_server.url(f"lookvideo-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    streams = 0
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
        streams += f.stat().st_size if f.suffix == ".h264" else 0
    return local, td.Client(url, storage_options=s3_server.storage_options()), streams


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """An object cache too small for any data file, chunks of 1 KiB (a stream is several)."""
    from treadle.read import sample_reader

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", f"{CHUNK}B")
    monkeypatch.setattr(fastpaths, "_OFF", {})
    monkeypatch.setattr(sample_reader, "FixedReader", partial(FixedReader, resident_bytes=64 << 10))


def _recipe(client: td.Client, shuffle: object = None) -> td.Recipe:
    windows = td.Windows({"cam0": td.Video([0, 1]), "cam1": td.Video([0, 2]),
                          "action": td.Rows([0]), "image": td.Rows([1])})  # fmt: skip
    comp = td.Component(client.project("p").branch().table("v"), windows)
    return td.Recipe(seed=4, batch_size=BATCH, components=[comp], shuffle=shuffle)


def _run(client, shuffle=None, **kw):
    loader = td.TrainLoader(_recipe(client, shuffle), steps=STEPS, **kw)
    return loader, [dict(b) for b in loader]


BLOCK = td.BlockShuffle(block_rows=32, window_blocks=2)


def test_windows_read_from_chunks_fetched_once(roots, caches, monkeypatch):
    """A chunk cache that holds every stream and the image column: each window and row is
    read from chunks (no request of its own), frames equal local disk's, and each stream
    chunk is fetched once (bytes fetched at most the streams' bytes), with the media
    counters reported apart from the rows'."""
    local, s3, streams = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(1 << 20))
    _, want = _run(local, BLOCK)
    same_batches(_run(local, BLOCK, lookahead=4)[1], want)  # a local root: nothing to fetch
    loader, got = _run(s3, BLOCK, lookahead=4)
    same_batches(got, want)
    stage = loader.lookahead_stage
    st = stage.chunks.stats.since(stage._base)
    need = {(o.name, c) for s in range(STEPS) for _, o, ids in stage._need(s) if o.media
            for c in ids.tolist()}  # fmt: skip
    assert st.media_misses == len(need) > 0 and st.media_hits > 0  # blocks reuse chunks
    assert st.windows_fetched == 0 and st.windows_read == 2 * STEPS * BATCH
    assert st.rows_taken == 0 and st.rows_read > 0 and st.misses > st.media_misses
    assert 0 < st.media_fetched_bytes <= streams and st.media_requests <= len(need)
    assert reaper.drain(30)
    report = lookahead_mod.LAST
    assert report["windows_from_chunks"] == 1.0 and report["media_hit_rate"] > 0
    assert report["media_requests_per_sample"] == round(st.media_requests / (STEPS * BATCH), 4)
    assert td.info().object_cache["lookahead"] == report


@pytest.mark.parametrize("shuffle", [None, BLOCK], ids=["full", "block"])
def test_a_small_cache_keeps_its_bound_and_the_frames(roots, caches, monkeypatch, shuffle):
    """A chunk cache of 24 chunks, a fraction of the streams and image rows (their chunks
    evicted by next use together): the bound holds throughout, frames are the same, and
    windows whose chunks found no room are fetched with range requests (counted). The
    block shuffle reads windows from chunks; the full shuffle's window may not fit (the
    stage then stops and says why)."""
    local, s3, streams = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(24 * CHUNK))
    assert 24 * CHUNK < streams  # and the image column is 184 kB
    _, want = _run(local, shuffle)
    seen: list[int] = []
    from treadle.storage.chunkstore import ChunkStore

    real = ChunkStore.download

    def watched(self, store, reserved):
        real(self, store, reserved)
        seen.append(self.used())

    monkeypatch.setattr(ChunkStore, "download", watched)
    loader, got = _run(s3, shuffle, lookahead=2, read_ahead=1)
    same_batches(got, want)
    cs = loader.lookahead_stage.chunks
    assert max(seen, default=0) <= cs.max_bytes and cs.used() <= cs.max_bytes
    st = cs.stats.since(loader.lookahead_stage._base)
    assert st.windows_read + st.windows_fetched == 2 * STEPS * BATCH and st.media_misses > 0
    if shuffle is not None:
        assert seen and st.windows_read > 0, st


def test_a_reader_makes_no_files_for_streams_nothing_fetched(tmp_path):
    """``ChunkStore.existing`` (what a reader asks for each window) finds only objects some
    process made; it makes no files for the others (a full shuffle past the cache reads
    every stream with range requests: none of them gets files in the chunk folder)."""
    from treadle.storage.chunkstore import ChunkStore

    store = Store.open(str(tmp_path / "root"), create=True)
    cs = ChunkStore(tmp_path / "chunks", 1 << 20, 1024)
    assert cs.existing(store, "media/v/a.h264", 5000, media=True) is None
    objects = [p for p in (tmp_path / "chunks").iterdir() if p.suffix == ".state"]
    assert objects == []  # the folder's own files (.lock, .boot, the slot files) only
    made = cs.object(store, "media/v/a.h264", 5000, media=True)
    other = ChunkStore(tmp_path / "chunks", 1 << 20, 1024)  # another process's view
    found = other.existing(store, "media/v/a.h264", 5000)
    assert found is not None and found.name == made.name and found.count == 5


def test_workers_read_windows_from_the_stage_s_chunks(roots, caches, monkeypatch):
    """workers=2: this process's stage fetches each step's window bytes (and image rows)
    into the chunk store, each stream chunk once, and the workers read every window from
    those chunks: frames equal local disk's, and the report counts the workers' windows."""
    from treadle.torch.delivery import StepLoader

    local, s3, streams = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(1 << 20))
    monkeypatch.setattr(StepLoader, "_resident_bytes", 64 << 10)  # the workers' readers too
    _, want = _run(local, BLOCK)
    loader, got = _run(s3, BLOCK, lookahead=4, workers=2)
    same_batches(got, want)
    stage = loader.lookahead_stage
    st = stage.chunks.stats.since(stage._base)
    need = {(o.name, c) for s in range(STEPS) for _, o, ids in stage._need(s) if o.media
            for c in ids.tolist()}  # fmt: skip
    assert st.media_misses == len(need) > 0 and st.media_hits > 0  # each chunk fetched once
    assert 0 < st.media_fetched_bytes <= streams
    counts = stage.shared.counts()
    windows = st.windows_read + counts["windows_read"]  # the first step is read here
    assert windows == 2 * STEPS * BATCH and st.windows_fetched + counts["windows_fetched"] == 0
    assert counts["windows_read"] > 0 and counts["rows_read"] > 0
    assert reaper.drain(30)
    report = lookahead_mod.LAST
    assert report["windows_from_chunks"] == 1.0 and report["rows_from_chunks"] == 1.0
    assert report["media_requests_per_sample"] == round(st.media_requests / (STEPS * BATCH), 4)


def test_workers_with_a_small_cache_keep_its_bound_and_the_frames(roots, caches, monkeypatch):
    """workers=2 with a chunk cache of 24 chunks (a fraction of the streams): the bound
    holds in every process (the store's folder is measured after the run and by this
    process's fetches), frames are the same, and every window is counted once."""
    local, s3, streams = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(24 * CHUNK))
    _, want = _run(local, BLOCK)
    seen: list[int] = []
    from treadle.storage.chunkstore import ChunkStore

    real = ChunkStore.download

    def watched(self, store, reserved):
        real(self, store, reserved)
        seen.append(self.used())

    monkeypatch.setattr(ChunkStore, "download", watched)
    loader, got = _run(s3, BLOCK, lookahead=2, workers=2, read_ahead=1)
    same_batches(got, want)
    stage = loader.lookahead_stage
    cs = stage.chunks
    assert seen and max(seen) <= cs.max_bytes and cs.used() <= cs.max_bytes
    st, counts = cs.stats.since(stage._base), stage.shared.counts()
    windows = st.windows_read + st.windows_fetched
    windows += counts["windows_read"] + counts["windows_fetched"]
    assert windows == 2 * STEPS * BATCH and st.media_misses > 0
    assert counts["windows_read"] > 0, counts


def _two_streams_cached(s3_server, caches, name):
    """A project on S3 with two episodes of one video column, each stream's chunks fetched
    into this node's chunk cache by a lookahead loader: (client, project, the cache folder,
    each stream's key -> the stem its chunk files are named by)."""
    url = s3_server.url(f"lookvideo-{name}-{id(caches)}")
    client = td.Client(url, storage_options=s3_server.storage_options())
    project = client.project("p")
    branch = project.branch()
    with branch.transaction("episodes") as tx:
        for e in range(2):
            cam = td.VideoFrames(synthetic_frames(FRAMES, 32, 32, seed=e), fps=10)
            tx.table("v").append_episode({"cam0": cam}, episode=f"ep-{e}")
    comp = td.Component(branch.table("v"), td.Windows({"cam0": td.Video([0, 1])}))
    recipe = td.Recipe(seed=4, batch_size=BATCH, components=[comp])
    loader = td.TrainLoader(recipe, steps=4, lookahead=2)
    assert len([dict(b) for b in loader]) == 4
    store, folder = client.store, loader.lookahead_stage.chunks.directory
    sizes = {k: store.size(k) for k in store.list("") if k.endswith(".h264")}
    stems = {k: copy_name(store, k, n) for k, n in sizes.items()}
    held = {k for k, s in stems.items() if any(folder.glob(f"{s}_*.state"))}
    assert held == set(sizes) and len(held) == 2  # both streams' chunks were fetched
    return client, project, folder, stems


def _only_kept_streams_cached(store, folder, stems) -> set[str]:
    """The streams gone from the store (asserted to have no chunk file left), each kept
    stream asserted to keep its chunks."""
    gone = {k for k in stems if not store.exists(k)}
    for k in gone:
        assert not list(folder.glob(f"{stems[k]}_*")), k
    for k in set(stems) - gone:  # the kept episode's stream keeps its chunks
        assert list(folder.glob(f"{stems[k]}_*.state")), k
    return gone


def test_a_purge_forgets_the_chunks_of_the_streams_it_deletes(s3_server, caches, monkeypatch):
    """The purged episodes' streams leave this node's chunk cache with them: their frames
    stayed on disk after the purge deleted them from the store."""
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "4M")
    client, project, folder, stems = _two_streams_cached(s3_server, caches, "purge")
    project.purge("v", ["ep-0"], reason="consent withdrawn")
    assert len(_only_kept_streams_cached(client.store, folder, stems)) == 1


def test_gc_forgets_the_chunks_of_the_streams_it_deletes(s3_server, caches, monkeypatch):
    """A stream gc deletes (no row of a retained commit names it) leaves this node's chunk
    cache with it: its frames stayed on disk after gc deleted it from the store."""
    from datetime import UTC, datetime, timedelta

    from treadle.catalog.gc import collect_garbage

    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "4M")
    client, project, folder, stems = _two_streams_cached(s3_server, caches, "gc")
    project.branch().table("v").delete_episodes(["ep-0"])
    later = datetime.now(UTC) + timedelta(days=1)  # the first commit expires, its stream goes
    report = collect_garbage(project, timedelta(0), keep_days=0, now=later)
    assert len(_only_kept_streams_cached(client.store, folder, stems)) == 1
    assert len(report.removed_media) == 1

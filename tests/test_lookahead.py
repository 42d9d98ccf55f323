"""A loader's ``lookahead`` (treadle.read.lookahead): the plan drives the chunk cache. Tables
past the object cache's bound are read from chunks fetched ahead; batches are the same as
without it, the bound holds, and an abandoned loader ends without a deadlock."""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

import treadle as td
from loader_helpers import same_batches
from treadle import fastpaths, reaper
from treadle.errors import PlanError
from treadle.read import lookahead as lookahead_mod
from treadle.read.fixed import FixedReader
from treadle.storage import Store
from treadle.storage.chunkstore import ChunkStore
from treadle.torch.delivery import StepLoader

ROWS, BATCH, CHUNK = 300, 16, 16 << 10


def _write(client: td.Client) -> None:
    rng = np.random.default_rng(5)
    branch = client.project("p").branch()
    for t, n in (("a", ROWS), ("b", ROWS // 2)):
        image = rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)  # 768 B rows: full-zip
        action = rng.standard_normal((n, 7), dtype=np.float32)
        branch.table(t).append({"image": image, "action": action}, message=t)


@pytest.fixture(scope="module")
def roots(s3_server, tmp_path_factory):
    """A two-table mix on local disk and its byte-for-byte copy on S3."""
    path = tmp_path_factory.mktemp("local")
    local = td.Client(str(path), create=True)
    _write(local)
    url = s3_server.url(f"look-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return local, td.Client(url, storage_options=s3_server.storage_options())


@pytest.fixture
def small_caches(tmp_path, monkeypatch):
    """An object cache too small for any data file, a chunk cache of 6 chunks of 16 KiB
    (under a tenth of the image columns), readers that keep no image column in memory."""
    from treadle.read import sample_reader

    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(6 * CHUNK))
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", f"{CHUNK}B")
    monkeypatch.setattr(fastpaths, "_OFF", {})
    monkeypatch.setattr(sample_reader, "FixedReader", partial(FixedReader, resident_bytes=64 << 10))
    return tmp_path / "cache" / "chunks"


def _recipe(client: td.Client) -> td.Recipe:
    branch = client.project("p").branch()
    comps = [td.Component(branch.table(t), None, weight=w) for t, w in (("a", 0.3), ("b", 0.7))]
    return td.Recipe(seed=3, batch_size=BATCH, components=comps)


def _run(client, steps, **kw):
    loader = td.TrainLoader(_recipe(client), steps=steps, **kw)
    return loader, [dict(b) for b in loader]


@pytest.mark.s3
def test_a_stage_that_asked_for_no_chunk_reports_no_hit_rate(roots, tmp_path, monkeypatch):
    """Tables that fit the object cache are read from whole copies: the stage asks nothing of
    the chunk cache, and its report says so (it said hit rate 1.0 and rows from chunks 0.0)."""
    _, s3 = roots
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    loader, _ = _run(s3, 4, lookahead=2)
    report = loader.lookahead_stage.report()
    assert report["chunks"] == 0 and report["hit_rate"] is None
    assert report["rows_from_chunks"] is None and report["samples"] > 0


@pytest.mark.s3
def test_batches_equal_and_the_bound_holds(roots, small_caches, monkeypatch):
    local, s3 = roots
    with pytest.raises(PlanError, match="lookahead"):
        td.TrainLoader(_recipe(local), lookahead=-1)
    _, want = _run(local, 12)
    _, same_local = _run(local, 12, lookahead=3)  # a local root: nothing to fetch
    same_batches(same_local, want)
    loader, got = _run(s3, 12, lookahead=3)  # a chunk cache under a fifth of the tables
    same_batches(got, want)
    cs = loader.lookahead_stage.chunks
    assert cs.chunk_bytes == CHUNK and cs.used() <= cs.max_bytes == 6 * CHUNK
    assert cs.stats.bypassed > cs.stats.misses // 2  # the full shuffle's window does not fit
    assert "do not fit the chunk cache" in fastpaths.reasons()["chunk cache"]
    monkeypatch.setattr(fastpaths, "_OFF", {})
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))  # the whole window fits
    loader, got = _run(s3, 12, lookahead=3)
    same_batches(got, want)
    cs = loader.lookahead_stage.chunks
    assert cs.used() <= cs.max_bytes and cs.stats.bypassed == 0
    assert cs.stats.requests > 0 and cs.stats.fetched_bytes > 0
    assert reaper.drain(30)  # the stage's thread joined, its report made
    report = lookahead_mod.LAST
    assert report["samples"] == 12 * BATCH and report["requests_per_sample"] > 0
    # every row was read from a chunk fetched before its step was read: none was taken
    assert cs.stats.rows_taken == 0 and cs.stats.rows_read > 0, report
    assert report["rows_from_chunks"] == 1.0 and 0 <= report["reader_waited"] <= 1
    found = td.info()
    assert found.paths["chunk cache"].on and found.object_cache["lookahead"] == report
    comp = td.Component(s3.project("p").branch().table("b"), None)
    want_eval = [dict(b) for b in td.EvalLoader(comp, 16)]
    same_batches([dict(b) for b in td.EvalLoader(comp, 16, lookahead=2)], want_eval)
    assert "chunk cache" not in fastpaths.reasons()


@pytest.mark.s3
@pytest.mark.slow  # worker processes (~5 s)
def test_workers_read_the_chunks_this_process_fetched(roots, small_caches, monkeypatch, tmp_path):
    """workers=2 with lookahead: this process walks every step and fetches each chunk once
    (the same chunks as workers=0), the workers read every row from them, batches are the
    same, and a chunk cache smaller than the tables is never exceeded."""
    local, s3 = roots
    monkeypatch.setattr(StepLoader, "_resident_bytes", 64 << 10)  # the workers' readers too
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))  # every chunk fits
    _, want = _run(local, 12)
    runs = {}
    for workers in (0, 2):
        monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / f"cache{workers}"))
        # read_ahead 8: both windows cover the 12 steps in the same rounds, so the ranges
        # obstore merges (gaps included) and the bytes are equal too
        loader, got = _run(s3, 12, lookahead=3, workers=workers, read_ahead=8)
        same_batches(got, want)
        assert reaper.drain(30)
        runs[workers] = (replace(loader.lookahead_stage.chunks.stats), dict(lookahead_mod.LAST))
    (st0, rep0), (st2, rep2) = runs[0], runs[2]
    assert rep2["hit_rate"] == rep0["hit_rate"]
    assert st2.misses == st0.misses > 0 and st2.fetched_bytes == st0.fetched_bytes
    assert st0.rows_read == 12 * BATCH and st2.rows_read == BATCH  # here: only the first step
    assert rep2["samples"] == 12 * BATCH and rep2["rows_from_chunks"] == 1.0, rep2
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "tight"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(6 * CHUNK))  # under a fifth
    loader, got = _run(s3, 12, lookahead=1, workers=2)
    same_batches(got, want)
    cs = loader.lookahead_stage.chunks
    assert cs.used() <= cs.max_bytes == 6 * CHUNK and cs.stats.misses > 0
    loader = td.TrainLoader(_recipe(s3), steps=50, lookahead=2, workers=2)
    it = iter(loader)
    next(it), next(it)
    it.close()  # left early: the stage, its planner and the workers end
    assert reaper.drain(30) and not loader.lookahead_stage._thread.is_alive()
    assert loader.lookahead_stage.shared.fd == -1  # the window's descriptor closed


@pytest.mark.s3
def test_a_window_that_does_not_fit_turns_the_stage_off(roots, small_caches, monkeypatch):
    """A full shuffle over a cache of 2 chunks: most chunks find no room, so the stage stops
    and says why (the ``chunk cache`` fast path); batches stay the same."""
    local, s3 = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(2 * CHUNK))
    monkeypatch.setattr(lookahead_mod, "MIN_ASKED", 16)
    _, want = _run(local, 8)
    _, got = _run(s3, 8, lookahead=3)
    same_batches(got, want)
    assert "do not fit the chunk cache" in fastpaths.reasons()["chunk cache"]


@pytest.mark.s3
def test_rows_no_chunk_holds_are_taken_once_for_all_their_columns(roots, small_caches,
                                                                   monkeypatch):  # fmt: skip
    """A chunk cache of 1 chunk (the stage stops at once), no column resident: each table's
    rows of a batch are taken with one Lance take of both its columns (it was one take per column, one after the
    other: twice the round trips), and batches stay the same."""
    from treadle.read import fixed, sample_reader

    local, s3 = roots
    monkeypatch.setattr(sample_reader, "FixedReader", partial(FixedReader, resident_bytes=0))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(CHUNK))
    monkeypatch.setattr(lookahead_mod, "MIN_ASKED", 1)
    taken = []

    def take(table, idx, columns):
        taken.append(sorted(columns))
        return real(table, idx, columns)

    real = fixed._take
    monkeypatch.setattr(fixed, "_take", take)
    _, want = _run(local, 6)
    taken.clear()
    _, got = _run(s3, 6, lookahead=2)
    same_batches(got, want)
    assert "do not fit the chunk cache" in fastpaths.reasons()["chunk cache"]
    assert taken and all(cols == ["action", "image"] for cols in taken), taken


@pytest.mark.s3
def test_restart_fetches_only_its_steps(roots, small_caches, monkeypatch):
    """A loader resumed at step 8 of 12 (a fresh cache that holds every chunk) fetches each
    chunk its steps 8..11 need exactly once, and nothing else."""
    _, s3 = roots
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))
    plan = td.TrainLoader(_recipe(s3), steps=12).plan
    state = {"record": plan.record.to_json(), "step": 8}
    resumed = td.TrainLoader.from_state(state, s3, steps=12, lookahead=2)
    assert len([dict(b) for b in resumed]) == 4
    stage = resumed.lookahead_stage
    need = {(obj.name, c) for step in range(8, 12) for _, obj, ids in stage._need(step)
            for c in ids.tolist()}  # fmt: skip
    st = replace(stage.chunks.stats)
    assert st.misses == len(need) and st.rows_taken == 0
    whole = td.TrainLoader(_recipe(s3), steps=12, lookahead=2)
    [dict(b) for b in whole]
    more = whole.lookahead_stage.chunks.stats.since(st)
    assert more.hits + more.misses > st.hits + st.misses  # 12 steps ask for more than 4


@pytest.mark.s3
def test_rows_wider_than_two_chunks_are_read_from_chunks(roots, small_caches, monkeypatch):
    """Chunks of 256 bytes: each 768-byte image row spans 3 or 4 of them, and every one is
    fetched (not only a row's first and last), so no row is taken with Lance."""
    local, s3 = roots
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "256B")
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(1 << 20))
    _, want = _run(local, 6)
    loader, got = _run(s3, 6, lookahead=2)
    same_batches(got, want)
    st = loader.lookahead_stage.chunks.stats
    assert loader.lookahead_stage.chunks.chunk_bytes == 256
    assert st.rows_read > 0 and st.rows_taken == 0, st


def test_chunk_ids_are_every_chunk_a_row_spans():
    from treadle.read.chunk_rows import chunk_span

    got = chunk_span(np.asarray([0, 5, 9]), np.asarray([2, 5, 11]))
    assert got.tolist() == [0, 1, 2, 5, 9, 10, 11]


@pytest.mark.s3
def test_abandoned_loader_with_lookahead_ends(roots, small_caches):
    """A loader left after two batches (its iterator dropped, then collected) stops its
    lookahead thread without waiting on it, and no thread is left behind."""
    _, s3 = roots
    before = {t.ident for t in threading.enumerate()}
    loader = td.TrainLoader(_recipe(s3), steps=50, lookahead=4)
    it = iter(loader)
    next(it)
    next(it)
    stage = loader.lookahead_stage
    del it
    gc.collect()
    stage._thread.join(30)
    assert not stage._thread.is_alive()
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith(
        "treadle-lookahead")]  # fmt: skip
    assert left == []


def test_chunk_store_is_shared_with_the_object_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    cs = ChunkStore(tmp_path / "objects" / "chunks", 1 << 20)
    from treadle.storage.filecache import FileCache

    assert FileCache(tmp_path / "objects", 1 << 20).used() == 0  # its folder is not an entry
    assert os.path.isdir(cs.directory)


def test_a_loader_whose_chunk_cache_is_off_leaves_no_earlier_report(tmp_path, monkeypatch):
    """td.info()'s ``lookahead`` is the last loader's: one whose chunk cache is off has none,
    so an earlier run's hit rate must not stand as if it were this run's."""
    assert reaper.drain(30)  # earlier tests' stages have made their reports
    monkeypatch.setattr(fastpaths, "_OFF", {})
    monkeypatch.setattr(lookahead_mod, "LAST", {"hit_rate": 0.95, "samples": 64})
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "objects"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", "0")
    assert lookahead_mod.lookahead_store() is None
    assert "lookahead" not in td.info().object_cache


def test_footers_are_read_once_when_threads_ask_together(tmp_path):
    """A data file's footer is read when its rows are first needed, once, whichever of the
    threads that need it together asks first (a worker's take threads did race: the one
    that found nothing left to read failed)."""
    import time

    from treadle.read.chunk_rows import chunked_column, read_footers
    from treadle.read.fixed import page_span
    from treadle.read.local_copies import data_file

    table = td.Client(str(tmp_path / "root"), create=True).project("p").branch().table("t")
    for part in range(3):  # data files of 10 rows (or more: appends may be merged)
        table.append({"image": np.full((10, 16, 16, 3), part, np.uint8)})
    table = table.pin()
    f = table.dataset.schema.field("image")
    col = chunked_column(table, f, np.dtype(np.uint8), (16, 16, 3),
                         ChunkStore(tmp_path / "chunks", 1 << 20, 1024), (data_file, page_span))  # fmt: skip
    assert not isinstance(col, str) and len(col.files) >= 2
    n = len(col.files)
    read, real = [], col._footer

    def slow(i):
        read.append(i)
        time.sleep(0.05)
        return real(i)

    col._footer = slow
    col.resolve([n - 1])
    assert read == [n - 1]  # only the file asked for
    errors = []

    def ask():
        try:
            col.resolve(range(n))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and sorted(read) == list(range(n))
    file, _ = col.locate(np.asarray([0, 29]))
    assert file.tolist() == [0, n - 1] and col.chunk_ids(np.asarray([29])).keys() == {n - 1}
    # the footers of several columns (a step's tables) are read together, not column by
    # column, and a data file's once for all its columns (two columns of one file each
    # read it: a HEAD and a GET more per file than treadle simulate counts)
    cols = [chunked_column(table, f, np.dtype(np.uint8), (16, 16, 3), col.chunks,
                           (data_file, page_span)) for _ in range(2)]  # fmt: skip
    together = threading.Barrier(n, timeout=30)  # broken unless all are read at once
    footers = []
    for c in cols:
        c._footer = lambda i, c=c, real=c._footer: (together.wait(), footers.append(i), real(i))[2]
    read_footers([(c, range(n)) for c in cols])
    assert sorted(footers) == list(range(n))  # once each, for both columns
    assert all(c.locate(np.asarray([29]))[0].tolist() == [n - 1] for c in cols)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stage_thread_that_dies_makes_the_gate_raise(tmp_path):
    """The stage's thread failing outside a fetch (here telling the workers' window) ends
    with an error at the gate, naming it: readers waiting for a step never wait forever."""

    class Broken:
        def publish(self, *args: object) -> None:
            raise RuntimeError("window gone")

    chunks = ChunkStore(tmp_path / "chunks", 1 << 20, 1 << 10)
    stage = lookahead_mod.Lookahead(object(), lambda step: None, range(4), 2, chunks,
                                    shared=Broken())  # fmt: skip
    stage._thread.join(30)
    assert not stage._thread.is_alive()
    with pytest.raises(td.TreadleError, match="lookahead stage's thread failed.*window gone"):
        list(stage.gate(range(4)))


@pytest.mark.s3
def test_a_wide_column_past_the_object_cache_is_read_from_chunks_not_held(roots, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    """With lookahead, an image column past the object cache goes through the chunk cache
    even where it would fit a reader's room for resident columns (256 MiB): the chunk
    cache's bound holds what the steps read. Before, the first table's column was read
    whole into memory (issue 48's bench held a 147 MB column of a table 8x the cache: half
    the bytes it counted); narrow columns are still read whole."""
    local, s3 = roots
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", f"{CHUNK}B")
    monkeypatch.setattr(fastpaths, "_OFF", {})
    _, want = _run(local, 6)
    loader, got = _run(s3, 6, lookahead=3)
    same_batches(got, want)
    fixed = loader.lookahead_stage.reader.fixed
    for t in ("a", "b"):
        table = loader.plan.tables[("a", "b").index(t)]
        assert fixed.path(table, "image") == "chunked" and fixed.path(table, "action") == "resident"
    assert reaper.drain(30) and lookahead_mod.LAST["rows_from_chunks"] == 1.0


@pytest.mark.s3
def test_a_reader_behind_a_lookahead_reads_two_batches_ahead(roots, small_caches, monkeypatch):
    """While the stage fetches the rows (local reads by then), the reader reads
    ``CONCURRENCY.lookahead_read_ahead`` batches ahead, not an object store's 8: each batch
    it held ahead was a step less of the window to hide a fetch behind. When the stage stops
    (its window does not fit) the reader's takes are remote again: 8 ahead, as without it.
    A loader's own ``read_ahead`` is left alone."""
    from treadle.concurrency import CONCURRENCY

    local, s3 = roots
    assert CONCURRENCY.lookahead_read_ahead == 2 < CONCURRENCY.cloud_read_ahead == 8
    _, want = _run(local, 6)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))  # the window fits
    for asked, ahead in ((None, 2), (5, 5)):
        loader, got = _run(s3, 6, lookahead=3, read_ahead=asked)
        same_batches(got, want)
        reader = loader.lookahead_stage.reader
        assert reader._hold == ahead and reader.read_ahead == (asked or 8)
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(small_caches.parent.parent / "cold"))
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(2 * CHUNK))  # it does not: it stops
    monkeypatch.setattr(lookahead_mod, "MIN_ASKED", 16)
    loader, got = _run(s3, 8, lookahead=3)
    same_batches(got, _run(local, 8)[1])
    assert "do not fit the chunk cache" in fastpaths.reasons()["chunk cache"]
    assert loader.lookahead_stage.reader._hold == 8
    assert reaper.drain(30)


@pytest.mark.s3
def test_steps_read_let_their_chunks_go_on_the_stages_thread(roots, small_caches, monkeypatch):
    """The loop that hands batches out only says a step was read: its chunks are released
    on the stage's thread, before the stage's next round (a release waits for the node's
    folder lock, which a round's reservation holds while it scans: the training loop waited
    for it, 1.6 ms a batch on issue 48's case). Once that thread has ended, the loop
    releases them itself; either way every step read is released once, in order, and the
    batches are those of local disk."""
    from treadle.storage import chunkstore

    local, s3 = roots
    real, calls = chunkstore.ChunkStore.release_many, []

    def release_many(self, released):
        calls.extend((at, threading.current_thread().name) for _, _, at, _ in released)
        return real(self, released)

    monkeypatch.setattr(chunkstore.ChunkStore, "release_many", release_many)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))
    loader, got = _run(s3, 12, lookahead=2)
    same_batches(got, _run(local, 12)[1])
    assert reaper.drain(30)
    steps = [at for at, _ in calls]
    assert steps == sorted(steps) and set(steps) == set(range(12))
    on_stage = {at for at, name in calls if name == "treadle-lookahead"}
    loop = {name for _, name in calls} - {"treadle-lookahead"}  # the thread handing batches out
    assert on_stage and len(loop) <= 1
    assert not any(at <= max(on_stage) for at, name in calls if name in loop)  # only after


@pytest.mark.s3
def test_the_first_steps_wait_is_not_counted_as_waiting(roots, small_caches, monkeypatch):
    """The first round also reads the data files' footers and makes the run's copies: a
    short run showed ``reader_waited`` near 1 (advice: raise ``lookahead``) for what no
    window shortens. Its first fetch held 3 s: the waits counted are the later ones only."""
    from treadle.storage import chunkstore

    _, s3 = roots
    real, calls = chunkstore.ChunkStore.download, []

    def first_slow(self, store, reserved):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(3)
        return real(self, store, reserved)

    monkeypatch.setattr(chunkstore.ChunkStore, "download", first_slow)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(16 * CHUNK))
    loader, _ = _run(s3, 12, lookahead=1, read_ahead=1)  # later steps wait for their rounds
    stage = loader.lookahead_stage
    assert len(calls) > 1 and stage._began > 0
    assert 0 < stage._waited < 2.0  # the later steps' waits: fetches of a few chunks each
    assert 0 <= stage.report()["reader_waited"] < 1


@pytest.mark.s3
def test_the_report_says_how_long_the_reader_waited_for_fetches(roots, small_caches,
                                                                monkeypatch):  # fmt: skip
    """``reader_waited``: the share of the reader's time spent at the gate, waiting for the
    fetches of a step (a window too short for the fetches' latency shows as a share near 1).
    Every fetch held 50 ms, a window of one step (``read_ahead=1``): steps wait for their
    rounds."""
    from treadle.storage import chunkstore

    local, s3 = roots
    real = chunkstore.ChunkStore.download

    def slow(self, store, reserved):
        time.sleep(0.05)
        return real(self, store, reserved)

    monkeypatch.setattr(chunkstore.ChunkStore, "download", slow)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(16 * CHUNK))
    loader, got = _run(s3, 12, lookahead=1, read_ahead=1)
    same_batches(got, _run(local, 12)[1])
    assert reaper.drain(30)
    assert 0 < lookahead_mod.LAST["reader_waited"] <= 1
    assert lookahead_mod.LAST == loader.lookahead_stage.report() | {
        "reader_waited": lookahead_mod.LAST["reader_waited"]
    }  # the rest as counted


@pytest.mark.s3
def test_a_steps_chunks_of_every_table_are_reserved_under_one_lock(roots, small_caches,
                                                                  monkeypatch):  # fmt: skip
    """A step's chunks of both tables are reserved in one call (one lock of the node's
    folder, a few system calls each of which lets other threads take the GIL): it was one a
    table, 26 a step for an OXE-sized mix. Batches are those of local disk."""
    from treadle.storage import chunkstore

    local, s3 = roots
    real, calls = chunkstore.ChunkStore.reserve, []

    def reserve(self, wanted, now, at=None, defer=False):
        calls.append((at, len(wanted)))
        return real(self, wanted, now, at, defer)

    monkeypatch.setattr(chunkstore.ChunkStore, "reserve", reserve)
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 * CHUNK))
    loader, got = _run(s3, 12, lookahead=2)
    same_batches(got, _run(local, 12)[1])
    steps = [at for at, _ in calls if at is not None]
    assert sorted(steps) == list(range(12))  # one reservation a step
    assert max(n for at, n in calls if at is not None) == 2  # both tables' chunks at once

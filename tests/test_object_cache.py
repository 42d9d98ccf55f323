"""The local object cache (treadle.storage.filecache): fixed-width columns of a table on an
object store are read from a bounded local copy of its data files, not a GET per row.

Requests are counted by ``bench/delay_proxy.py`` in front of a real SeaweedFS (no delay),
never timed; batches are compared value by value with the same loader on local disk.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from loader_helpers import same_batches
from treadle import fastpaths
from treadle.read.fixed import FixedReader
from treadle.storage import Store
from treadle.storage.filecache import FileCache, file_cache, parse_bytes

BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)

from delay_proxy import DelayProxy  # noqa: E402

pytestmark = pytest.mark.s3

ROWS, BATCH = 300, 16


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
    url = s3_server.url(f"cache-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return local, url, s3_server


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh cache folder; readers keep the actions in memory but not the images (64 kB
    of budget: as the bench's tables of 246 MB each are over the 256 MiB one), so without a
    copy an image row is a request."""
    from treadle.read import sample_reader

    d = tmp_path / "cache"
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(d))
    monkeypatch.delenv("TREADLE_CACHE_BYTES", raising=False)
    monkeypatch.setattr(fastpaths, "_OFF", {})  # this test's reasons only
    monkeypatch.setattr(sample_reader, "FixedReader", partial(FixedReader, resident_bytes=64 << 10))
    return d


def _requests(proxy: DelayProxy, client: td.Client, want: list[dict]) -> list[int]:
    """Requests of a loader of 4 batches and of one of 40 (batches checked)."""
    counts = []
    for steps in (4, 40):
        c0 = proxy.counts()
        got = _batches(client, steps)
        counts.append((proxy.counts() - c0).requests)
        same_batches(got, want[:steps])
    return counts


def _recipe(client: td.Client) -> td.Recipe:
    branch = client.project("p").branch()
    comps = [td.Component(branch.table(t), None, weight=w) for t, w in (("a", 0.3), ("b", 0.7))]
    return td.Recipe(seed=3, batch_size=BATCH, components=comps)


def _batches(client: td.Client, steps: int, workers: int = 0) -> list[dict]:
    return [dict(b) for b in td.TrainLoader(_recipe(client), steps=steps, workers=workers)]


def _data_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if "." not in p.name)


def test_requests_do_not_grow_with_batches(roots, cache_dir):
    """With the cache, a run of 40 batches sends as many requests as one of 4 (metadata and
    start-up only); before it, every image row was a GET (40 x 16 more). Batches equal
    local disk's; the two data files are fetched once, then reused."""
    local, url, server = roots
    want = _batches(local, 40)
    with DelayProxy(server.endpoint, 0.0) as proxy:
        client = td.Client(url, storage_options=proxy.options(server.storage_options()))
        same_batches(_batches(client, 4), want[:4])  # fills the cache
        cache = file_cache()
        assert isinstance(cache, FileCache) and cache.fetched == 2
        counts = _requests(proxy, client, want)
    assert cache.fetched == 2
    assert counts[1] == counts[0], counts
    assert len(_data_files(cache_dir)) == 2
    direct = td.Client(url, storage_options=server.storage_options())
    table = direct.project("p").branch().table("b").pin()
    assert FixedReader().path(table, "image") == "mapped"
    assert "cached reads" not in fastpaths.reasons()


def test_workers_share_one_copy(roots, cache_dir):
    """Two worker processes read the same files: each is fetched once (the other waits on
    its lock), no partial download is left, and the batches are local disk's."""
    local, url, server = roots
    client = td.Client(url, storage_options=server.storage_options())
    same_batches(_batches(client, 6, workers=2), _batches(local, 6))
    assert len(_data_files(cache_dir)) == 2
    assert not [p for p in os.listdir(cache_dir) if p.endswith(".part")]


def test_a_workers_loader_copies_before_its_first_batch(roots, cache_dir):
    """A ``workers=2`` loader's first batch (read in this process while the workers start)
    maps the wide columns from the object cache, as a ``workers=0`` loader's does: the
    copies exist when it is handed out, and the workers map them rather than waiting for
    them in the first batches they serve (bench case ``cloud`` had the mix at workers=2 on
    S3 at 0.44-0.55x of local disk, every timed batch behind the copy)."""
    local, url, server = roots
    client = td.Client(url, storage_options=server.storage_options())
    it = iter(td.TrainLoader(_recipe(client), steps=6, workers=2))
    first = dict(next(it))
    # both copies are whole when the first batch is handed out; this process made them, or
    # one of them while a worker, started meanwhile, waited on its lock or made the other
    # (under load a worker can get there first: this process then maps that worker's copy)
    cache = file_cache()
    assert isinstance(cache, FileCache) and cache.fetched >= 1
    made = {n: (cache_dir / n).stat().st_ino for n in _data_files(cache_dir)}
    assert len(made) == 2 and not [p for p in os.listdir(cache_dir) if p.endswith(".part")]
    same_batches([first, *(dict(b) for b in it)], _batches(local, 6))
    # the workers found those copies: none was made again
    assert {n: (cache_dir / n).stat().st_ino for n in _data_files(cache_dir)} == made


def test_one_step_views_copy_nothing(roots, cache_dir):
    """``treadle show`` / the viewer read one batch: no file is copied for it (on S3 that
    would be whole data files for a few rows); the batch is the loader's."""
    from treadle.ui.step import read_step

    local, url, server = roots
    client = td.Client(url, storage_options=server.storage_options())
    got = read_step(_recipe(client).plan(), 3)
    want = read_step(_recipe(local).plan(), 3)
    assert got.arrays.keys() == want.arrays.keys()
    for k in got.arrays:
        np.testing.assert_array_equal(got.arrays[k], want.arrays[k], err_msg=k)
    assert not cache_dir.exists() and "cached reads" not in fastpaths.reasons()


def test_a_file_over_the_bound_is_read_as_before_and_says_why(roots, cache_dir, monkeypatch):
    local, url, server = roots
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "64K")  # a data file is ~230 kB
    client = td.Client(url, storage_options=server.storage_options())
    same_batches(_batches(client, 5), _batches(local, 5))
    why = fastpaths.reasons()["cached reads"]
    assert "larger than the object cache's bound" in why and "65,536" in why, why
    assert not cache_dir.exists() or not _data_files(cache_dir)
    table = client.project("p").branch().table("a").pin()
    assert FixedReader(resident_bytes=0).path(table, "image") == "take"


def test_off_is_reported(roots, cache_dir, monkeypatch):
    """With the cache off, the batches are the same, requests grow with the batches (what
    the cache removes), and the fast path says why."""
    local, url, server = roots
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "0")
    assert "TREADLE_CACHE_BYTES=0" in file_cache()
    with DelayProxy(server.endpoint, 0.0) as proxy:
        client = td.Client(url, storage_options=proxy.options(server.storage_options()))
        counts = _requests(proxy, client, _batches(local, 40))
    assert counts[1] - counts[0] >= 36, counts  # a take per table and batch at least
    assert "off" in fastpaths.reasons()["cached reads"]
    path = td.info().paths["cached reads"]
    assert not path.on and "TREADLE_CACHE_BYTES=0" in path.reason


def test_bound_eviction_and_wrong_sizes(s3_server, tmp_path):
    """Least recently used copies go to make room; the files never sum to more than the
    bound; a copy of the wrong size, or a download a dead process left, is not used."""
    store = Store.open(s3_server.url(f"fc-{id(tmp_path)}"), s3_server.storage_options())
    data = {k: bytes([i]) * 1000 + os.urandom(24) for i, k in enumerate("abc")}
    for k, v in data.items():
        store.put(f"o/{k}", v)
    cache = FileCache(tmp_path / "c", 2500)
    got = {k: cache.path(store, f"o/{k}", 1024) for k in "ab"}
    assert all(Path(p).read_bytes() == data[k] for k, p in got.items())
    os.utime(got["a"], (1, 1))  # a: least recently used
    assert cache.path(store, "o/b", 1024) == got["b"] and cache.fetched == 2  # held: no GET
    c = cache.path(store, "o/c", 1024)
    assert Path(c).read_bytes() == data["c"] and not Path(got["a"]).exists()
    assert cache.used() <= 2500
    Path(got["b"]).write_bytes(b"short")  # not the object's size: fetched again
    assert Path(cache.path(store, "o/b", 1024)).read_bytes() == data["b"]
    assert cache.fetched == 4
    stale = tmp_path / "c" / "0123.part"  # a dead writer's download (no lock held)
    stale.write_bytes(b"x" * 1500)
    again = cache.path(store, "o/a", 1024)
    assert Path(again).read_bytes() == data["a"] and not stale.exists()
    assert cache.used() <= 2500
    assert "larger than" in cache.path(store, "o/a", 4000)


def test_a_held_copy_is_never_evicted(s3_server, tmp_path):
    """A copy a reader holds (maps) stays, even when least recently used: the next one
    evicts another, or is refused with the reason, so the disk never holds more."""
    store = Store.open(s3_server.url(f"fh-{id(tmp_path)}"), s3_server.storage_options())
    for k in "abc":
        store.put(f"o/{k}", k.encode() * 1024)
    cache = FileCache(tmp_path / "c", 2048)
    held = cache.open(store, "o/a", 1024)
    os.utime(held.path, (1, 1))  # least recently used, but held
    cache.path(store, "o/b", 1024)
    c = cache.path(store, "o/c", 1024)  # evicts b, not a
    assert held.path.exists() and Path(c).exists() and cache.used() <= 2048
    other = cache.open(store, "o/b", 1024)  # a and c held/just used: c goes (not held)
    assert not Path(c).exists()
    refused = cache.open(store, "o/c", 1024)  # a and b both held: no room
    assert isinstance(refused, str) and "in use by readers" in refused
    held.close()
    assert Path(cache.path(store, "o/c", 1024)).read_bytes() == b"c" * 1024  # a went
    assert not held.path.exists()
    other.close()


def test_a_copy_never_fills_the_disk(s3_server, tmp_path, monkeypatch):
    """Whatever the bound, a copy that would leave less than the free-space margin of the
    cache's disk is refused, and says so."""
    from treadle.storage import filecache

    store = Store.open(s3_server.url(f"fd-{id(tmp_path)}"), s3_server.storage_options())
    store.put("o/a", b"a" * 1024)
    cache = FileCache(tmp_path / "c", 1 << 40)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    monkeypatch.setattr(filecache, "MIN_FREE_BYTES", free + (1 << 30))
    why = cache.open(store, "o/a", 1024)
    assert isinstance(why, str) and "bytes free" in why, why
    monkeypatch.setattr(filecache, "MIN_FREE_BYTES", 0)
    monkeypatch.setattr(filecache, "MIN_FREE_SHARE", 0.0)
    assert Path(cache.path(store, "o/a", 1024)).read_bytes() == b"a" * 1024


def test_the_margin_kept_free_is_a_setting(s3_server, tmp_path, monkeypatch):
    """``TREADLE_CACHE_MIN_FREE`` replaces the default margin (the larger of 1 GiB and 5% of
    the disk): a large disk nearly full still takes copies with a small margin (CI's disk,
    at 13.5 GB free of 252 GB, refused every copy of the suite), and a margin larger than the
    free space refuses them, naming the setting."""
    from treadle.storage import filecache

    store = Store.open(s3_server.url(f"mf-{id(tmp_path)}"), s3_server.storage_options())
    store.put("o/a", b"a" * 1024)
    store.put("o/b", b"b" * 1024)
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(filecache, "MIN_FREE_SHARE", 1.0)  # the default: keep the whole disk
    monkeypatch.delenv("TREADLE_CACHE_MIN_FREE", raising=False)
    assert isinstance(file_cache().open(store, "o/a", 1024), str)
    monkeypatch.setenv("TREADLE_CACHE_MIN_FREE", "1M")
    cache = file_cache()
    assert isinstance(cache, FileCache) and cache.min_free == 1 << 20
    assert Path(cache.path(store, "o/a", 1024)).read_bytes() == b"a" * 1024
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    monkeypatch.setenv("TREADLE_CACHE_MIN_FREE", str(free + (1 << 30)))
    why = file_cache().open(store, "o/b", 1024)
    assert isinstance(why, str) and "TREADLE_CACHE_MIN_FREE" in why, why
    monkeypatch.setenv("TREADLE_CACHE_MIN_FREE", "lots")
    with pytest.raises(ValueError, match="TREADLE_CACHE_MIN_FREE"):
        file_cache()


def test_parse_bytes():
    assert parse_bytes("1024") == 1024
    assert parse_bytes("512M") == 512 << 20
    assert parse_bytes("16GiB") == parse_bytes("16g") == 16 << 30
    assert parse_bytes("0") == 0
    with pytest.raises(ValueError, match="TREADLE_CACHE_BYTES"):
        parse_bytes("lots")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400"])
def test_parse_bytes_refuses_non_finite_sizes_naming_the_setting(text):
    # float() takes these: they were a bare "cannot convert float NaN" / OverflowError
    with pytest.raises(ValueError, match=f"TREADLE_CACHE_MIN_FREE={text!r}"):
        parse_bytes(text, "TREADLE_CACHE_MIN_FREE")

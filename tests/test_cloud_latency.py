"""Reading from an object store at cloud latency (issue 33, goal 4).

``bench/delay_proxy.py`` holds every request to the S3 server 30 ms, as a cloud region
does. Behind it a loader reads several batches ahead (``SampleReader.read_ahead``): the
batches are the same as without the proxy and as on local disk, and the requests of
different batches are in flight at once (counted by the proxy, not timed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from treadle.concurrency import CONCURRENCY
from treadle.read.columns import output_columns
from treadle.read.sample_reader import SampleReader
from treadle.read.steps import host_reader
from treadle.video._testing import synthetic_frames

CLOUD_READ_AHEAD = CONCURRENCY.cloud_read_ahead
BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)

from delay_proxy import DelayProxy  # noqa: E402

pytestmark = pytest.mark.s3


def _write(client: td.Client) -> None:
    branch = client.project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(2):
            n = 40
            cam = td.VideoFrames(synthetic_frames(n, 32, 32, seed=e), fps=10)
            action = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 1000 * e
            tx.table("v").append_episode({"cam": cam, "action": action}, episode=f"ep-{e}")


def _recipe(client: td.Client, batch: int = 2) -> td.Recipe:
    branch = client.project("p").branch()
    windows = td.Windows({"cam": td.Video(range(3)), "action": td.Rows(range(2))})
    return td.Recipe(
        seed=9, batch_size=batch, components=[td.Component(branch.table("v"), windows)]
    )


@pytest.fixture(scope="module")
def roots(s3_server, tmp_path_factory):
    """One project on local disk and its byte-for-byte copy on S3 (written once for the
    module; two encodes of the same frames need not give the same bytes)."""
    from treadle.storage import Store

    path = tmp_path_factory.mktemp("local")
    local = td.Client(str(path), create=True)
    _write(local)
    url = s3_server.url(f"latency-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return local, (url, s3_server.storage_options()), s3_server


def _batches(client: td.Client, steps: int) -> list[dict]:
    return [dict(b) for b in td.TrainLoader(_recipe(client), steps=steps, prefetch=2)]


def test_delay_proxy_forwards_counts_and_stops(s3_server):
    """Bytes pass unchanged both ways (signatures verify), each request is counted, and the
    proxy's thread ends when its block does."""
    from treadle.storage import Store
    from treadle.storage.store import RangeRequest

    with DelayProxy(s3_server.endpoint, 0.01) as proxy:
        store = Store.open(
            s3_server.url(f"proxy-{id(proxy)}"), proxy.options(s3_server.storage_options())
        )
        data = bytes(range(256)) * 1000
        c0 = proxy.counts()
        store.put("a/b.bin", data)
        assert store.get("a/b.bin") == data
        got = proxy.counts() - c0
        assert got.requests == 2
        assert got.bytes_in > len(data) and got.bytes_out > len(data)
        assert got.body_out == len(data)  # the GET's payload; the PUT's answer has none
        proxy.log = []
        (part,) = store.get_ranges([RangeRequest("a/b.bin", 100, 5000)])
        assert part == data[100:5000]
        (seen,) = proxy.log
        assert (seen.method, seen.range, seen.status, seen.body) == ("GET", (100, 4999), 206, 4900)
        assert seen.path.endswith("/a/b.bin")
        thread = proxy._thread
    assert thread is not None and not thread.is_alive()


def test_batches_behind_latency_are_those_without_it(roots):
    """Through the proxy (many batches read ahead) the batches equal those read from S3
    directly and from local disk, key by key and value by value."""
    local, (url, options), server = roots
    steps = 12
    want = _batches(local, steps)
    direct = _batches(td.Client(url, storage_options=options), steps)
    with DelayProxy(server.endpoint, 0.03) as proxy:
        slow = _batches(td.Client(url, storage_options=proxy.options(options)), steps)
    for got in (direct, slow):
        assert len(got) == steps
        for a, b in zip(got, want):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_reader_overlaps_requests_of_batches_ahead(roots):
    """On an object store the reader reads ``CLOUD_READ_AHEAD`` batches ahead: window reads
    of several batches wait on the latency together (the proxy's most media requests sent
    and not yet answered at once). One batch ahead (``read_ahead=1``), with one window per
    batch, had at most two (the next batch's, and the one after it once that batch's takes
    are handed out): the same count is the check that it measures the overlap."""
    _, (url, options), server = roots
    peaks = {}
    with DelayProxy(server.endpoint, 0.03) as proxy:
        proxy.watch = "/media/"
        plan = _recipe(td.Client(url, storage_options=proxy.options(options)), batch=1).plan()
        for ahead in (None, 1):
            reader = host_reader(plan)
            if ahead is not None:
                reader = SampleReader(reader.tables, reader.columns, read_ahead=ahead)
            proxy.reset_peak()
            c0 = proxy.counts()
            try:
                got = list(reader.read_many(plan.batch(s) for s in range(12)))
            finally:
                reader.close()
            peaks[reader.read_ahead] = proxy.max_watched
            assert len(got) == 12
            assert (proxy.counts() - c0).requests >= 12  # a range read per batch at least
    assert peaks[1] <= 2, peaks
    assert peaks[CLOUD_READ_AHEAD] > 2, peaks


def test_read_ahead_is_checked_and_one_on_local_disk(roots):
    local, _, _ = roots
    plan = _recipe(local).plan()
    reader = host_reader(plan)
    assert reader.read_ahead == 1
    reader.close()
    with pytest.raises(ValueError, match="read_ahead"):
        SampleReader([plan.table(0)], output_columns(plan), read_ahead=0)

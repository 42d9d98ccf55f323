"""Object-store faults and stored-byte integrity, seen through the TrainLoader.

A seeded fault proxy (tests/fault_proxy.py) sits between treadle and SeaweedFS:

- transient faults (connection drops, delays, 503 SlowDown, truncated bodies) at 10%
  of requests: the run completes with exactly the batches of a clean run;
- permanent faults (403, a missing object, a flipped byte): fail fast with an error
  naming table, episode, column and object (or frame).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from fault_proxy import KINDS, FaultProxy
from loader_helpers import batch_hash, make_project, recipe

STEPS = 40
FAULT_RATE = 0.10


def _hashes(root: str, opts: dict | None, steps: int = STEPS) -> list[str]:
    branch = td.Client(root, storage_options=opts).project("robotics", create=False).branch()
    loader = td.TrainLoader(recipe(branch), steps=steps)
    return [batch_hash(b) for b in loader]


@pytest.fixture(scope="module")
def video_s3(s3_server):
    root = s3_server.url(f"faults-{time.time_ns()}")
    opts = s3_server.storage_options()
    make_project(root, storage_options=opts)
    return root, opts, _hashes(root, opts)


def test_transient_faults_give_the_batches_of_a_clean_run(video_s3, s3_server):
    root, opts, clean = video_s3
    t0 = time.monotonic()
    with FaultProxy(s3_server.endpoint, rate=FAULT_RATE, seed=9, delay_s=0.2) as proxy:
        faulty = _hashes(root, proxy.options(opts))
    took = time.monotonic() - t0
    print(f"faults: {dict(proxy.counts)} in {proxy.requests} requests, {took:.1f}s")
    assert faulty == clean
    injected = sum(proxy.counts.values())
    assert injected >= 0.05 * proxy.requests, (proxy.counts, proxy.requests)
    assert set(proxy.counts) == set(KINDS), proxy.counts  # every kind was met at least once
    assert took < 60


def test_every_request_faulted_once_still_reads(video_s3, s3_server):
    """A harsher rate (40%) on media range reads only: still exact."""
    root, opts, clean = video_s3
    with FaultProxy(s3_server.endpoint, rate=0.4, seed=3, paths="/media/", delay_s=0.05) as px:
        assert _hashes(root, px.options(opts), steps=4) == clean[:4]
    assert sum(px.counts.values()) >= 1


def test_permission_denied_fails_fast_naming_the_window(video_s3, s3_server):
    root, opts, _ = video_s3
    with FaultProxy(s3_server.endpoint, rate=1.0, kinds=("403",), paths="/media/") as proxy:
        t0 = time.monotonic()
        with pytest.raises(td.CredentialsError) as ei:
            _hashes(root, proxy.options(opts), steps=1)
        took = time.monotonic() - t0
    msg = str(ei.value)
    assert "table '" in msg and "episode '" in msg and "column 'cam'" in msg, msg
    assert "/media/" in msg and ".h264" in msg, msg  # the object
    assert "access denied" in msg
    assert took < 10, f"a 403 must not be retried ({took:.1f}s)"
    assert proxy.counts["403"] <= 6  # one GET per stream of the batch (6 streams), no retries


def test_missing_media_object_fails_fast_naming_it(s3_server):
    root = s3_server.url(f"faults-missing-{time.time_ns()}")
    opts = s3_server.storage_options()
    make_project(root, episodes=1, frames=8, storage_options=opts)
    store = td.Client(root, storage_options=opts).store
    media = store.list("projects/robotics/media")
    assert media
    for key in media:
        store.delete(key)
    t0 = time.monotonic()
    with pytest.raises(td.NotFound) as ei:
        _hashes(root, opts, steps=1)
    msg = str(ei.value)
    assert time.monotonic() - t0 < 10
    assert "episode '" in msg and "column 'cam'" in msg and "no object" in msg, msg
    assert any(k in msg for k in media), msg


# -- integrity -------------------------------------------------------------------------
def test_flipped_byte_in_a_stream_is_caught_on_read(tmp_path):
    root = str(tmp_path / "store")
    make_project(root)
    clean = _hashes(root, None, steps=4)
    media = sorted(Path(root, "projects/robotics/media").rglob("*.h264"))
    assert media
    victim = media[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    with pytest.raises(td.CorruptData) as ei:
        _hashes(root, None, steps=STEPS * 2)  # long enough to touch every episode
    msg = str(ei.value)
    table = victim.parent.name
    assert f"table {table!r}" in msg and "episode '" in msg and "column 'cam'" in msg, msg
    assert " frame " in msg and "checksum" in msg, msg
    assert clean  # the clean run before the flip read fine


def test_truncated_stream_is_caught_on_read(tmp_path):
    root = str(tmp_path / "store")
    make_project(root, episodes=1)
    for f in Path(root, "projects/robotics/media").rglob("*.h264"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    with pytest.raises(td.CorruptData, match=r"episode '.*column 'cam'.* frame \d+"):
        _hashes(root, None, steps=4)


def test_corrupt_commit_object_is_detected(tmp_path):
    root = str(tmp_path / "store")
    main = td.Client(root, create=True).project("p").branch()
    main.table("t").append({"x": np.arange(3)})
    cid = main.commit_id
    path = Path(root, f"projects/p/commits/{cid}.json")
    body = json.loads(path.read_bytes())
    body["message"] = "tampered"
    path.write_text(json.dumps(body))
    fresh = td.Client(root).project("p").branch()  # no cached commit
    with pytest.raises(td.CorruptData, match=cid):
        fresh.head()


# -- writes through faults ----------------------------------------------------------------
def test_writes_through_faults_commit_exactly_once(s3_server):
    """Every kind of transient fault on writes, plus ``lost`` responses (the write landed,
    the client never heard): each append is one commit, no duplicate, no loss."""
    root = s3_server.url(f"faults-writes-{time.time_ns()}")
    opts = s3_server.storage_options()
    td.Client(root, storage_options=opts).project("p")
    kinds = ("drop", "delay", "503", "truncate", "lost")
    with FaultProxy(s3_server.endpoint, rate=FAULT_RATE, seed=5, kinds=kinds, delay_s=0.05) as px:
        main = td.Client(root, storage_options=px.options(opts)).project("p").branch()
        for i in range(12):
            main.table("t").append({"x": np.full(4, i)}, message=f"c{i}")
    print(f"write faults: {dict(px.counts)} in {px.requests} requests")
    assert sum(px.counts.values()) >= 5
    clean = td.Client(root, storage_options=opts).project("p").branch()
    assert [c.message for c in clean.log()][:12] == [f"c{i}" for i in reversed(range(12))]
    assert len(clean.log()) == 13
    x = clean.table("t").to_arrow().column("x").to_pylist()
    assert x == [i for i in range(12) for _ in range(4)]


def test_lost_response_to_a_ref_write_is_not_a_lost_race(s3_server):
    """Half of the branch moves land but their responses are lost: obstore retries the
    put-if-absent, gets 412, and treadle must recognise its own write (no duplicate)."""
    root = s3_server.url(f"faults-refs-{time.time_ns()}")
    opts = s3_server.storage_options()
    td.Client(root, storage_options=opts).project("p")
    with FaultProxy(
        s3_server.endpoint, rate=0.5, seed=1, kinds=("lost",), methods=("PUT",), paths="/refs/"
    ) as px:
        main = td.Client(root, storage_options=px.options(opts)).project("p").branch()
        for i in range(6):
            main.table("t").append({"x": [i]}, message=f"c{i}")
    assert px.counts["lost"] >= 2
    clean = td.Client(root, storage_options=opts).project("p").branch()
    assert [c.message for c in clean.log()] == [f"c{i}" for i in reversed(range(6))] + [
        "create project p"
    ]
    assert clean.table("t").to_arrow().column("x").to_pylist() == list(range(6))


def test_lance_errors_map_to_treadle_errors(video_s3, s3_server):
    """Lance read failures reach users as treadle errors naming the table (real 403s)."""
    from treadle.table.lanceerror import lance_error

    root, opts, _ = video_s3
    with FaultProxy(s3_server.endpoint, rate=1.0, kinds=("403",), paths="/data/") as proxy:
        branch = td.Client(root, storage_options=proxy.options(opts)).project("robotics").branch()
        with pytest.raises(td.CredentialsError, match="failed") as ei:
            branch.table("failed").take([0], ["action"])
    assert "access denied" in str(ei.value) and opts["aws_secret_access_key"] not in str(ei.value)
    assert isinstance(lance_error(ValueError("Dataset at x was not found"), "t"), td.NotFound)
    assert type(lance_error(OSError("boom"), "t")) is td.StorageError


def test_store_retries_what_obstore_does_not(s3_server):
    """obstore does not retry a LIST whose body is cut off mid-stream; Store does (bounded)."""
    from treadle.storage import Store

    opts = s3_server.storage_options()
    root = s3_server.url(f"faults-list-{time.time_ns()}")
    Store.open(root, opts).put("d/a", b"1")
    Store.open(root, opts).put("d/b", b"2")
    with FaultProxy(
        s3_server.endpoint, rate=0.5, seed=2, kinds=("truncate",), paths="list-type=2"
    ) as px:
        store = Store.open(root, px.options(opts))
        for _ in range(20):
            assert store.list("d") == ["d/a", "d/b"]
    assert px.counts["truncate"] >= 5

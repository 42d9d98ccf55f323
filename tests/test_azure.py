"""``az://`` roots against Azurite, the Azure Blob Storage emulator, on 127.0.0.1.

The catalog's compare-and-swap (``If-None-Match: *`` on Azure) under racing writers, a
``TrainLoader`` run with video equal to the same recipe on local disk, a WebDataset
import, gc, errors that name a wrong container, and credentials that never show. The
``any_root`` tests run on ``az://`` too: catalog, gc, crash phases, retention, eight
writer processes (test_concurrency) and a rebase onto another shape that raises
``CommitConflict`` (test_table_schema_race).
"""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, timedelta

import numpy as np
import pytest

import treadle as td
from importer_fixtures import make_wds
from loader_helpers import batch_hash, make_project, recipe
from treadle.catalog.gc import collect_garbage
from treadle.errors import CredentialsError, StorageError
from treadle.importers import webdataset as import_wds
from treadle.storage import Store, redact
from treadle.video._testing import synthetic_frames

pytestmark = pytest.mark.azure


def _race(n: int, fn) -> list:
    """Run ``fn(i)`` for i < n on n threads released together; their results in order."""
    gate = threading.Barrier(n)
    out: list = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        gate.wait()
        try:
            out[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def test_put_if_absent_has_exactly_one_winner(az_root):
    root, opts = az_root
    stores = [Store.open(root, opts) for _ in range(8)]
    for slot in range(5):
        key = f"slot/{slot}"
        won = _race(
            8, lambda i, key=key: stores[i].put(key, f"writer {i}".encode(), if_absent=True)
        )
        assert sum(won) == 1, won
        assert stores[0].get(key) == f"writer {won.index(True)}".encode()
    assert not stores[0].put("slot/0", b"late", if_absent=True)  # an existing key stays
    assert stores[0].get("slot/0") != b"late"


def test_racing_commits_one_winner_per_ref_and_nothing_lost(az_root):
    root, opts = az_root
    writers, commits = 4, 2
    td.Client(root, storage_options=opts).project("p").create()

    def write(w: int) -> None:
        main = td.Client(root, storage_options=opts).project("p").branch()
        for i in range(commits):
            main.table("shared").append({"w": [w], "i": [i]}, message=f"w{w} c{i}")

    _race(writers, write)
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    want = sorted(f"w{w} c{i}" for w in range(writers) for i in range(commits))
    assert sorted(c.message for c in log if c.message.startswith("w")) == want
    # one ref object per commit: every seq of the branch was won by exactly one writer
    refs = project.client.store.list("projects/p/refs/main")
    assert len(refs) == len(log) == 1 + writers * commits
    heads = [json.loads(project.client.store.get(k))["commit"] for k in refs]
    assert heads[::-1] == [c.id for c in log]
    rows = project.branch().table("shared").to_arrow()
    got = sorted(zip(rows.column("w").to_pylist(), rows.column("i").to_pylist()))
    assert got == sorted((w, i) for w in range(writers) for i in range(commits))


def test_train_loader_with_video_equals_the_local_run(az_root, local_root):
    root, opts = az_root
    streams: dict = {}  # the same encoded bytes in both projects
    on_az = make_project(root, episodes=2, frames=16, storage_options=opts, streams=streams)
    local = make_project(local_root, episodes=2, frames=16, streams=streams)
    got = [batch_hash(b) for b in td.TrainLoader(recipe(on_az).plan(), steps=3)]
    want = [batch_hash(b) for b in td.TrainLoader(recipe(local).plan(), steps=3)]
    assert got == want and len(set(got)) == 3
    batch = next(iter(td.TrainLoader(recipe(on_az).plan(), steps=1)))
    assert batch["cam"].shape == (8, 4, 32, 32, 3)
    assert Store.open(root, opts).list("projects/robotics/media")  # the video lives on Azure


def test_webdataset_import_into_azure(az_root, tmp_path):
    wds = pytest.importorskip("webdataset")
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=12)  # webdataset's own ShardWriter
    root, opts = az_root
    client = td.Client(root, storage_options=opts)
    res = import_wds(pattern, client.project("p"), "samples", progress=False)
    assert res.rows == 30 and res.commit is not None
    got = client.project("p").branch().table("samples").pin().to_arrow().to_pylist()
    ref = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
    assert [g["key"] for g in got] == [r["__key__"] for r in ref]
    for g, r in zip(got, ref):
        assert g["png"] == r["png"] and g["txt"] == r["txt"].decode()
        np.testing.assert_array_equal(
            np.asarray(g["npy"], np.float32), np.load(io.BytesIO(r["npy"]))
        )


def test_gc_deletes_only_the_unreachable_and_old(az_root):
    root, opts = az_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    frames = synthetic_frames(6, 32, 32, seed=1)
    main.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="kept")
    main.table("t").append({"x": np.arange(5)})
    store = project.client.store
    reachable = set(store.list(project.prefix))
    with pytest.raises(RuntimeError), main.transaction("crashes") as tx:
        tx.table("v").append_episode(
            {"cam": td.VideoFrames(synthetic_frames(6, 32, 32, seed=2), fps=10)}, episode="lost"
        )
        tx.table("t").append({"x": np.arange(5, 9)})
        raise RuntimeError("the writer dies before its commit")
    orphans = set(store.list(project.prefix)) - reachable  # its staged video
    assert orphans and all("/media/" in k for k in orphans)
    grace = timedelta(hours=1)
    young = collect_garbage(project, grace)  # everything is younger than the grace
    assert young.removed_media == [] and set(store.list(project.prefix)) >= orphans
    # Azure cannot back-date an object: gc's clock runs one grace past the newest orphan
    newest = max(store.modified(k) for k in orphans)
    report = collect_garbage(project, grace, now=newest.astimezone(UTC) + grace + timedelta(2))
    assert sorted(report.removed_media) == sorted(orphans)
    after = set(store.list(project.prefix))
    assert not orphans & after
    kept = {k for k in reachable if "/media/" in k or "/data/" in k or "/commits/" in k}
    assert kept <= after  # nothing reachable went
    again = td.Client(root, storage_options=opts).project("p").branch()
    assert again.table("t").to_arrow().column("x").to_pylist() == list(range(5))
    assert again.table("v").pin().episodes().names == ["kept"]


def test_missing_container_is_named_not_an_empty_root(az_server):
    root, opts = az_server.url("no-such-container"), az_server.storage_options()
    store = Store.open(root, opts)
    for call in (lambda: store.get("x"), lambda: store.list("projects"), store.entries):
        with pytest.raises(StorageError, match="'no-such-container' does not exist"):
            call()
    with pytest.raises(StorageError, match="does not exist"):
        td.Client(root, storage_options=opts).project("p").branch().head()


def test_emulator_flag_beside_an_endpoint_is_refused(az_server, monkeypatch):
    """object_store's emulator mode sends requests to 127.0.0.1:10000 whatever the
    endpoint: that pair must not open (it would talk to another server)."""
    opts = dict(az_server.storage_options(), azure_storage_use_emulator="true")
    with pytest.raises(StorageError, match="use_emulator ignores azure_storage_endpoint"):
        Store.open(az_server.url("any-container"), opts)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    with pytest.raises(StorageError, match="use_emulator ignores"):
        Store.open(az_server.url("any-container"), az_server.storage_options())


def test_redact_masks_azure_credentials():
    opts = {
        "azure_storage_account_name": "acct",
        "azure_storage_account_key": "S3CR3T-key",
        "account_key": "S3CR3T-short",
        "azure_storage_sas_key": "sv=2024&sig=S3CR3T",
        "azure_storage_token": "S3CR3T-bearer",
        "azure_client_secret": "S3CR3T-client",
        "azure_storage_endpoint": "http://127.0.0.1:10000/acct",
        "allow_http": "true",
    }
    out = redact(opts)
    assert "S3CR3T" not in repr(out)
    assert out["azure_storage_account_name"] == "acct"
    assert out["azure_storage_endpoint"] == opts["azure_storage_endpoint"]


def test_wrong_azure_key_is_refused_without_showing_it(az_root):
    root, opts = az_root
    wrong = dict(opts, azure_storage_account_key="QkFE" * 22)  # valid base64, wrong key
    client = td.Client(root, storage_options=wrong)
    with pytest.raises(CredentialsError) as info:
        client.project("p").branch().table("t").append({"x": [1]})
    texts = [str(info.value), repr(info.value), repr(client), repr(client.store)]
    assert not any(k in t for t in texts for k in (opts["azure_storage_account_key"], "QkFE"))


def test_a_refused_request_is_not_retried_as_transient(az_server):
    """A 404 LIST (a missing container) is final; obstore's "retry_timeout: 120s" in the
    error's debug text once read as a timeout and had it retried six times."""
    import obstore
    from obstore.store import from_url

    from treadle.storage.retry import _transient

    opts = az_server.storage_options()
    client = {"allow_http": opts.pop("allow_http")}
    inner = from_url(az_server.url("no-such-container"), config=opts, client_options=client)
    with pytest.raises(Exception) as info:
        list(obstore.list(inner, "x/"))
    assert "404" in str(info.value) and "retry_timeout" in str(info.value)
    assert not _transient(info.value)

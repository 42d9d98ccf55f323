"""One root URL on two servers (``s3://treadle/x`` on two endpoints) is two stores. Run ids,
caches and the one-store checks named a store by its URL alone, so the second store was
served the first's cached objects, planned as the first, and took a checkpoint row that
pins nothing (tests fail before); :attr:`Store.place` adds the endpoint or account."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import treadle as td
from treadle.storage import Store
from treadle.storage.filecache import FileCache
from treadle.testing import SeaweedS3


@pytest.fixture(scope="module")
def other_s3():
    """A second S3 server whose bucket has the session server's name."""
    server = SeaweedS3(bucket="treadle").start()
    yield server
    server.stop()


def _twins(s3_server, other_s3, request):
    """One root URL, with each server's options."""
    url = s3_server.url(f"places-{os.getpid()}-{request.node.name[:40]}")
    return [(url, s.storage_options()) for s in (s3_server, other_s3)]


def test_the_object_cache_keeps_one_key_of_two_servers_apart(s3_server, other_s3, tmp_path,
                                                             request):  # fmt: skip
    cache = FileCache(tmp_path / "objects", 1 << 20)
    stores = [Store.open(url, opts) for url, opts in _twins(s3_server, other_s3, request)]
    assert stores[0].url == stores[1].url
    for i, store in enumerate(stores):
        store.put("data/f.lance", bytes([i]) * 64)  # one key, one size, other bytes
    got = [cache.path(s, "data/f.lance", 64).read_bytes() for s in stores]
    assert got == [b"\0" * 64, b"\1" * 64]  # before: the first server's copy, twice
    assert cache.fetched == 2


def test_a_recipe_over_one_url_on_two_servers_is_refused(s3_server, other_s3, request):
    refs = []
    for i, (url, opts) in enumerate(_twins(s3_server, other_s3, request)):
        t = td.Client(url, opts).project("p").branch().table("t")
        t.append_episode({"x": np.arange(5, dtype=np.float32) + 100 * i}, episode="e0")
        refs.append(t)
    w = td.Windows({"x": td.Rows([0])})
    recipe = td.Recipe(seed=0, batch_size=2, components=[td.Component(r, w) for r in refs])
    with pytest.raises(td.PlanError, match="project 'p' of 2 stores"):
        recipe.plan()  # before: planned, and both components read the first server's rows


def test_a_checkpoint_row_on_the_other_server_is_refused(s3_server, other_s3, request):
    (url, ours), (_, theirs) = _twins(s3_server, other_s3, request)
    t = td.Client(url, ours).project("p").branch().table("t")
    t.append({"x": np.arange(8, dtype=np.float32)})
    loader = td.TrainLoader(td.Recipe(seed=1, batch_size=4, components=[td.Component(t)]))
    next(iter(loader))
    elsewhere = td.Checkpoints(td.Client(url, theirs).project("p").branch())
    with pytest.raises(td.PlanError, match="pins nothing"):
        elsewhere.save(1, {"w": torch.zeros(1)}, loader)  # before: saved, pinning nothing
    assert td.Checkpoints(t.branch).save(1, {"w": torch.zeros(1)}, loader).step == 1


def test_a_place_names_the_endpoint_or_account_and_no_secret(monkeypatch):
    from treadle.storage.cloud import store_place

    for var in [v for v in os.environ if v.startswith(("AWS_", "AZURE_"))]:
        monkeypatch.delenv(var)
    url = "s3://b/x"
    assert (
        store_place(url, "s3", {"aws_access_key_id": "AKIA", "aws_secret_access_key": "S"}) == url
    )
    opts = {"aws_endpoint": "http://user:pw@Host:9000/", "aws_secret_access_key": "S3CR3T"}
    assert store_place(url, "s3", opts) == f"{url} (endpoint=http://***@host:9000)"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://other:9000")
    assert store_place(url, "s3", {}) == f"{url} (endpoint=http://other:9000)"
    assert store_place(url, "s3", {"endpoint": "http://host:9000"}).endswith(
        "(endpoint=http://host:9000)"
    )
    az = {"azure_storage_account_name": "acct", "azure_storage_account_key": "K3Y"}
    assert store_place("az://c/x", "az", az) == "az://c/x (account=acct)"
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10001")
    emulated = store_place("az://c/x", "az", {"azure_storage_use_emulator": "true"})
    assert emulated == "az://c/x (emulator=http://127.0.0.1:10001)"
    assert store_place("az://c/x", "az", {"use_emulator": "false"}) == "az://c/x"


def _state_after(t, steps: int):
    loader = td.TrainLoader(td.Recipe(seed=3, batch_size=4, components=[td.Component(t)]))
    it = iter(loader)
    for _ in range(steps):
        next(it)
    return loader.state_dict(), [next(it)["x"].tolist() for _ in range(3)]


def test_a_run_id_names_no_store_a_copys_resume_reads_by_commit(tmp_path):
    """Pinned: the run id hashes the record, which names the project and each table's
    commit, not the store. A copy of the store (another folder, bucket or server) holds the
    same commits, so the run resumes there with the batches it would have had; a store whose
    project has the same table and version number but another commit refuses the state."""
    import shutil

    a = td.Client(str(tmp_path / "a"), create=True).project("p").branch().table("t")
    a.append({"x": np.arange(40, dtype=np.float32)})
    state, rest = _state_after(a, 2)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copy = td.Client(str(tmp_path / "copy"))
    resumed = td.TrainLoader.from_state(state, copy)
    assert resumed.plan.tables[0].project.client.root == str(tmp_path / "copy")
    assert [b["x"].tolist() for _, b in zip(range(3), resumed, strict=False)] == rest
    other = td.Client(str(tmp_path / "b"), create=True).project("p").branch().table("t")
    other.append({"x": np.arange(40, dtype=np.float32) + 1000})  # table t version 1 too
    assert other.pin().version == a.pin().version
    with pytest.raises(td.NotFound, match="commit"):
        td.TrainLoader.from_state(state, other.branch.project.client)

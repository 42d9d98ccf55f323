"""Credentials never appear in logs, errors, reprs, run records, checkpoint rows or objects.

A SeaweedFS server of its own runs with a distinctive secret key; everything treadle
can be made to print or write on that root is searched for it: Python logging at
DEBUG, stdout/stderr (Rust logs of Lance/obstore included), str/repr of every object
and error, run records, loader states, checkpoint rows, and every byte under the bucket.
"""

from __future__ import annotations

import json
import logging
import uuid

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import WINDOWS
from treadle.storage import Store, redact
from treadle.testing import SeaweedS3

SECRET = f"sEcReT-{uuid.uuid4().hex}-do-not-print"


class _SecretS3(SeaweedS3):
    access_key = f"AKID{uuid.uuid4().hex[:12].upper()}"
    secret_key = SECRET


@pytest.fixture(scope="module")
def secret_server():
    server = _SecretS3(bucket="secrets").start()
    yield server
    server.stop()


def _texts_of(e: BaseException) -> list[str]:
    out = []
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out += [str(e), repr(e), *map(str, e.args)]
        e = e.__cause__ or e.__context__
    return out


def test_secret_never_leaks(secret_server, caplog, capfd, monkeypatch):
    monkeypatch.setenv("RUST_LOG", "debug")  # obstore/Lance logs, if any are emitted
    caplog.set_level(logging.DEBUG)  # every Python logger, DEBUG and up
    opts = secret_server.storage_options()
    assert opts["aws_secret_access_key"] == SECRET
    root = secret_server.url("proj")
    texts: list[str] = []

    client = td.Client(root, storage_options=opts)
    texts += [repr(client), str(client), repr(client.store), str(client.storage_options.keys())]
    main = client.project("robotics").branch()
    rng = np.random.default_rng(0)
    with main.transaction("data") as tx:
        for name in ("failed", "nominal"):
            for e in range(2):
                frames = rng.integers(0, 255, (12, 32, 32, 3), dtype=np.uint8)
                tx.table(name).append_episode(
                    {"cam": td.VideoFrames(frames, fps=30), "action": rng.random((12, 7))},
                    episode=f"{name}-{e}",
                )
    texts += [repr(main), repr(main.head()), repr(main.table("failed")), repr(main.project)]
    w = td.Windows(WINDOWS)
    recipe = td.Recipe(
        seed=1,
        batch_size=4,
        components=[
            td.Component(main.table("failed"), w, 0.5),
            td.Component(main.table("nominal"), w, 0.5),
        ],
    )
    loader = td.TrainLoader(recipe, steps=2)
    for _ in loader:
        pass
    state = loader.state_dict()
    texts += [json.dumps(state), loader.plan.record.to_json(), repr(loader.plan)]
    ckpt = td.Checkpoints(main)
    row = ckpt.save(2, {"w": torch.zeros(3)}, loader)
    texts += [repr(row), json.dumps(row.loader_state), json.dumps(row.record)]
    back = ckpt.latest()
    assert back is not None
    texts += [repr(back), back.state_bytes.decode("latin-1")]
    resumed = td.TrainLoader.from_state(state, client, steps=3)
    texts += [repr(resumed.plan)]
    main.project.gc()

    # errors: wrong secret, unknown objects, an unreachable endpoint, bad options
    errors: list[BaseException] = []
    bad = dict(opts, aws_secret_access_key=SECRET[::-1] + "x")
    for fn in (
        lambda: td.Client(root, storage_options=bad).project("robotics").branch().head(),
        lambda: client.project("robotics").branch("nope"),
        lambda: client.project("nope", create=False),
        lambda: client.store.get("no/such/object"),
        lambda: Store.open(
            root, dict(opts, aws_endpoint="http://127.0.0.1:9", timeout="2s", connect_timeout="1s")
        ).get("x"),  # fmt: skip
        lambda: Store.open(root, dict(opts, not_an_option=SECRET)),
        lambda: td.Client(root, storage_options={"aws_secret_access_key": SECRET}),
    ):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - every error is inspected
            errors.append(e)
    assert len(errors) == 7, errors
    assert isinstance(errors[0], td.CredentialsError), errors[0]
    for e in errors:
        print(f"{type(e).__name__}: {e}")
    for e in errors:
        texts += _texts_of(e)

    out, err = capfd.readouterr()
    texts += [out, err, caplog.text]
    texts += [r.getMessage() for r in caplog.records]
    leaked = [t[:200] for t in texts if SECRET in t or SECRET[::-1] in t]
    assert leaked == []
    assert any(SECRET in t for t in [*texts, json.dumps(opts)])  # the search itself works

    # every byte under the bucket
    store = Store.open(secret_server.url(), opts)
    keys = store.list("proj")
    assert len(keys) > 20
    for key in keys:
        data = store.get(key)
        assert SECRET.encode() not in data, key
        assert secret_server.access_key.encode() not in data, key


def test_proxy_password_stays_out_of_reprs(secret_server):
    """A ``proxy_url`` with a password (``http://user:pw@proxy``) is masked in every repr."""
    opts = dict(secret_server.storage_options(), proxy_url=f"http://user:{SECRET}@127.0.0.1:3128")
    client = td.Client(secret_server.url("proxied"), storage_options=opts)
    texts = [repr(client), str(client), repr(client.store), repr(redact(opts))]
    assert [t for t in texts if SECRET in t] == []
    assert "proxy_url" in repr(client) and "127.0.0.1:3128" in repr(client)  # the rest is shown
    assert client.storage_options["proxy_url"] == opts["proxy_url"]  # still usable


@pytest.mark.parametrize(
    ("root", "shown"),
    [
        (f"s3://AKIDEXAMPLE:{SECRET}@bucket/prefix", "s3://***@bucket/prefix"),
        (f"gs://user:{SECRET}@bucket/p", "gs://***@bucket/p"),
        (f"az://container/prefix?sv=2022-11-02&sig={SECRET}", "az://container/prefix?***"),
        (f"s3://bucket/prefix?X-Amz-Signature={SECRET}", "s3://bucket/prefix?***"),
        (f"https://acct.blob.core.windows.net/c?sig={SECRET}", "https://acct.blob.core.windows.net/c?***"),
        (f"http://user:{SECRET}@127.0.0.1:9/store", "http://***@127.0.0.1:9/store"),
    ],
    ids=["s3-userinfo", "gs-userinfo", "az-sas", "s3-presigned", "https-sas", "http-userinfo"],
)  # fmt: skip
def test_a_root_url_with_credentials_is_refused_without_showing_them(root, shown, tmp_path):
    # s3:// took the user:password@ part silently (and ignored it), then printed it in the
    # client's repr, every storage error and the run records; a SAS token likewise
    with pytest.raises(td.errors.StorageError) as e:
        td.Client(root, storage_options={"aws_access_key_id": "a", "aws_secret_access_key": "b"})
    assert [t for t in _texts_of(e.value) if SECRET in t] == []
    assert repr(shown) in str(e.value) and "storage_options" in str(e.value)
    with pytest.raises(td.errors.StorageError) as e:  # an importer's source URL, too
        td.importers.webdataset(f"{root}/shard.tar", td.Client(str(tmp_path)).project("p"), "t")
    assert [t for t in _texts_of(e.value) if SECRET in t] == []


def test_a_container_at_an_account_is_no_credential():
    from treadle.storage.cloud import check_root_url

    check_root_url("abfss://container@account.dfs.core.windows.net/prefix")  # no password

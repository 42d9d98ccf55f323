"""A store that accepts connections and never answers: every call ends in a
``StorageError`` naming the store, how long it waited and the settings that bound it
(``timeout`` per request, ``retry_timeout`` per call; shortened here through those
documented storage options). Before, a call took 120 s (a read that then asked the
object's size: 240 s) and said only "error sending request"."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

import treadle as td
from fault_proxy import FaultProxy
from treadle.errors import StorageError
from treadle.storage import RangeRequest, Store
from treadle.storage.cloud import RETRY_TIMEOUT_S, retry_timeout

SHORT = {"timeout": "1s", "retry_timeout": "2s"}


class _Mute:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def mute():
    server = _Mute()
    yield server
    server.close()


def _options(scheme: str, port: int) -> dict[str, str]:
    if scheme == "s3":
        return {"aws_endpoint": f"http://127.0.0.1:{port}", "aws_access_key_id": "k",
                "aws_secret_access_key": "s", "aws_region": "us-east-1",
                "allow_http": "true"}  # fmt: skip
    return {"azure_storage_account_name": "devstoreaccount1", "azure_storage_account_key":
            "a2V5", "azure_storage_endpoint": f"http://127.0.0.1:{port}/devstoreaccount1",
            "allow_http": "true"}  # fmt: skip


@pytest.mark.parametrize("scheme", ["s3", "az"])
@pytest.mark.parametrize("call", ["get", "get_ranges", "download", "list", "exists"])
def test_a_store_that_never_answers_is_a_named_error(mute, scheme, call, tmp_path):
    root = f"{scheme}://bucket/prefix"
    store = Store.open(root, dict(_options(scheme, mute.port), **SHORT))
    calls = {
        "get": lambda: store.get("obj"),
        "get_ranges": lambda: store.get_ranges([RangeRequest("obj", 0, 10)]),
        "download": lambda: _download(store, tmp_path / "copy"),
        "list": lambda: store.list("folder"),
        "exists": lambda: store.exists("obj"),
    }
    with pytest.raises(StorageError) as info:
        calls[call]()
    msg = str(info.value)
    assert f"{root}/" in msg and f"127.0.0.1:{mute.port}" in msg  # the store, its endpoint
    assert "did not answer in" in msg and " s (storage options 'timeout'" in msg
    assert "'timeout'" in msg and "'retry_timeout'" in msg  # what to set
    assert mute.held  # it did connect: the server took the request, and said nothing


def _download(store: Store, path) -> None:
    with open(path, "wb+") as f:
        store.download("obj", f.fileno(), 10, 5, 2)


@pytest.mark.timeout(300)
def test_a_lance_read_from_a_store_that_never_answers_is_a_named_error(s3_server):
    """The catalog answers, the table's files (Lance's reads) never do."""
    root = s3_server.url(f"mute-{id(object())}")
    opts = s3_server.storage_options()
    td.Client(root, storage_options=opts).project("p").branch().table("t").append(
        {"x": np.arange(100)}
    )
    with FaultProxy(s3_server.endpoint, kinds=("mute",), paths="/data/") as px:
        endpoint = px.endpoint
        client = td.Client(root, storage_options=dict(px.options(opts), **SHORT))
        table = client.project("p").branch().table("t").pin()
        px.rate = 1.0
        with pytest.raises(StorageError, match=r"reading Table\(p/t") as info:
            table.to_arrow()
    msg = str(info.value)
    assert "did not answer (Lance's last request waited" in msg and "'retry_timeout'" in msg
    assert f"endpoint={endpoint}" in msg
    assert px.counts["mute"] >= 1


def test_retry_timeout_is_read_from_the_option_then_the_environment(monkeypatch):
    assert retry_timeout({}, "s3") == RETRY_TIMEOUT_S == 60
    assert retry_timeout({"retry_timeout": "90s"}, "s3") == 90
    assert retry_timeout({"RETRY_TIMEOUT": "2m"}, "az") == 120
    monkeypatch.setenv("AZURE_RETRY_TIMEOUT", "15")
    assert retry_timeout({}, "az") == 15 and retry_timeout({}, "s3") == 60
    with pytest.raises(StorageError, match="retry_timeout.*give seconds"):
        retry_timeout({"retry_timeout": "soon"}, "s3")
    opts = {"aws_access_key_id": "k", "aws_secret_access_key": "s", "aws_region": "us-east-1"}
    lance = Store.open("s3://bkt/x", dict(opts, retry_timeout="7")).lance_options or {}
    assert lance["client_retry_timeout"] == "7" and "retry_timeout" not in lance
    lance = Store.open("s3://bkt/x", opts).lance_options or {}
    assert lance["client_retry_timeout"] == "30"  # one request's wait: Lance retries itself
    lance = Store.open("s3://bkt/x", dict(opts, timeout="10s")).lance_options or {}
    assert lance["client_retry_timeout"] == "10"

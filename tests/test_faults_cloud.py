"""An object store that misbehaves after a commit landed, and Azure credentials that stop
working mid-run: what the user is told.

- A write whose commit landed but whose gc lease could not be dropped afterwards (the
  DELETE refused or failing) returns its commit: raising would tell the user it failed,
  and retrying it would append the rows twice. The lease left behind expires by itself.
- An Azure SAS token that expired mid-run (403) is a ``CredentialsError`` naming the
  setting it came from and its expiry, never its signature.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import time
import traceback
import uuid
from urllib.parse import quote

import numpy as np
import pytest

import treadle as td
from fault_proxy import FaultProxy


def _s3_root(s3_server, name: str) -> tuple[str, dict[str, str]]:
    root = s3_server.url(f"{name}-{uuid.uuid4().hex[:8]}")
    return root, s3_server.storage_options()


@pytest.mark.parametrize("kind", ["403"])
def test_a_landed_commit_is_returned_though_its_lease_stays(s3_server, kind, caplog):
    root, opts = _s3_root(s3_server, "lease")
    td.Client(root, storage_options=opts).project("p").branch().table("t").append(
        {"x": np.arange(3)}
    )
    with FaultProxy(s3_server.endpoint, kinds=(kind,), methods=("DELETE", "POST"), rate=1.0) as px:
        branch = td.Client(root, storage_options=px.options(opts)).project("p").branch()
        with caplog.at_level(logging.WARNING, logger="treadle"):
            branch.table("t").append({"x": np.arange(3)})  # landed: no error
    assert px.counts[kind] >= 1
    after = td.Client(root, storage_options=opts).project("p").branch()
    assert after.table("t").to_arrow().num_rows == 6  # exactly once
    assert any("gc lease" in r.getMessage() for r in caplog.records), caplog.text


def _account_sas(az, expiry: dt.datetime) -> tuple[str, str]:
    """An account SAS for Azurite's development account: (its signature, the token)."""
    sv, sp, st = "2020-08-04", "rwdlacup", "2020-01-01T00:00:00Z"
    se = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    signed = "\n".join([az.account, sp, "b", "sco", st, se, "", "https,http", sv, ""])
    mac = hmac.new(base64.b64decode(az.key), signed.encode(), hashlib.sha256)
    sig = base64.b64encode(mac.digest()).decode()
    token = f"sv={sv}&ss=b&srt=sco&sp={sp}&st={st}&se={se}&spr=https,http&sig={quote(sig, safe='')}"
    return sig, token


def _sas_options(az, token: str) -> dict[str, str]:
    return {
        "azure_storage_account_name": az.account,
        "azure_storage_sas_key": token,
        "azure_storage_endpoint": az.endpoint,
        "allow_http": "true",
    }


@pytest.mark.azure
def test_a_sas_token_expiring_mid_run_names_its_setting(az_server):
    root = az_server.url(az_server.new_container("sas"))
    td.Client(root, storage_options=az_server.storage_options()).project("p").branch().table(
        "t"
    ).append({"x": np.arange(3)})
    expiry = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=3)
    sig, token = _account_sas(az_server, expiry)
    client = td.Client(root, storage_options=_sas_options(az_server, token))
    table = client.project("p").branch().table("t").pin()
    assert table.num_moments == 3  # the token works
    while dt.datetime.now(dt.UTC) <= expiry + dt.timedelta(seconds=1):
        time.sleep(0.2)
    calls = [lambda: table.to_arrow(), lambda: client.store.get("treadle.json")]
    calls.append(lambda: td.Client(root, storage_options=_sas_options(az_server, token)).projects())
    for call in calls:
        with pytest.raises(td.CredentialsError) as info:
            call()
        msg = str(info.value)
        assert "SAS token given in storage_options 'azure_storage_sas_key'" in msg, msg
        assert f"expired at {expiry:%Y-%m-%dT%H:%M:%SZ}" in msg, msg
        shown = msg + repr(info.value) + "".join(traceback.format_exception(info.value))
        assert sig not in shown and quote(sig, safe="") not in shown


@pytest.mark.azure
def test_a_refused_sas_token_from_the_environment_is_named(az_server, monkeypatch):
    root = az_server.url(az_server.new_container("sasenv"))
    sig, token = _account_sas(az_server, dt.datetime(2021, 1, 1, tzinfo=dt.UTC))
    opts = _sas_options(az_server, token)
    monkeypatch.setenv("AZURE_STORAGE_SAS_KEY", opts.pop("azure_storage_sas_key"))
    with pytest.raises(td.CredentialsError) as info:
        td.Client(root, storage_options=opts).projects()
    msg = str(info.value)
    assert "environment variable AZURE_STORAGE_SAS_KEY expired at 2021-01-01T00:00:00Z" in msg
    assert sig not in msg and quote(sig, safe="") not in msg


@pytest.mark.timeout(300)
def test_a_server_stalling_mid_body_is_an_error_not_a_hang(s3_server, monkeypatch):
    """A GET whose body stops halfway on an open connection: Lance had no request timeout
    and waited forever (a loader's reader with it). Now a named error, within bounds
    (shortened here: the defaults are 30 s a request, 8 retries, 120 s)."""
    from treadle.storage import cloud

    short = {"timeout": "1s", "client_max_retries": "1", "client_retry_timeout": "3"}
    monkeypatch.setattr(cloud, "_LANCE_CLIENT_DEFAULTS", short, raising=False)
    root, opts = _s3_root(s3_server, "stall")
    td.Client(root, storage_options=opts).project("p").branch().table("t").append(
        {"x": np.arange(1000)}
    )
    with FaultProxy(s3_server.endpoint, kinds=("stall",), methods=("GET",), paths="/data/") as px:
        table = td.Client(root, storage_options=px.options(opts)).project("p").branch().table("t")
        table = table.pin()
        px.rate = 1.0
        with pytest.raises(td.StorageError, match=r"reading Table\(p/t") as info:
            table.to_arrow()
    assert px.counts["stall"] >= 1
    assert not isinstance(info.value, td.CredentialsError)


def test_lance_requests_are_bounded_unless_set(monkeypatch):
    from treadle.storage import Store

    opts = {"aws_access_key_id": "k", "aws_secret_access_key": "s", "aws_region": "us-east-1"}
    assert Store.open("s3://bkt/x", opts).lance_options["timeout"] == "30s"
    assert Store.open("s3://bkt/x", dict(opts, timeout="7s")).lance_options["timeout"] == "7s"
    monkeypatch.setenv("AWS_TIMEOUT", "9s")  # the environment's setting, passed on
    assert Store.open("s3://bkt/x", opts).lance_options["timeout"] == "9s"


def test_a_read_that_fails_through_every_retry_says_how_many_tries(s3_server, monkeypatch):
    """A GET whose body stalls each time (here past a 1 s request timeout) is retried, then
    a ``StorageError`` naming the object, the store and the tries it took, never bytes
    (treadle's retry budget shortened here from 60 s: obstore retries inside each try)."""
    from treadle.storage import RangeRequest, Store, ranged, retry

    for module in (retry, ranged):
        monkeypatch.setattr(module, "_RETRY_BUDGET_S", 1.0)
    root, opts = _s3_root(s3_server, "tries")
    Store.open(root, opts).put("obj", bytes(range(256)) * 64)
    with FaultProxy(s3_server.endpoint, kinds=("stall",), methods=("GET",), paths="/obj") as px:
        s3 = Store.open(root, dict(px.options(opts), timeout="1s"))
        px.rate = 1.0
        with pytest.raises(td.StorageError, match=rf"read {root}/obj failed \(1 try in \d+ s\)"):
            s3.get_ranges([RangeRequest("obj", 0, 100), RangeRequest("obj", 9000, 9100)])
    assert px.counts["stall"] >= 1

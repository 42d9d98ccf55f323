"""An object store that misbehaves after a commit landed, and Azure credentials that stop
working mid-run: what the user is told.

- A write whose commit landed but whose gc lease could not be dropped afterwards (the
  DELETE refused or failing) returns its commit: raising would tell the user it failed,
  and retrying it would append the rows twice. The lease left behind expires by itself.
- An Azure SAS token that expired mid-run (403) is a ``CredentialsError`` naming the
  setting it came from and its expiry, never its signature.
"""

from __future__ import annotations

import logging
import uuid

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

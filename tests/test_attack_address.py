"""A ProjectAddress (how a Ray task reopens a project) carries credentials in its storage
options: they never appear in its repr, str, in a task target's repr, or in the errors of
opening it with a wrong secret, a dead endpoint or an unknown project."""

from __future__ import annotations

import pickle
import traceback

import pytest

import treadle as td
from treadle.catalog.client import ProjectAddress
from treadle.importers.ray_executor import _Target


def test_project_address_never_shows_its_credentials(s3_root):
    root, opts = s3_root
    client = td.Client(root, storage_options=opts)
    client.project("p").branch().table("t").append({"a": [1, 2]})
    secret = opts["aws_secret_access_key"]
    addr = ProjectAddress.of(client.project("p"))
    shown = [
        repr(addr),
        str(addr),
        f"{addr}",
        repr(_Target(addr, "main", "t", "gc/writers/x/start")),
    ]
    assert all(secret not in s for s in shown), shown
    again = pickle.loads(pickle.dumps(addr))  # what a Ray task receives
    assert again.open().branch().table("t").pin().num_moments == 2
    wrong = "WRONG-SECRET-0123456789"
    bad = [
        ProjectAddress(addr.root, addr.storage_options, "nope"),
        ProjectAddress(addr.root, {**addr.storage_options, "aws_secret_access_key": wrong}, "p"),
        ProjectAddress(
            addr.root, {**addr.storage_options, "aws_endpoint": "http://127.0.0.1:9"}, "p"
        ),
    ]
    for b in bad:
        with pytest.raises(td.TreadleError) as e:
            b.open().branch().head()
        text = "".join(traceback.format_exception(e.value))
        assert secret not in text and wrong not in text, text

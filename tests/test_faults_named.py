"""Damaged catalog objects, a wrong bucket, an outage during a Lance write: named errors.

Each reaches the user as a ``TreadleError`` subclass naming the thing (commit id, ref,
bucket, table), never as a raw ``UnicodeDecodeError``/``JSONDecodeError``/``OSError``
or an S3 XML body. S3 cases run on the real SeaweedFS server, outages through the
fault proxy.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from fault_proxy import FaultProxy
from treadle.table.lanceerror import lance_error


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe\x00garbage", b'{"parents": [', b"[1, 2]", b'{"parents": 3}', b""],
    ids=["not-utf8", "cut-json", "a-list", "wrong-types", "empty"],
)
def test_garbage_commit_object_is_corrupt_data(tmp_path, garbage):
    root = str(tmp_path / "store")
    main = td.Client(root, create=True).project("p").branch()
    main.table("t").append({"x": np.arange(3)})
    cid = main.commit_id
    Path(root, f"projects/p/commits/{cid}.json").write_bytes(garbage)
    fresh = td.Client(root).project("p").branch()  # nothing cached
    with pytest.raises(td.CorruptData, match=f"commit object {cid}"):
        fresh.head()


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe", b'{"seq": 1, "commit": "../../../etc/passwd"}', b'{"seq": 1, "commit": 7}'],
    ids=["not-utf8", "not-an-id", "not-a-string"],
)
def test_garbage_ref_object_is_corrupt_data(tmp_path, garbage):
    root = str(tmp_path / "store")
    main = td.Client(root, create=True).project("p").branch()
    main.table("t").append({"x": np.arange(3)})
    ref = Path(root, "projects/p/refs/main/0000000000000001.json")
    ref.write_bytes(garbage)
    with pytest.raises(td.CorruptData, match="ref object .*refs/main/0000000000000001.json"):
        td.Client(root).project("p").branch().head()


def test_a_stray_object_among_refs_is_corrupt_data(tmp_path):
    """A first lookup LISTs the refs: a stray object sorting after them is CorruptData
    naming it; a ref object that is not a ref, once the head is known, too."""
    root = str(tmp_path / "store")
    p = td.Client(root, create=True).project("p")
    p.create()
    branch = p.branch()
    Path(root, "projects/p/refs/main/zz-notes.json").write_text("{}")
    with pytest.raises(td.CorruptData, match="zz-notes.json"):
        td.Client(root).project("p").branch()
    Path(root, "projects/p/refs/main/zz-notes.json").unlink()
    Path(root, "projects/p/refs/main/0000000000000001.json").write_text("{}")
    with pytest.raises(td.CorruptData, match="0000000000000001.json"):
        branch.head()


def test_wrong_bucket_is_named(s3_server):
    bucket = f"nobucket-{uuid.uuid4().hex[:12]}"  # never written: SeaweedFS would create it
    opts = s3_server.storage_options()
    client = td.Client(f"s3://{bucket}/prefix", storage_options=opts)
    for fn in (
        lambda: client.project("p"),
        lambda: client.project("p", create=False),
        client.projects,
        lambda: client.store.get("projects/p/commits/x.json"),
        lambda: client.store.list("projects"),
    ):
        with pytest.raises(td.StorageError) as ei:
            fn()
        msg = str(ei.value)
        assert f"bucket {bucket!r} does not exist" in msg, msg
        assert not isinstance(ei.value, td.NotFound), msg  # not "no such object"
        assert "<?xml" not in msg and "<Error>" not in msg, msg
    # Lance's own error for the same root, mapped by the table layer's lance_error
    with pytest.raises(OSError) as raw:
        lance.write_dataset(pa.table({"x": [1]}), f"s3://{bucket}/t.lance", storage_options=opts)
    err = lance_error(raw.value, "table 't' of project 'p'")
    assert type(err) is td.StorageError and f"bucket {bucket!r} does not exist" in str(err), err
    assert "<?xml" not in str(err)


def _s3_table(s3_server, name: str) -> tuple[str, dict]:
    root = s3_server.url(f"{name}-{time.time_ns()}")
    opts = s3_server.storage_options()
    td.Client(root, storage_options=opts).project("p").branch().table("t").append(
        {"x": np.arange(3)}
    )
    return root, opts


@pytest.mark.parametrize(
    ("paths", "methods", "what"),
    [("/data/", ("PUT",), "writing"), ("/_versions/", ("PUT",), "committing")],
    ids=["fragment-write", "version-commit"],
)
def test_lance_write_during_an_outage_is_a_storage_error(s3_server, paths, methods, what):
    root, opts = _s3_table(s3_server, "outage")
    with FaultProxy(s3_server.endpoint, kinds=("503",), paths=paths, methods=methods) as px:
        branch = td.Client(root, storage_options=px.options(opts)).project("p").branch()
        assert branch.table("t").to_arrow().num_rows == 3
        px.rate = 1.0  # the store goes down
        with pytest.raises(td.StorageError) as ei:
            branch.table("t").append({"x": np.arange(3)})
    assert px.counts["503"] >= 1
    msg = str(ei.value)
    assert f"{what} table 't' of project 'p'" in msg and "nothing was committed" in msg, msg
    assert "<?xml" not in msg, msg
    after = td.Client(root, storage_options=opts).project("p").branch()
    assert after.table("t").to_arrow().num_rows == 3  # nothing landed


def test_lance_write_without_access_is_a_credentials_error(s3_server):
    root, opts = _s3_table(s3_server, "denied")
    with FaultProxy(s3_server.endpoint, kinds=("403",), paths="/data/", methods=("PUT",)) as px:
        branch = td.Client(root, storage_options=px.options(opts)).project("p").branch()
        branch.table("t").to_arrow()
        px.rate = 1.0
        with pytest.raises(td.CredentialsError, match="writing table 't'"):
            branch.table("t").append({"x": np.arange(3)})

"""WebDataset import: round trip against WebDataset's own reader, bad input, crash and resume."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from importer_fixtures import make_wds
from treadle.catalog import Client
from treadle.errors import CorruptData, SchemaMismatch
from treadle.importers import UnsafeInput
from treadle.importers import webdataset as import_wds
from treadle.importers._common import expand_braces
from treadle.importers.webdataset import resolve_shards

wds = pytest.importorskip("webdataset")


@pytest.fixture
def client(local_root):
    return Client(local_root)


def _head(client, project="p"):
    try:
        return client.project(project).branch("main").commit_id
    except Exception:
        return None


def test_brace_expansion():
    assert expand_braces("s-{000008..000011}.tar") == [
        "s-000008.tar",
        "s-000009.tar",
        "s-000010.tar",
        "s-000011.tar",
    ]
    assert expand_braces("{a,b}/x-{1..2}") == ["a/x-1", "a/x-2", "b/x-1", "b/x-2"]


def test_round_trip_matches_webdataset_reader(tmp_path, client):
    pattern = make_wds(tmp_path / "wds", n=60, per_shard=25)
    res = import_wds(pattern, client.project("p"), "samples", progress=False)
    assert res.rows == 60 and res.commit is not None
    t = client.project("p").branch("main").table("samples").pin()
    got = t.to_arrow().to_pylist()
    ref = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
    assert len(got) == len(ref) == 60
    for g, r in zip(got, ref):
        assert g["key"] == r["__key__"]
        assert g["png"] == r["png"]  # encoded bytes kept exactly
        assert g["cls"] == int(r["cls"].decode())
        assert g["txt"] == r["txt"].decode()
        assert g["json"] == json.loads(r["json"])
        np.testing.assert_array_equal(
            np.asarray(g["npy"], np.float32), np.load(io.BytesIO(r["npy"]))
        )


def test_decoded_images_match_webdataset_rgb8(tmp_path, client):
    pattern = make_wds(tmp_path / "wds", n=20, per_shard=8)
    import_wds(pattern, client.project("p"), "dec", images="decoded", progress=False)
    t = client.project("p").branch("main").table("dec").pin()
    from treadle.table.tensors import to_numpy

    col = t.to_arrow(["png"]).column("png")
    imgs = to_numpy(col, t.schema.field("png"))
    ref = [s["png"] for s in wds.WebDataset(pattern, shardshuffle=False).decode("rgb8")]
    assert imgs.shape == (20, 16, 16, 3) and imgs.dtype == np.uint8
    np.testing.assert_array_equal(imgs, np.stack(ref))


def _tar(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/treadle-pwned",))


def test_pickle_members_refused_unless_allowed(tmp_path, client):
    shard = _tar(
        tmp_path / "p.tar",
        {
            "a.pyd": pickle.dumps({"x": 1}),
            "a.cls": b"1",
            "b.pyd": pickle.dumps({"x": 2}),
            "b.cls": b"2",
        },
    )
    with pytest.raises(UnsafeInput, match="pickle"):
        import_wds(shard, client.project("p"), "t", progress=False)
    assert client.project("p").branch("main").tables() == []
    res = import_wds(shard, client.project("p"), "t", allow_pickle=True, progress=False)
    assert res.rows == 2
    rows = client.project("p").branch("main").table("t").to_arrow().to_pylist()
    assert [r["pyd"] for r in rows] == [{"x": 1}, {"x": 2}]


def test_truncated_tar_is_corrupt_and_nothing_committed(tmp_path, client):
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=15)
    shards = sorted((tmp_path / "wds").glob("*.tar"))
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2 + 100])
    client.project("p").create()
    before = _head(client)
    with pytest.raises(CorruptData, match="shard-000001.tar"):
        import_wds(pattern, client.project("p"), "t", progress=False)
    assert _head(client) == before
    assert client.project("p").branch("main").tables() == []


def test_mismatched_members_name_the_sample(tmp_path, client):
    shard = _tar(tmp_path / "m.tar", {"a.cls": b"1", "a.txt": b"x", "b.cls": b"2"})
    with pytest.raises(SchemaMismatch, match="'b'"):
        import_wds(shard, client.project("p"), "t", progress=False)


def test_pipe_urls_refused():
    with pytest.raises(Exception, match="pipe"):
        resolve_shards(["pipe:curl http://example.invalid/x.tar"])


def test_rerun_is_idempotent_and_branch_moves_once(tmp_path, client):
    pattern = make_wds(tmp_path / "wds", n=10, per_shard=5)
    r1 = import_wds(pattern, client.project("p"), "t", progress=False)
    r2 = import_wds(pattern, client.project("p"), "t", progress=False)
    assert r2.skipped and r2.commit.id == r1.commit.id
    br = client.project("p").branch("main")
    assert br.table("t").num_moments == 10
    assert sum("import-id=" in c.message for c in br.log()) == 1


CRASH = """
import os, sys
sys.path.insert(0, {tests!r})
from treadle.catalog import Client
import treadle.table.write as w
orig = w.TableWriter.append
calls = []
def append(self, data):
    orig(self, data)
    calls.append(1)
    if len(calls) == 3:
        w.Transaction._flush(self.tx, self.name, self.tx._staged(self.name))  # data files on disk
        os._exit(17)
w.TableWriter.append = append
from treadle.importers import webdataset
webdataset({pattern!r}, Client({root!r}).project("p"), "t", chunk_rows=8, progress=False)
"""


def test_killed_import_commits_nothing_and_rerun_completes(tmp_path, local_root):
    pattern = make_wds(tmp_path / "wds", n=60, per_shard=20)
    client = Client(local_root)
    client.project("p").create()  # the branch exists before the crash
    head = _head(client)
    log_before = len(client.project("p").branch("main").log())
    code = CRASH.format(tests=str(Path(__file__).parent), pattern=pattern, root=local_root)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True)
    assert proc.returncode == 17, proc.stderr.decode()[-2000:]
    assert _head(client) == head  # the branch did not move
    assert client.project("p").branch("main").tables() == []
    staged = list(Path(local_root).rglob("*.lance"))
    assert staged, "the crashed attempt should have staged data files (it died mid-import)"
    res = import_wds(pattern, client.project("p"), "t", progress=False)
    assert res.rows == 60 and not res.skipped
    br = client.project("p").branch("main")
    keys = br.table("t").to_arrow(["key"]).column("key").to_pylist()
    assert keys == [f"sample{i:05d}" for i in range(60)]  # no duplicates, source order
    assert len(br.log()) == log_before + 1  # the branch moved once
    assert list(br.log()[0].parents) == [head]


def test_cli_import(tmp_path, local_root, capsys):
    from treadle.importers.cli import main

    pattern = make_wds(tmp_path / "wds", n=12, per_shard=6)
    rc = main(
        ["import", "webdataset", pattern, "--project", "cli", "--table", "t", "--root", local_root]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rows"] == 12 and out["commit"]
    rc = main(
        [
            "import",
            "webdataset",
            pattern,
            "--project",
            "cli",
            "--table",
            "t2",
            "--root",
            local_root,
            "--rename",
            "npy=action",
            "--images",
            "decoded",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    schema = Client(local_root).project("cli").branch("main").table("t2").schema
    assert "action" in schema.names and "npy" not in schema.names
    assert schema.field("png").metadata[b"treadle:shape"] == b"[16, 16, 3]"
    rc = main(
        [
            "import",
            "webdataset",
            str(tmp_path / "nope.tar"),
            "--project",
            "cli",
            "--table",
            "t",
            "--root",
            local_root,
        ]
    )
    assert rc == 1
    assert "nope.tar" in capsys.readouterr().err


@pytest.mark.s3
def test_object_store_urls_with_brace_pattern(tmp_path, s3_server, local_root):
    from treadle.storage import Store

    make_wds(tmp_path / "wds", n=30, per_shard=10)
    url = s3_server.url("wds-src")
    opts = s3_server.storage_options()
    store = Store.open(url, opts)
    for p in sorted((tmp_path / "wds").glob("*.tar")):
        store.put(p.name, p.read_bytes())
    client = Client(local_root)
    res = import_wds(
        f"{url}/shard-{{000000..000002}}.tar",
        client.project("p"),
        "t",
        source_options=opts,
        progress=False,
    )
    assert res.rows == 30
    keys = client.project("p").branch("main").table("t").to_arrow(["key"]).column("key")
    assert keys.to_pylist() == [f"sample{i:05d}" for i in range(30)]

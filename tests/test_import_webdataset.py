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
import pyarrow as pa
import pytest

import treadle.importers.sources as sources
from importer_fixtures import (
    make_wds,
    make_wds_json_drift,
    nothing_committed,
    run_memory_capped,
    tar_gz_bomb,
)
from treadle.catalog import Client
from treadle.errors import CorruptData, SchemaMismatch
from treadle.importers import UnsafeInput
from treadle.importers import webdataset as import_wds
from treadle.importers.sources import expand_braces
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
    assert nothing_committed(client.project("p"))
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
    assert nothing_committed(client.project("p"))


@pytest.mark.parametrize("where", ["at a member boundary", "inside a header", "garbage"])
@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tar.gz"])
def test_a_tar_cut_where_tarfile_sees_its_end_is_corrupt(tmp_path, client, where, gz):
    """Python's tarfile (and WebDataset's reader) end quietly when a shard stops at a member
    boundary or inside a header block: the samples after the cut were silently missing."""
    import gzip

    with wds.TarWriter(str(tmp_path / "full.tar")) as w:
        for i in range(4):
            w.write({"__key__": f"s{i}", "cls": i})
    data = (tmp_path / "full.tar").read_bytes()
    with tarfile.open(tmp_path / "full.tar") as t:
        third = t.getmembers()[2].offset  # where sample s2's headers begin
    cut = {
        "at a member boundary": data[:third],
        "inside a header": data[: third + 100],
        "garbage": data[:third] + b"\x07" * 4096,
    }[where]
    name = "cut.tar.gz" if gz else "cut.tar"
    (tmp_path / name).write_bytes(gzip.compress(cut) if gz else cut)
    assert len(list(wds.WebDataset(str(tmp_path / name), shardshuffle=False))) == 2
    with pytest.raises(CorruptData, match=rf"{name}.*after sample 's1'.*end-of-archive"):
        import_wds(str(tmp_path / name), client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))
    # a complete shard without the end-of-archive blocks' padding still imports
    (tmp_path / "ok.tar").write_bytes(data[: len(data.rstrip(b"\0")) + 1024])
    assert import_wds(str(tmp_path / "ok.tar"), client.project("p"), "t", progress=False).rows == 4


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
import treadle.catalog.transaction as w
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
    assert nothing_committed(client.project("p"))
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
    from treadle.cli import main

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
    cap = ["--project", "cli", "--table", "t3", "--root", local_root, "--max-member-bytes", "0.1K"]
    assert main(["import", "webdataset", pattern, *cap]) == 1
    err = capsys.readouterr().err
    assert "UnsafeInput" in err and "max_member_bytes=102" in err and "shard-000000.tar" in err


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
    # a corrected object of the same size (new ETag) imports again; an unchanged one not
    shards = f"{url}/shard-{{000000..000002}}.tar"
    data = (tmp_path / "wds" / "shard-000002.tar").read_bytes()
    store.put("shard-000002.tar", data.replace(b"caption 25", b"caption XX"))
    again = import_wds(shards, client.project("p"), "t", source_options=opts, progress=False)
    assert not again.skipped and again.rows == 30
    same = import_wds(shards, client.project("p"), "t", source_options=opts, progress=False)
    assert same.skipped and same.commit.id == again.commit.id


# -- faithful values ------------------------------------------------------------------------------


@pytest.mark.parametrize("drift", ["float", "key", "null"])
def test_json_drift_after_the_first_chunk_is_refused_naming_sample_and_field(
    tmp_path, client, drift
):
    shard = make_wds_json_drift(tmp_path / "w", drift)  # sample 1100 of 1200, chunks of 1024
    field = {"float": "json.score", "key": "json.late", "null": "json.note"}[drift]
    with pytest.raises(SchemaMismatch, match=rf"'s01100'.*{field}.*json_as='text'"):
        import_wds(shard, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))
    # the way out: JSON kept as its text, exactly as written
    import_wds(shard, client.project("p"), "t", json_as="text", progress=False)
    got = client.project("p").branch("main").table("t").to_arrow(["json"]).column("json")
    ref = [s["json"].decode() for s in wds.WebDataset(shard, shardshuffle=False)]
    assert got.to_pylist() == ref and json.loads(ref[1100])["id"] == 1100


@pytest.mark.parametrize(
    ("values", "typ", "named"),
    [
        ([1.5], pa.int64(), r"'c' = 1\.5 would be stored as 1 "),
        ([[1, 2.5]], pa.list_(pa.int64()), r"field c\[1\] = 2\.5"),
        ([{"a": {"b": 2.5}}], pa.struct([("a", pa.struct([("b", pa.int32())]))]), r"c\.a\.b"),
        ([2**53 + 1], pa.float64(), "exactly representable"),  # int -> float only when exact
        ([1e300], pa.float32(), "inf"),
        ([True], pa.int64(), "bool"),
        ([{"a": 2**70}], None, r"field c\.a .*outside int64"),
        ([-0.0], pa.int64(), r"'c' = -0\.0 would be stored as 0 "),  # was stored as 0
    ],
)
def test_lossy_values_are_refused_naming_the_field(values, typ, named):
    from treadle.importers._exact import exact_array

    with pytest.raises(SchemaMismatch, match=rf"^sample 0: .*{named}"):
        exact_array(values, "c", lambda i: f"sample {i}", typ)
    assert exact_array([{"a": 1}, {"b": None}], "c", str, None).to_pylist() == [
        {"a": 1, "b": None},
        {"a": None, "b": None},
    ]  # a missing key reads back as null
    pickled = [{"x": np.arange(2), "y": np.float32(0.5)}]  # numpy inside an opted-in pickle
    assert exact_array(pickled, "c", str, None).to_pylist() == [{"x": [0, 1], "y": 0.5}]


def test_json_ints_after_float_chunk_are_widened_exactly(tmp_path, client):
    shard = make_wds_json_drift(tmp_path / "w", "int")
    import_wds(shard, client.project("p"), "t", progress=False)
    rows = client.project("p").branch("main").table("t").to_arrow(["json"]).to_pylist()
    assert [r["json"]["score"] for r in rows[1099:1102]] == [1099.25, 1100.0, 1101.25]


def test_cli_json_as_text(tmp_path, local_root, capsys):
    from treadle.cli import main

    shard = make_wds_json_drift(tmp_path / "w", "key")
    args = ["import", "webdataset", shard, "--project", "p", "--table", "t", "--root", local_root]
    assert main(args) == 1 and "--json-as text" in capsys.readouterr().err
    assert main([*args, "--json-as", "text"]) == 0
    t = Client(local_root).project("p").branch("main").table("t")
    assert json.loads(t.to_arrow(["json"]).column("json")[1100].as_py())["late"] == "only here"


def test_members_mapping_to_one_column_are_refused(tmp_path, client):
    with wds.TarWriter(str(tmp_path / "c.tar")) as w:
        w.write({"__key__": "x", "seg.png": b"dotted", "seg_png": b"underscored", "cls": 1})
    with pytest.raises(SchemaMismatch, match=r"x\.seg\.png.*x\.seg_png|x\.seg_png.*x\.seg\.png"):
        import_wds(str(tmp_path / "c.tar"), client.project("p"), "t", progress=False)
    with pytest.raises(SchemaMismatch, match="'cls'"):  # a rename onto another member, too
        import_wds(
            str(tmp_path / "c.tar"),
            client.project("p"),
            "t",
            rename={"seg_png": "cls"},
            progress=False,
        )


def test_scalar_npy_dtype_drift_across_chunks_is_refused(tmp_path, client):
    """A later chunk of 0-d float64 .npy members is not cast to the first chunk's float32."""
    with wds.TarWriter(str(tmp_path / "d.tar")) as w:
        for i in range(6):
            w.write({"__key__": f"s{i}", "npy": np.float32(1) if i < 3 else np.float64(0.1)})
    with pytest.raises(SchemaMismatch, match=r"sample 's3'.*'npy' is float64.*float32"):
        import_wds(str(tmp_path / "d.tar"), client.project("p"), "t", chunk_rows=3, progress=False)


def test_a_json_null_member_is_stored_as_null(tmp_path, client):
    """A member whose JSON is ``null`` is there: a null value, not "the sample has no member"."""
    with wds.TarWriter(str(tmp_path / "n.tar")) as w:
        for i in range(4):
            w.write({"__key__": f"s{i}", "json": None if i == 1 else {"a": i}, "cls": i})
    import_wds(str(tmp_path / "n.tar"), client.project("p"), "t", progress=False)
    t = client.project("p").branch("main").table("t")
    assert t.to_arrow(["json"]).column("json").to_pylist() == [{"a": 0}, None, {"a": 2}, {"a": 3}]


# -- import ids -----------------------------------------------------------------------------------


def test_import_id_covers_table_and_content(tmp_path, client, monkeypatch):
    pattern = make_wds(tmp_path / "wds", n=10, per_shard=5)
    p = client.project("p")
    a = import_wds(pattern, p, "a", progress=False)
    b = import_wds(pattern, p, "b", progress=False)  # same shards, another table
    assert not b.skipped and b.rows == 10 and a.import_id != b.import_id
    shard = tmp_path / "wds" / "shard-000001.tar"
    data, st = shard.read_bytes(), shard.stat()
    fixed = data.replace(b"caption 7", b"caption X")
    assert fixed != data and len(fixed) == len(data)
    shard.write_bytes(fixed)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime back
    c = import_wds(pattern, p, "a", progress=False)
    assert not c.skipped and c.rows == 10
    texts = p.branch("main").table("a").to_arrow(["txt"]).column("txt").to_pylist()
    assert texts.count("caption X") == 1 and texts.count("caption 7") == 1
    again = import_wds(pattern, p, "a", progress=False)  # unchanged: the earlier commit
    assert again.skipped and again.commit.id == c.commit.id
    # large files are known by size and mtime (not hashed): a rewrite is seen too
    monkeypatch.setattr(sources, "HASH_BELOW", 0)
    first = import_wds(pattern, p, "big", progress=False)
    shard.write_bytes(data)
    assert not import_wds(pattern, p, "big", progress=False).skipped
    assert import_wds(pattern, p, "big", progress=False).skipped
    assert not first.skipped


# -- hostile input: bounded memory ----------------------------------------------------------------


def test_decode_look_ahead_is_bounded_in_bytes():
    from treadle.read.prefetch import ordered_map

    weights = [10, 10, 300, 10, 500, 10, 10, 10, 390, 20]
    pulled: list[int] = []
    yielded: list[int] = []
    worst = 0

    def items():
        nonlocal worst
        for i in range(len(weights)):
            worst = max(worst, sum(weights[j] for j in pulled if j not in yielded))
            pulled.append(i)
            yield i

    def fn(i):
        return i

    for r in ordered_map(fn, items(), threads=4, ahead=8, weight=weights.__getitem__, budget=400):
        yielded.append(r)
    assert yielded == list(range(len(weights))) and 0 < worst <= 400


def _tga_bytes():
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 3), (9, 8, 7)).save(out, format="TGA")
    return out.getvalue()


_EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 4\n0 0 moveto showpage\n%%EOF\n"


@pytest.mark.parametrize("data", [_tga_bytes(), _EPS], ids=["tga", "eps"])
def test_only_image_formats_are_decoded_whatever_the_bytes(tmp_path, client, data):
    # the bytes pick Pillow's plugin, not the member's name: EPS runs Ghostscript
    shard = _tar(tmp_path / "odd.tar", {"s.jpg": data, "s.cls": b"1"})
    with pytest.raises(CorruptData, match=r"odd.tar.* .jpg: cannot decode jpg: not a JPEG, PNG"):
        import_wds(str(shard), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def _npy_header(descr, shape, payload=64):
    head = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    head += b" " * (63 - (len(head) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head + bytes(payload)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_npy_header("|u1", (1 << 44,)), r"\[17592186044416\] uint8 \(17,592,186,044,416 bytes\), "
                                         r"it holds 64 bytes"),
        (_npy_header("|S0", (1 << 40,)), r"\[1099511627776\] \|S0 \(0 bytes\)"),
        (_npy_header("<f4", (4,), 12), r"\[4\] float32 \(16 bytes\), it holds 12 bytes"),
    ],
)  # fmt: skip
def test_npy_headers_are_checked_against_their_bytes(tmp_path, client, data, match):
    # NumPy allocated the claimed 16 TiB (a MemoryError), and an S0 array of 2**40 empty
    # strings hung the import in np.stack
    shard = _tar(tmp_path / "npy.tar", {"s.npy": data, "s.cls": b"1"})
    with pytest.raises(
        CorruptData, match=r"npy.tar, sample 's': member .npy: its header says " + match
    ):
        import_wds(str(shard), client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


def test_an_object_npy_is_refused_as_a_pickle(tmp_path, client):
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    shard = tmp_path / "obj.tar"
    with tarfile.open(shard, "w") as tar:
        for name, value in (("s.npy", out.getvalue()), ("s.cls", b"1")):
            ti = tarfile.TarInfo(name)
            ti.size = len(value)
            tar.addfile(ti, io.BytesIO(value))
    with pytest.raises(UnsafeInput, match=r"member .npy is an object array \(a pickle\)"):
        import_wds(str(shard), client.project("p"), "t", progress=False, allow_pickle=True)
    assert nothing_committed(client.project("p"))


def test_sparse_members_are_refused(tmp_path, client):
    # 10 KiB on disk, 64 MiB of zeros per member when read: a plain tar that inflates
    shard = tmp_path / "sparse.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for ext in ("json", "b0", "b1", "b2", "b3"):
            ti = tarfile.TarInfo(f"s.{ext}")
            ti.size = 1
            if ext != "json":
                ti.pax_headers = {"GNU.sparse.map": f"{(64 << 20) - 1},1",
                                  "GNU.sparse.size": str(64 << 20)}  # fmt: skip
            tar.addfile(ti, io.BytesIO(b"1"))
    with pytest.raises(UnsafeInput, match=r"sparse.tar: member 's.b0' is a sparse file: "
                       r"67,108,864 bytes"):  # fmt: skip
        import_wds(str(shard), client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


@pytest.mark.slow  # a memory-capped subprocess
def test_tar_gz_bomb_of_many_members_stops_at_max_shard_bytes(tmp_path, local_root):
    bomb = tar_gz_bomb(tmp_path / "many.tar.gz", 1 << 20, members=256)  # 256 MiB inflated
    call = f"td.importers.webdataset({bomb!r}, client.project('p'), 't', progress=False, max_shard_bytes=48 << 20)"
    out = run_memory_capped(call, local_root, tmp_path)
    assert out["error"] == "UnsafeInput" and "many.tar.gz" in out["message"], out
    assert "max_shard_bytes" in out["message"]
    assert out["rss_growth"] < 384 << 20, out
    assert Client(local_root).project("p").branch("main").tables() == ["warm"]


@pytest.mark.slow  # a memory-capped subprocess
def test_member_past_the_default_cap_stops_under_a_memory_cap(tmp_path, local_root):
    from treadle.importers.webdataset import MAX_MEMBER_BYTES, MAX_SHARD_BYTES

    assert MAX_MEMBER_BYTES == 1 << 30 and MAX_SHARD_BYTES == 2 << 30  # as documented
    bomb = tar_gz_bomb(tmp_path / "big.tar.gz", MAX_MEMBER_BYTES + 1)  # ~5 MB on disk
    call = f"td.importers.webdataset({bomb!r}, client.project('p'), 't', progress=False)"
    out = run_memory_capped(call, local_root, tmp_path)
    assert out["error"] == "UnsafeInput" and "max_member_bytes" in out["message"], out
    assert "big.tar.gz" in out["message"] and "bomb00000.bin" in out["message"], out
    assert out["rss_growth"] < 256 << 20, out


@pytest.mark.slow  # a memory-capped subprocess
def test_decoded_images_count_as_their_pixels_in_chunks_and_the_decode_budget(tmp_path, local_root):
    """60 PNGs of 2000x2000 black (12 KB each, 12 MB decoded) fell in one chunk and were all
    decoded at once (720 MB, then stacked: 2 GB at peak), the budget counting their encoded
    bytes; now chunks and the decode budget count pixels, and the peak does not grow with
    the number of images (about 550 MB here, mostly the transaction's staging and Lance)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (2000, 2000)).save(buf, "PNG")
    png = buf.getvalue()
    shard = tmp_path / "black.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(60):
            for ext, data in (("png", png), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert shard.stat().st_size < 1 << 20
    call = ("import treadle.importers.webdataset as w; w.IN_FLIGHT_BYTES = 48 << 20; "
            f"td.importers.webdataset({str(shard)!r}, client.project('p'), 't', "
            "images='decoded', progress=False)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=1 << 30)
    assert out["error"] is None, out
    assert out["rss_growth"] < 768 << 20, out
    t = Client(local_root).project("p").branch("main").table("t").pin()
    assert t.to_arrow(["cls"]).column("cls").to_pylist() == list(range(60))

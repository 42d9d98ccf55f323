"""Zarr import (Diffusion Policy ReplayBuffer): stores written by zarr, read back by zarr."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from importer_fixtures import nothing_committed, run_memory_capped
from robot_fixtures import make_replay_buffer, make_umi_zip
from treadle.catalog import Client
from treadle.errors import (
    CorruptData,
    InvalidName,
    MissingDependency,
    SchemaMismatch,
    UnsafeInput,
    UnsupportedFormat,
)
from treadle.importers import zarr as import_zarr
from treadle.table.tensors import to_numpy

zarr = pytest.importorskip("zarr")


def _column(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


@pytest.fixture(scope="module")
def pusht(tmp_path_factory):
    return make_replay_buffer(tmp_path_factory.mktemp("dp") / "pusht.zarr")


def _check_equal(t, path, lengths):
    g = zarr.open_group(str(path), mode="r") if not str(path).endswith(".zip") else None
    if g is None:
        store = zarr.storage.ZipStore(path, mode="r")
        g = zarr.open_group(store, mode="r")
    assert list(t.episodes().names) == [f"episode_{i:06d}" for i in range(len(lengths))]
    assert list(t.episodes().lengths) == list(lengths)
    for key in ("state", "action", "n_contacts"):
        got, want = _column(t, key), g[f"data/{key}"][:]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    return g


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_replay_buffer_episodes_and_values(tmp_path, zarr_format):
    path = make_replay_buffer(tmp_path / "b.zarr", zarr_format=zarr_format)
    client = Client(str(tmp_path / "store"), create=True)
    res = import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    g = _check_equal(t, path, (5, 3, 7))
    np.testing.assert_array_equal(_column(t, "img"), g["data/img"][:])
    assert res.episodes == 3 and res.rows == 15
    assert t.metadata == {"source": "pusht"}
    again = import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert again.skipped and again.commit.id == res.commit.id  # the import id: a no-op


def test_zip_store_as_video_with_psnr(tmp_path):
    path = make_replay_buffer(tmp_path / "b.zarr.zip", zip=True)
    client = Client(str(tmp_path / "store"), create=True)
    res = import_zarr(str(path), client.project("p"), "t", fps=10, progress=False)
    t = client.project("p").branch("main").table("t").pin()
    _check_equal(t, path, (5, 3, 7))
    assert t.video_columns == ["img"] and t.fps == 10
    (cam,) = res.cameras
    assert cam["column"] == "img" and cam["episodes"] == 3 and 20 < cam["psnr_mean_db"] < 99


def test_encoded_is_refused_and_nothing_is_written(pusht, tmp_path):
    """Zarr chunks are codec-compressed arrays, not image files: there are no source image
    bytes to keep (the issue: "encoded" is refused with a clear error)."""
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(UnsupportedFormat, match="images='encoded'.*images='video'"):
        import_zarr(str(pusht), client.project("p"), "t", images="encoded", progress=False)
    assert client.projects() == []


def test_umi_zip_with_jpeg_xl_frames_equals_zarrs_own_read(tmp_path):
    """UMI's ``.zarr.zip`` keeps camera frames as JPEG XL chunks: imagecodecs decodes them at
    import (the ``zarr`` extra), and every pixel and value equals zarr's own read."""
    path = make_umi_zip(tmp_path / "umi.zarr.zip")
    client = Client(str(tmp_path / "store"), create=True)
    import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    g = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    assert list(t.episodes().lengths) == [2, 4]
    for key in ("camera0_rgb", "robot0_eef_pos"):
        got, want = _column(t, key), g[f"data/{key}"][:]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def _edit_array(path, key, edit):
    meta = path / key / ".zarray"
    z = json.loads(meta.read_text())
    edit(z)
    meta.write_text(json.dumps(z))


def _rewrite_ends(path, ends):
    g = zarr.open_group(str(path), mode="a")
    del g["meta/episode_ends"]
    g["meta"].create_array("episode_ends", data=np.asarray(ends, np.int64))


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda p: _rewrite_ends(p, [5, 3, 15]), CorruptData, "not strictly increasing"),
        (lambda p: _rewrite_ends(p, [5, 8, 14]), CorruptData, "ends at 14, the data has 15"),
        (lambda p: zarr.open_group(str(p), mode="a")["data"].create_array(
            "short", data=np.zeros(4)), CorruptData, "arrays of different lengths"),
        (lambda p: _edit_array(p, "data/state", lambda z: z.update(
            compressor={"id": "imagecodecs_notacodec"})), MissingDependency,
         "needs a codec that is not installed.*imagecodecs_notacodec"),
        (lambda p: _edit_array(p, "data/state", lambda z: z.update(shape=[1 << 40, 5])),
         CorruptData, "arrays of different lengths"),
        (lambda p: (p / "data").rename(p / "other"), CorruptData, "no 'data' in the store"),
    ],
)  # fmt: skip
def test_named_errors_and_nothing_committed(tmp_path, edit, error, match):
    path = make_replay_buffer(tmp_path / "bad.zarr")
    edit(path)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(error, match=match):
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_hostile_episode_size_is_refused_before_reading(tmp_path):
    path = make_replay_buffer(tmp_path / "big.zarr", lengths=(2,))
    for key in ("img", "state", "action", "n_contacts"):
        _edit_array(path, f"data/{key}", lambda z: z.update(shape=[1 << 30, *z["shape"][1:]]))
    _rewrite_ends(path, [1 << 30])
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match="over max_episode_bytes"):
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_moments_count_against_max_episode_bytes_and_need_values(tmp_path):
    path = make_replay_buffer(tmp_path / "b.zarr", lengths=(2,))
    g = zarr.open_group(str(path), mode="a")
    for key in ("img", "state", "action", "n_contacts"):
        del g[f"data/{key}"]
    g["data"].create_array("flag", shape=(1 << 20, 1), dtype="u1", chunks=(1 << 16, 1))
    _rewrite_ends(path, [1 << 20])
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match=r"34603008 bytes, over max_episode_bytes"):
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False,
                    max_episode_bytes=16 << 20)  # fmt: skip
    g["data"].create_array("none", shape=(1 << 20, 0), dtype="f4")
    with pytest.raises(SchemaMismatch, match=r"array data/none is \(1048576, 0\): no values"):
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_a_folder_linked_out_of_the_store_is_refused(tmp_path):
    # zarr opens data/n_contacts/0.0 itself: through a linked folder it read any file
    path = make_replay_buffer(tmp_path / "b.zarr")
    outside = tmp_path / "outside"
    shutil.move(path / "data" / "n_contacts", outside)
    (path / "data" / "n_contacts").symlink_to(outside, target_is_directory=True)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(InvalidName, match=r"path 'data/n_contacts' escapes the source root"):
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_video_needs_fps(pusht, tmp_path):
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(ValueError, match="needs fps="):
        import_zarr(str(pusht), client.project("p"), "t", progress=False)


@pytest.mark.s3
def test_from_and_into_s3(pusht, s3_server, s3_root, tmp_path):
    from treadle.storage import Store

    opts = s3_server.storage_options()
    url = s3_server.url(f"src-zarr-{id(pusht)}")
    store = Store.open(url, opts)
    for p in sorted(pusht.rglob("*")):
        if p.is_file():
            store.put(f"pusht.zarr/{p.relative_to(pusht)}", p.read_bytes())
    root, root_opts = s3_root
    client = Client(root, root_opts)
    res = import_zarr(f"{url}/pusht.zarr", client.project("p"), "t", images="decoded",
                      source_options=opts, progress=False)  # fmt: skip
    assert res.rows == 15
    _check_equal(client.project("p").branch("main").table("t").pin(), pusht, (5, 3, 7))
    zipped = make_replay_buffer(tmp_path / "pusht.zarr.zip", zip=True)  # a .zarr.zip there too
    store.put("pusht.zarr.zip", zipped.read_bytes())
    res = import_zarr(f"{url}/pusht.zarr.zip", client.project("p"), "z", images="decoded",
                      source_options=opts, progress=False)  # fmt: skip
    assert res.rows == 15
    _check_equal(client.project("p").branch("main").table("z").pin(), zipped, (5, 3, 7))


def test_cli_import_zarr(pusht, tmp_path, capsys):
    from treadle.cli import main

    root = str(tmp_path / "store")
    argv = ["--root", root, "import", "zarr", str(pusht), "--project", "p", "--table", "t"]
    assert main([*argv, "--fps", "10", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 3 and out["rows"] == 15 and out["cameras"][0]["column"] == "img"
    assert main([*argv, "--images", "decoded"]) == 1  # the table holds video now
    assert "SchemaMismatch" in capsys.readouterr().err
    assert main([*argv, "--images", "encoded"]) == 1
    assert "images='encoded'" in capsys.readouterr().err


def test_a_chunk_larger_than_the_episode_counts_against_max_episode_bytes(tmp_path, local_root):
    """A 2-row array in one 512 MiB zlib chunk of zeros (half a MiB of store) took the whole
    chunk's memory to read, past max_episode_bytes: zarr inflates whole chunks."""
    import zlib

    path = make_replay_buffer(tmp_path / "b.zarr", lengths=(2,))
    rows = 1 << 27  # float32 [rows, 1]: 512 MiB a chunk
    _edit_array(path, "data/n_contacts", lambda z: z.update(
        chunks=[rows, 1], compressor={"id": "zlib", "level": 1}, filters=None))  # fmt: skip
    z = zlib.compressobj(1)
    with open(path / "data" / "n_contacts" / "0.0", "wb") as f:
        for _ in range(rows * 4 >> 20):
            f.write(z.compress(bytes(1 << 20)))
        f.write(z.flush())
    call = (f"td.importers.zarr({str(path)!r}, client.project('p'), 't', images='decoded', "
            "progress=False, max_episode_bytes=64 << 20)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=384 << 20)
    assert out["error"] == "CorruptData", out
    assert re.search(r"episode_000000 \(rows 0..1\): \d+ bytes, over max_episode_bytes .*"
                     r"data/n_contacts \(\(2, 1\) float32 in chunks of \(134217728, 1\)\)",
                     out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20
    _edit_array(path, "meta/episode_ends", lambda z: z.update(chunks=[1 << 30]))
    client = Client(str(tmp_path / "other"), create=True)
    with pytest.raises(CorruptData, match=r"meta/episode_ends is \(1,\) int64 in chunks of "
                       r"\(1073741824,\): chunks too large"):  # fmt: skip
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_chunk_that_cannot_be_decoded_names_the_array(tmp_path, zarr_format):
    path = make_replay_buffer(tmp_path / "b.zarr", zarr_format=zarr_format)
    chunk = next(p for p in (path / "data" / "state").rglob("*") if p.is_file()
                 and p.name not in (".zarray", ".zattrs", "zarr.json"))  # fmt: skip
    chunk.write_bytes(chunk.read_bytes()[:12])  # cut inside the codec's header
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match=r"b.zarr, episode_\d+ \(rows \d+..\d+\): array "
                       r"data/state cannot be read: \w+Error"):  # fmt: skip
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_a_zip_member_inflating_past_any_chunk_is_refused(tmp_path, local_root):
    """A zip store's chunk member of 128 MiB of zeros (128 KB deflated) for a 4-row array
    was inflated whole by zarr before its codec refused it."""
    import zipfile

    folder = make_replay_buffer(tmp_path / "b.zarr", lengths=(2, 3))
    path = tmp_path / "bomb.zarr.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = f.relative_to(folder).as_posix()
            if rel != "data/state/0.0":
                z.write(f, rel)
                continue
            with z.open(rel, "w", force_zip64=True) as w:
                for _ in range(128):
                    w.write(bytes(1 << 20))
    assert path.stat().st_size < 1 << 20
    call = (f"td.importers.zarr({str(path)!r}, client.project('p'), 't', images='decoded', "
            "progress=False)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=96 << 20)
    assert out["error"] == "UnsafeInput", out
    assert re.search(r"bomb.zarr.zip: zip member 'data/state/0.0' inflates to 134,217,728 bytes, "
                     r"more than any chunk of the store needs \(6,912 bytes the largest\)",
                     out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20


@pytest.mark.parametrize("where", ["filters", "compressor"])
def test_a_pickle_codec_is_refused_and_nothing_is_unpickled(tmp_path, where, monkeypatch):
    """An array whose filter (or compressor) is numcodecs' Pickle was reported as a codec to
    install ("pip install imagecodecs"); it holds Python objects and is UnsafeInput."""
    import pickle

    def trap(*a, **k):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "loads", trap)
    path = make_replay_buffer(tmp_path / "b.zarr")
    codec = {"id": "pickle", "protocol": 5}
    _edit_array(path, "data/state", lambda z: z.update(
        {where: [codec] if where == "filters" else codec}))  # fmt: skip
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(UnsafeInput, match=r"b.zarr: an array of 'data' holds Python objects "
                       r"encoded with the 'pickle' object codec; refused"):  # fmt: skip
        import_zarr(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))

"""MDS import: round trip against ``streaming.StreamingDataset``, compressions, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from importer_fixtures import (
    STREAMING_PREFIXES,
    clean_streaming,
    import_streaming,
    make_mds,
    make_mds_json_drift,
    mds_gz_bomb,
    nothing_committed,
    run_memory_capped,
)
from treadle.catalog import Client
from treadle.errors import CorruptData, NotFound, SchemaMismatch
from treadle.importers import UnsafeInput, UnsupportedFormat
from treadle.importers import mds as import_mds
from treadle.table.tensors import to_numpy

streaming = pytest.importorskip("webdataset") and import_streaming()


@pytest.fixture
def client(local_root):
    return Client(local_root)


def _reference(folder: str):
    ds = streaming.StreamingDataset(local=folder, shuffle=False, batch_size=1)
    return [ds[i] for i in range(len(ds))]


def _column(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


@pytest.mark.parametrize("compression", [None, "zstd", "gz", "bz2", "br", "snappy"])
def test_round_trip_matches_streaming_reader(tmp_path, client, compression):
    n = 40 if compression in (None, "zstd") else 12
    folder = make_mds(tmp_path / "mds", n=n, compression=compression, size_limit=1 << 13)
    index = json.loads(Path(folder, "index.json").read_text())
    assert len(index["shards"]) > 1  # several shards
    res = import_mds(folder, client.project("p"), "t", images="decoded", progress=False)
    assert res.rows == n
    t = client.project("p").branch("main").table("t").pin()
    ref = _reference(folder)
    rows = t.to_arrow(["label", "small", "score", "name", "count", "meta", "blob"]).to_pylist()
    image, photo, raw = _column(t, "image"), _column(t, "photo"), _column(t, "raw")
    action, state = _column(t, "action"), _column(t, "state")
    assert action.shape == (n, 7) and state.shape == (n, 2, 3)
    for i, (r, g) in enumerate(zip(ref, rows)):
        assert g["label"] == r["label"]
        assert g["small"] == int(r["small"])
        assert g["score"] == float(r["score"])
        assert g["name"] == r["name"] and g["count"] == r["count"]
        assert g["meta"] == r["meta"] and g["blob"] == r["blob"]
        np.testing.assert_array_equal(action[i], r["action"])
        np.testing.assert_array_equal(state[i], r["state"])
        np.testing.assert_array_equal(image[i], np.asarray(r["image"]))  # PNG: lossless
        np.testing.assert_array_equal(raw[i], np.asarray(r["raw"]))  # PIL raw
        np.testing.assert_array_equal(photo[i], np.asarray(r["photo"]))  # same decoder (Pillow)


def test_encoded_images_keep_the_source_bytes(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=10, compression=None)
    import_mds(folder, client.project("p"), "t", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    from io import BytesIO

    from PIL import Image

    ref = _reference(folder)
    for g, r in zip(t.to_arrow(["image"]).column("image").to_pylist(), ref):
        np.testing.assert_array_equal(np.asarray(Image.open(BytesIO(g))), np.asarray(r["image"]))


def test_pkl_columns_refused_unless_allowed(tmp_path, client):
    out = tmp_path / "pk"
    with streaming.MDSWriter(out=str(out), columns={"obj": "pkl", "i": "int"}) as w:
        for i in range(3):
            w.write({"obj": {"x": i}, "i": i})
    client.project("p").create()
    with pytest.raises(UnsafeInput, match="pkl"):
        import_mds(str(out), client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))
    import_mds(str(out), client.project("p"), "t", allow_pickle=True, progress=False)
    rows = client.project("p").branch("main").table("t").to_arrow().to_pylist()
    assert [r["obj"] for r in rows] == [{"x": 0}, {"x": 1}, {"x": 2}]


def test_missing_index(tmp_path, client):
    with pytest.raises(NotFound, match="index.json"):
        import_mds(str(tmp_path), client.project("p"), "t", progress=False)


def test_shard_missing_from_disk_names_it(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression="zstd", size_limit=1 << 13)
    victim = sorted(Path(folder).glob("shard.00001.*"))[0]
    victim.unlink()
    with pytest.raises(NotFound, match="shard 1"):
        import_mds(folder, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


def test_truncated_shard(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression=None, size_limit=1 << 13)
    shard = Path(folder, "shard.00001.mds")
    shard.write_bytes(shard.read_bytes()[:-50])
    with pytest.raises(CorruptData, match="shard.00001.mds"):
        import_mds(folder, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


def test_index_pointing_past_shard_end(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression=None, size_limit=1 << 13)
    shard = Path(folder, "shard.00000.mds")
    data = bytearray(shard.read_bytes())
    n = int(np.frombuffer(data, np.uint32, 1)[0])
    offsets = np.frombuffer(data, np.uint32, n + 1, 4).copy()
    offsets[2] = len(data) + 1000  # sample 1 ends past the shard's end
    data[4 : 4 + 4 * (n + 1)] = offsets.tobytes()
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match=r"sample 1.*past the shard's end"):
        import_mds(folder, client.project("p"), "t", progress=False)


def test_unknown_encoding_and_version(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=5, compression=None)
    idx = Path(folder, "index.json")
    index = json.loads(idx.read_text())
    index["shards"][0]["column_encodings"][0] = "hdf5"
    idx.write_text(json.dumps(index))
    with pytest.raises(UnsupportedFormat, match="hdf5"):
        import_mds(folder, client.project("p"), "t", progress=False)
    index["version"] = 3
    idx.write_text(json.dumps(index))
    with pytest.raises(UnsupportedFormat, match="version"):
        import_mds(folder, client.project("p"), "t", progress=False)


def test_basename_escaping_the_root_is_refused(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=5, compression=None)
    (tmp_path / "secret.mds").write_bytes(b"x" * 64)
    idx = Path(folder, "index.json")
    index = json.loads(idx.read_text())
    index["shards"][0]["raw_data"]["basename"] = "../secret.mds"
    idx.write_text(json.dumps(index))
    with pytest.raises(Exception, match="escapes"):
        import_mds(folder, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


def test_columns_differing_across_shards(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression=None, size_limit=1 << 13)
    idx = Path(folder, "index.json")
    index = json.loads(idx.read_text())
    index["shards"][1]["column_names"][0] = "other"
    idx.write_text(json.dumps(index))
    with pytest.raises(SchemaMismatch, match="shard 1"):
        import_mds(folder, client.project("p"), "t", progress=False)


# -- faithful values ------------------------------------------------------------------------------


@pytest.mark.parametrize("drift", ["float", "key", "null"])
def test_json_drift_after_the_first_chunk_is_refused_naming_sample_and_field(
    tmp_path, client, drift
):
    folder = make_mds_json_drift(tmp_path / "m", drift)  # sample 1100 of 1200, chunks of 1024
    field = {"float": "meta.score", "key": "meta.late", "null": "meta.note"}[drift]
    with pytest.raises(SchemaMismatch, match=rf"sample 1100\b.*{field}.*json_as='text'"):
        import_mds(folder, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))
    import_mds(folder, client.project("p"), "t", json_as="text", progress=False)
    got = client.project("p").branch("main").table("t").to_arrow(["meta"]).column("meta")
    assert [json.loads(v) for v in got.to_pylist()] == [r["meta"] for r in _reference(folder)]


def test_str_int_beyond_int64_is_a_named_error(tmp_path, client):
    out = tmp_path / "big"
    with streaming.MDSWriter(out=str(out), columns={"count": "str_int"}) as w:
        for v in (1, 2**70, 3):
            w.write({"count": v})
    with pytest.raises(SchemaMismatch, match=r"sample 1\b.*'count'.*int64"):
        import_mds(str(out), client.project("p"), "t", progress=False)


# -- import ids -----------------------------------------------------------------------------------


def test_import_id_covers_table_and_content(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=10, compression=None)
    p = client.project("p")
    a = import_mds(folder, p, "a", progress=False)
    assert not import_mds(folder, p, "b", progress=False).skipped  # same shards, another table
    shard = Path(folder, "shard.00000.mds")
    data = shard.read_bytes()
    shard.write_bytes(data.replace(b"item-7", b"item-X"))  # same size
    fixed = import_mds(folder, p, "a", progress=False)
    assert not fixed.skipped and fixed.rows == 10 and fixed.commit.id != a.commit.id
    names = p.branch("main").table("a").to_arrow(["name"]).column("name").to_pylist()
    assert names.count("item-X") == 1
    assert import_mds(folder, p, "a", progress=False).commit.id == fixed.commit.id


# -- hostile input: bounded memory ----------------------------------------------------------------


@pytest.mark.slow  # a memory-capped subprocess
def test_index_declaring_a_trillion_samples(tmp_path, local_root):
    folder = make_mds(tmp_path / "mds", n=5, compression=None)
    idx = Path(folder, "index.json")
    index = json.loads(idx.read_text())
    index["shards"][0]["samples"] = 10**12
    idx.write_text(json.dumps(index))
    call = f"td.importers.mds({folder!r}, client.project('p'), 't', progress=False)"
    out = run_memory_capped(call, local_root, tmp_path, timeout=300)  # a hang guard
    assert out["error"] == "CorruptData", out
    assert "1,000,000,000,000 samples" in out["message"] and "index.json shard 0" in out["message"]
    idx.write_text(idx.read_text().replace("1000000000000", "1e12"))  # a float: not a count
    with pytest.raises(CorruptData, match="samples must be an integer"):
        import_mds(folder, Client(local_root).project("p"), "t", progress=False)


@pytest.mark.slow  # a memory-capped subprocess
def test_gz_shard_bomb_stops_under_a_memory_cap(tmp_path, local_root):
    from treadle.importers.mds import MAX_SHARD_BYTES

    assert MAX_SHARD_BYTES == 1 << 30  # as documented
    # just past the default cap, as index.json says: refused before anything is inflated
    honest = mds_gz_bomb(tmp_path / "honest", MAX_SHARD_BYTES + 16)
    # the same shard under an index that says 1 MiB: never inflated past what it says
    liar = shutil.copytree(honest, tmp_path / "liar")
    index = json.loads(Path(liar, "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] = 1 << 20
    Path(liar, "index.json").write_text(json.dumps(index))
    for folder, error, words in [
        (honest, "UnsafeInput", "max_shard_bytes"),
        (str(liar), "CorruptData", "inflates to more than the 1,048,576 bytes"),
    ]:
        call = f"td.importers.mds({folder!r}, client.project('p'), 't', progress=False)"
        out = run_memory_capped(call, local_root, tmp_path)
        assert out["error"] == error and words in out["message"], out
        assert "shard.00000.mds.gz" in out["message"] and out["rss_growth"] < 256 << 20, out
    # a lower cap, through the option
    folder = mds_gz_bomb(tmp_path / "small", 64 << 20)
    with pytest.raises(UnsafeInput, match=r"shard\.00000\.mds\.gz.*max_shard_bytes"):
        import_mds(folder, Client(local_root).project("p"), "t", max_shard_bytes=32 << 20)


@pytest.mark.slow  # a memory-capped subprocess
def test_decoded_images_are_decoded_a_budget_at_a_time(tmp_path, local_root):
    """120 black 2000x2000 PNGs (a few KB each, 12 MB each decoded) in one shard were decoded
    a 1,024-sample chunk at a time: 1.4 GB of pixels at once (a MemoryError under the cap).
    Chunks are now cut by decoded bytes (read from each image's header) and at most
    ``IN_FLIGHT_BYTES`` of them decode at once; the pixels stored are the same."""
    from PIL import Image

    folder = tmp_path / "black"
    with streaming.MDSWriter(out=str(folder), columns={"img": "png", "i": "int"}) as w:
        for i in range(120):
            w.write({"img": Image.new("RGB", (2000, 2000)), "i": i})
    assert sum(f.stat().st_size for f in folder.iterdir()) < 4 << 20
    call = ("import treadle.importers.mds as m; m.IN_FLIGHT_BYTES = 48 << 20; "
            f"td.importers.mds({str(folder)!r}, client.project('p'), 't', "
            "images='decoded', progress=False)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=1 << 30)
    assert out["error"] is None, out
    assert out["rss_growth"] < 768 << 20, out
    t = Client(local_root).project("p").branch("main").table("t").pin()
    assert t.to_arrow(["i"]).column("i").to_pylist() == list(range(120))
    last = _column(t, "img")[-1]
    assert last.shape == (2000, 2000, 3) and not last.any()


def test_a_streaming_datasets_leftovers_are_removed(tmp_path):
    """A ``StreamingDataset`` leaves ``/tmp/<prefix>_cache_filelock`` (and the barrier's) and,
    where its process ends unclean, its shared memory in /dev/shm: every module's teardown
    (conftest) removes those of the prefixes this process made, and nobody else's."""
    import tempfile

    folder = make_mds(tmp_path / "mds", n=6, size_limit=1 << 13)
    ds = streaming.StreamingDataset(local=folder, shuffle=False, batch_size=1)
    assert len(list(ds)) == 6
    prefix = f"{ds._shm_prefix_int:06}_"
    assert ds._shm_prefix_int in STREAMING_PREFIXES

    def left() -> list[Path]:
        places = (Path("/dev/shm"), Path(tempfile.gettempdir()))
        return sorted(p for d in places for p in d.glob(prefix + "*"))

    made = left()
    assert Path(tempfile.gettempdir(), prefix + "cache_filelock") in made
    assert Path("/dev/shm", prefix + "locals") in made  # its shared memory, while it lives
    assert set(made) <= set(map(Path, clean_streaming()))  # with the module's earlier ones
    assert left() == [] and STREAMING_PREFIXES == []

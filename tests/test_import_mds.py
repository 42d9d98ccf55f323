"""MDS import: round trip against ``streaming.StreamingDataset``, compressions, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from importer_fixtures import import_streaming, make_mds
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
    assert client.project("p").branch("main").tables() == []
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
    assert client.project("p").branch("main").tables() == []


def test_truncated_shard(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression=None, size_limit=1 << 13)
    shard = Path(folder, "shard.00001.mds")
    shard.write_bytes(shard.read_bytes()[:-50])
    with pytest.raises(CorruptData, match="shard.00001.mds"):
        import_mds(folder, client.project("p"), "t", progress=False)
    assert client.project("p").branch("main").tables() == []


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
    assert client.project("p").branch("main").tables() == []


def test_columns_differing_across_shards(tmp_path, client):
    folder = make_mds(tmp_path / "mds", n=30, compression=None, size_limit=1 << 13)
    idx = Path(folder, "index.json")
    index = json.loads(idx.read_text())
    index["shards"][1]["column_names"][0] = "other"
    idx.write_text(json.dumps(index))
    with pytest.raises(SchemaMismatch, match="shard 1"):
        import_mds(folder, client.project("p"), "t", progress=False)

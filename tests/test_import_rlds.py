"""RLDS import against what TFDS's own reader returned for the same shards.

The fixtures under ``tests/fixtures/rlds/`` were written by TFDS's own builder
(``make_fixtures.py``, which needs TensorFlow and is not run here), together with the values
``builder_from_directory(...).as_dataset(split, shuffle_files=False,
read_config=ReadConfig(interleave_cycle_length=1))`` returned and TF's accurate-IDCT decode of
each JPEG. Every step feature, episode metadata value, episode name and order, encoded image
byte and decoded pixel the import stores is compared with those, on a local root and on S3.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import shutil
import struct
import sys
import zlib
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pytest

from importer_fixtures import nothing_committed, run_memory_capped
from treadle import importers
from treadle.catalog import Client
from treadle.cli import main as cli_main
from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput, UnsupportedFormat
from treadle.importers.images import decode_image
from treadle.importers.rlds.example_proto import example_class
from treadle.importers.rlds.tfrecord import frame_record, iter_records, masked_crc32c
from treadle.table.tensors import to_numpy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rlds"
BRIDGE = FIXTURES / "bridge_like" / "1.0.0"
FRACTAL = FIXTURES / "fractal_like" / "1.0.0"
LAYOUTS = [("bridge_like", "train"), ("bridge_like", "val"), ("fractal_like", "train")]


def expected(name: str, split: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}.{split}.expected.npz") as z:
        return {k: z[k] for k in z.files}


def _items(want: dict, key: str) -> list[bytes]:
    data, offsets = want[key + ".data"].tobytes(), want[key + ".offsets"]
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _episode_features(want: dict, e: int) -> list[str]:
    keys = {k.split(".")[0] for k in want if k.startswith(f"{e}/")}
    return sorted(k.split("/", 1)[1] for k in keys)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One local root; each layout imported once per images mode (shared by the tests)."""
    root = str(tmp_path_factory.mktemp("rlds_store"))
    client = Client(root, create=True)
    for name, split in LAYOUTS:
        src = FIXTURES / name / "1.0.0"
        for images in ("encoded", "decoded"):
            importers.rlds(src, client.project("p"), f"{name}_{split}_{images}", split=split,
                           images=images, fps=5, progress=False)  # fmt: skip
    return client


def _table(client, table):
    return client.project("p").branch("main").table(table).pin()


def _column(t, col):
    """A column as TFDS hands it: numpy for numbers and tensors, a list for text and bytes."""
    arr = t.to_arrow([col]).column(col)
    field = t.schema.field(col)
    if pa.types.is_string(field.type) or pa.types.is_large_binary(field.type):
        return arr.to_pylist()
    return to_numpy(arr, field)


def check_table(t, want: dict, images: str) -> None:
    """Every value of every step (and episode) equals TFDS's, in TFDS's order."""
    n = int(want["episodes"])
    eps = t.episodes()
    assert list(eps.names) == [f"episode_{i:06d}" for i in range(n)]
    cache: dict[str, object] = {}
    for e in range(n):
        for path in _episode_features(want, e):
            kind, feature = path.split("/", 1)
            col = feature.replace("/", "_") if kind == "steps" else path.replace("/", "_")
            if col not in cache:
                cache[col] = _column(t, col)
            got = _slice(cache[col], eps, e)
            key = f"{e}/{path}"
            if key + ".pixels" in want:
                _check_image(got, want, key, images)
            elif key + ".data" in want:  # Text (str, UTF-8 exact) or a string Tensor (bytes)
                items = _items(want, key)
                if t.schema.field(col).type == pa.string():
                    items = [b.decode("utf-8") for b in items]
                else:
                    assert t.schema.field(col).type == pa.large_binary()
                assert list(got) == items * (len(got) if kind != "steps" else 1)
            else:
                value = want[key]
                if kind != "steps":  # one value per episode, on each of its steps
                    value = np.broadcast_to(value, (len(got), *value.shape))
                assert got.dtype == value.dtype, (key, got.dtype, value.dtype)
                np.testing.assert_array_equal(got, value, err_msg=key)


def _slice(value, eps, e):
    start = int(np.sum(eps.lengths[:e]))
    return value[start : start + int(eps.lengths[e])]


def _check_image(got, want, key, images):
    pixels = want[key + ".pixels"]
    if images == "decoded":
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, pixels, err_msg=key)
        return
    stored = list(got)
    assert stored == _items(want, key)  # the source bytes, unchanged
    decoded = np.stack([decode_image(b, "jpeg", key) for b in stored])
    np.testing.assert_array_equal(decoded, pixels, err_msg=key)  # Pillow == TF accurate IDCT


@pytest.mark.parametrize("images", ["encoded", "decoded"])
@pytest.mark.parametrize("name,split", LAYOUTS)
def test_values_equal_tfds_reader(store, name, split, images):
    t = _table(store, f"{name}_{split}_{images}")
    check_table(t, expected(name, split), images)
    assert t.fps == 5


def test_tf_default_decode_differs_from_accurate():
    """What docs/from-rlds.md says: TFDS's own pixels (TF's fast IDCT) are not Pillow's."""
    want = expected("bridge_like", "train")
    worst = max(int(v) for k, v in want.items() if k.endswith("tf_default_max_diff"))
    share = [float(v) for k, v in want.items() if k.endswith("tf_default_share_differing")]
    assert worst > 0 and min(share) > 0.3


def stored_frames(client, t, column: str, episode: str) -> np.ndarray:
    """Decode the H.264 stream stored for one episode's video column (display order)."""
    rows = t.to_arrow(["episode", column]).to_pylist()
    idx = [r[column] for r in rows if r["episode"] == episode]
    keys = {r["stream"] for r in idx}
    assert len(keys) == 1
    data = client.store.get(f"{t.project.prefix}/{keys.pop()}")
    ctx = av.CodecContext.create("h264", "r")
    frames = []
    for r in sorted(idx, key=lambda r: r["decode"]):
        frames.extend(ctx.decode(av.Packet(data[r["offset"] : r["offset"] + r["size"]])))
    frames.extend(ctx.decode(None))
    return np.stack([f.to_ndarray(format="rgb24") for f in frames])


def test_video_reaches_the_psnr_floor_and_reports_it(local_root):
    client = Client(local_root)
    res = importers.rlds(BRIDGE, client.project("p"), "t", fps=10, progress=False)
    want = expected("bridge_like", "train")
    t = _table(client, "t")
    assert sorted(t.video_columns) == ["observation_image", "observation_wrist_image"]
    assert t.fps == 10
    for cam in ("image", "wrist_image"):
        psnrs = []
        for e in range(int(want["episodes"])):
            got = stored_frames(client, t, f"observation_{cam}", f"episode_{e:06d}")
            ref = want[f"{e}/steps/observation/{cam}.pixels"].astype(np.float64)
            mse = ((got.astype(np.float64) - ref) ** 2).reshape(len(ref), -1).mean(axis=1)
            psnrs += list(10 * np.log10(255.0**2 / mse))
        assert np.mean(psnrs) >= 30.0, cam
        report = next(c for c in res.cameras if c["column"] == f"observation_{cam}")
        assert report["stored_as"] == "video" and report["psnr_min_db"] <= report["psnr_mean_db"]
        assert abs(report["psnr_mean_db"] - np.mean(psnrs)) < 1.0
        assert report["source_bytes"] == sum(
            len(b) for e in range(int(want["episodes"]))
            for b in _items(want, f"{e}/steps/observation/{cam}")
        )  # fmt: skip
        assert 0 < report["stored_bytes"] < report["source_bytes"]
    check_rest = {k: v for k, v in want.items() if "image" not in k}
    check_table(t, check_rest, "video")


def test_video_needs_fps(local_root):
    client = Client(local_root)
    with pytest.raises(ValueError, match="fps"):
        importers.rlds(BRIDGE, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


@pytest.mark.s3
def test_from_and_into_s3_equals_local(store, s3_server, s3_root, tmp_path):
    from treadle.storage import Store

    opts = s3_server.storage_options()
    src = s3_server.url(f"src-rlds-{tmp_path.name}")
    up = Store.open(src, opts)
    for p in sorted(BRIDGE.iterdir()):
        up.put(p.name, p.read_bytes())
    root, root_opts = s3_root
    client = Client(root, root_opts)
    res = importers.rlds(src, client.project("p"), "t", images="encoded", fps=5,
                         source_options=opts, progress=False)  # fmt: skip
    got = client.project("p").branch("main").table("t").pin()
    assert res.episodes == 7
    assert got.to_arrow().equals(_table(store, "bridge_like_train_encoded").to_arrow())


def test_rename_and_rerun(local_root):
    client = Client(local_root)
    kw = {"images": "encoded", "progress": False, "rename": {"observation/image": "image_primary",
          "observation_base_pose_tool_reached": "proprio"}}  # fmt: skip
    first = importers.rlds(FRACTAL, client.project("p"), "t", **kw)
    again = importers.rlds(FRACTAL, client.project("p"), "t", **kw)
    assert again.skipped and again.commit.id == first.commit.id
    t = _table(client, "t")
    assert {"image_primary", "proprio"} <= set(t.schema.names)
    assert "observation_image" not in t.schema.names
    assert "action_world_vector" in t.schema.names  # fractal's nested action dict
    with pytest.raises(NotFound, match="observation_state"):
        importers.rlds(FRACTAL, client.project("p"), "t2", images="encoded", progress=False,
                       rename={"observation_state": "proprio"})  # fmt: skip


def test_two_features_onto_one_column_are_refused(tmp_path):
    _refused(tmp_path, BRIDGE, SchemaMismatch, "'steps/discount' and 'steps/reward' would both",
             rename={"reward": "discount"})  # fmt: skip


def test_cli(local_root, capsys):
    rc = cli_main(["import", "rlds", str(BRIDGE), "--project", "p", "--table", "t", "--split",
                   "val", "--fps", "15", "--root", local_root, "--no-progress"])  # fmt: skip
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["episodes"] == 3 and out["rows"] > 3
    assert {c["column"] for c in out["cameras"]} == {"observation_image", "observation_wrist_image"}
    assert all(c["psnr_mean_db"] >= 30 for c in out["cameras"])
    rc = cli_main(["import", "rlds", str(BRIDGE), "--project", "p", "--table", "t2",
                   "--root", local_root, "--no-progress"])  # fmt: skip
    assert rc == 2 and "needs --fps" in capsys.readouterr().err
    rc = cli_main(["import", "rlds", str(BRIDGE), "--project", "p", "--table", "t3", "--images",
                   "encoded", "--pixels", "tfds", "--root", local_root])  # fmt: skip
    assert rc == 2 and "--pixels tfds decodes for" in capsys.readouterr().err


# -- bad input: each a named error, nothing committed -----------------------------------------


def _copy(tmp_path, src=BRIDGE) -> Path:
    dst = tmp_path / "src" / src.parent.name / "1.0.0"
    shutil.copytree(src, dst)
    return dst


def _shard(folder: Path, i: int = 1) -> Path:
    return folder / f"bridge_like-train.tfrecord-{i:05d}-of-00003"


def _refused(tmp_path, folder, error, match, **kw):
    client = Client(str(tmp_path / "store"), create=True)
    kw = {"images": "encoded", "progress": False, **kw}
    with pytest.raises(error, match=match):
        importers.rlds(folder, client.project("p"), "t", **kw)
    assert nothing_committed(client.project("p"))


def test_missing_split(tmp_path):
    _refused(tmp_path, BRIDGE, NotFound, r"no split 'test'.*\['train', 'val'\]", split="test")


def test_not_a_tfds_folder(tmp_path):
    _refused(tmp_path, BRIDGE.parent, UnsupportedFormat, "not a TFDS dataset version folder")


def test_unsupported_feature_type(tmp_path):
    folder = _copy(tmp_path)
    doc = json.loads((folder / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["reward"] = {
        "pythonClassName": "tensorflow_datasets.core.features.audio_feature.Audio",
        "audio": {},
    }  # noqa: E501
    (folder / "features.json").write_text(json.dumps(doc))
    _refused(tmp_path, folder, UnsupportedFormat, "'reward' is a TFDS Audio")


def test_a_feature_of_no_values_per_step_is_refused(tmp_path):
    folder = _copy(tmp_path)
    doc = json.loads((folder / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["action"]["tensor"]["shape"]["dimensions"] = ["0", "7"]
    (folder / "features.json").write_text(json.dumps(doc))
    _refused(
        tmp_path,
        folder,
        UnsupportedFormat,
        r"features.json: feature 'action' has shape \[0, 7\]: no values",
    )


def test_a_shape_whose_size_overflows_int64_is_refused(tmp_path):
    # numpy's int64 product of [3, 6148914691236517206] wraps to 2: two values were taken as
    # one step's, and the reshape failed with a bare ValueError
    folder = _copy(tmp_path)
    doc = json.loads((folder / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["action"]["tensor"]["shape"]["dimensions"] = ["3", "6148914691236517206"]
    (folder / "features.json").write_text(json.dumps(doc))
    _refused(tmp_path, folder, UnsupportedFormat,
             r"feature 'action' has shape \[3, 6148914691236517206\]: "
             r"18,446,744,073,709,551,618 values an entry")  # fmt: skip


def _tiny_rlds(folder: Path, steps: int, meta: int) -> Path:
    """An RLDS folder of one episode: ``steps`` bool steps (a byte each on the wire) and an
    episode-level float32 ``[meta]`` (copied onto each step when imported)."""
    tensor = "tensorflow_datasets.core.features.tensor_feature.Tensor"

    def leaf(dtype, dims):
        shape = {"dimensions": [str(d) for d in dims]}
        return {"pythonClassName": tensor, "tensor": {"dtype": dtype, "encoding": "none",
                                                      "shape": shape}}  # fmt: skip

    features = {"featuresDict": {"features": {
        "episode_metadata": {"featuresDict": {"features": {"embedding": leaf("float32", [meta])}}},
        "steps": {"sequence": {"feature": {"featuresDict": {"features": {
            "is_first": leaf("bool", [])}}}}},
    }}}  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "features.json").write_text(json.dumps(features))
    info = {"name": "tiny", "splits": [{"name": "train", "shardLengths": ["1"]}]}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    ex = example_class()()
    ex.features.feature["steps/is_first"].int64_list.value.extend([0] * steps)
    ex.features.feature["episode_metadata/embedding"].float_list.value.extend([1.0] * meta)
    (folder / "tiny-train.tfrecord-00000-of-00001").write_bytes(
        frame_record(ex.SerializeToString())
    )
    return folder


def test_episode_level_values_copied_onto_every_step_are_bounded(tmp_path, local_root):
    """160 KB of episode metadata on 4,000 one-byte steps (a 180 KB record) became 640 MB
    of columns (2 GB at peak), whatever max_record_bytes said."""
    folder = _tiny_rlds(tmp_path / "tiny" / "1.0.0", steps=4000, meta=40_000)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 256 << 10
    call = (f"td.importers.rlds({str(folder)!r}, client.project('p'), 't', images='encoded', "
            "progress=False, max_record_bytes=16 << 20)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=384 << 20)
    assert out["error"] == "UnsafeInput", out
    assert re.search(r"record 0 \(episode 0, episode_000000\), feature 'episode_metadata/"
                     r"embedding': 160,000 bytes, on each of the episode's 4,000 steps, make "
                     r"its episode-level values over 16,777,216 bytes \(max_record_bytes\)",
                     out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20
    client = Client(str(tmp_path / "small"), create=True)  # a small episode still imports
    small = _tiny_rlds(tmp_path / "small_src" / "1.0.0", steps=5, meta=3)
    importers.rlds(small, client.project("p"), "t", images="encoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    assert _column(t, "episode_metadata_embedding").tolist() == [[1.0] * 3] * 5


def test_an_image_larger_than_declared_is_refused_from_its_header(tmp_path, local_root):
    """Every step's 32x40 JPEG replaced by a 4096x4096 PNG of zeros (50 KB, 50 MB decoded):
    decoded and stacked, whatever features.json declared."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4096, 4096)).save(buf, "PNG")
    big = buf.getvalue()
    assert len(big) < 256 << 10
    folder = _copy(tmp_path)

    def huge(ex):
        images = ex.features.feature["steps/observation/image"].bytes_list.value
        for j in range(len(images)):
            images[j] = big

    _rewrite(_shard(folder, 0), huge)
    call = (f"td.importers.rlds({str(folder)!r}, client.project('p'), 't', images='decoded', "
            "progress=False)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=192 << 20)
    assert out["error"] == "CorruptData", out
    assert re.search(r"record 0 \(episode 0, episode_000000\), feature 'steps/observation/image'"
                     r", step 0: a 4096x4096 image, features.json declares 40x32 "
                     r"\(shape \[32, 40, 3\]\)", out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20


def _records(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        return list(iter_records(f, path.stat().st_size, str(path)))


def _rewrite(path: Path, edit) -> None:
    """Each record of the shard parsed, edited by ``edit(example)`` and framed again."""
    out = b""
    for data in _records(path):
        ex = example_class()()
        ex.ParseFromString(data)
        edit(ex)
        out += frame_record(ex.SerializeToString())
    path.write_bytes(out)


def test_checksum_mismatch_names_shard_and_record(tmp_path):
    folder = _copy(tmp_path)
    shard = _shard(folder)
    first = len(_records(shard)[0]) + 16
    raw = bytearray(shard.read_bytes())
    raw[first + 12 + 40] ^= 0xFF  # a byte of the second record's data
    shard.write_bytes(bytes(raw))
    _refused(tmp_path, folder, CorruptData, rf"{shard.name}, record 1 at byte {first}: the data's")


def test_truncated_shard(tmp_path):
    folder = _copy(tmp_path)
    shard = _shard(folder, 2)
    shard.write_bytes(shard.read_bytes()[:-100])
    _refused(tmp_path, folder, CorruptData, rf"{shard.name}, record 1 .*truncated")


def test_huge_length_is_refused_before_any_allocation(tmp_path):
    folder = _copy(tmp_path)
    length = struct.pack("<Q", 1 << 60)
    _shard(folder, 0).write_bytes(length + struct.pack("<I", masked_crc32c(length)) + b"x" * 64)
    _refused(tmp_path, folder, UnsafeInput, r"record 0 at byte 0: record of 1152921504606846976")


def test_a_record_of_too_many_strings_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    # 2 bytes on the wire, ~70 in memory: a 1 GiB record of empty strings needed ~70 GiB
    example_proto = importlib.import_module("treadle.importers.rlds.example_proto")
    monkeypatch.setattr(example_proto, "MAX_BYTES_ENTRIES", 1000, raising=False)
    folder = _copy(tmp_path)
    _rewrite(_shard(folder, 0), lambda ex: ex.features.feature["steps/is_first"].bytes_list
             .value.extend([b""] * 1001))  # fmt: skip
    _refused(tmp_path, folder, UnsafeInput, r"record 0.*: over 1,000 bytes_list entries")
    real = _records(_shard(_copy(tmp_path / "real"), 0))[0]
    assert 0 < example_proto.count_bytes_entries(real, "r") <= 1000  # the fixture passes


def test_a_record_that_is_no_message_is_corrupt():
    from treadle.importers.rlds.example_proto import parse_example

    with pytest.raises(CorruptData, match=r"rec: not a tf.train.Example"):
        parse_example(b"\x0a\xff\xff\xff\x0f", "rec")  # a length past the end


def test_undeclared_feature(tmp_path):
    folder = _copy(tmp_path)
    _rewrite(
        _shard(folder), lambda ex: ex.features.feature["steps/extra"].int64_list.value.append(1)
    )
    _refused(tmp_path, folder, SchemaMismatch, "'steps/extra', which features.json does not")


def test_step_lists_of_different_lengths(tmp_path):
    folder = _copy(tmp_path)

    def drop_a_step(ex):
        values = ex.features.feature["steps/action"].float_list.value
        del values[-7:]

    _rewrite(_shard(folder), drop_a_step)
    _refused(tmp_path, folder, CorruptData, r"record 0 \(episode 2, episode_000002\): step lists")


def test_shard_with_fewer_records_than_declared(tmp_path):
    folder = _copy(tmp_path)
    shard = _shard(folder)
    shard.write_bytes(frame_record(_records(shard)[0]))
    _refused(tmp_path, folder, CorruptData, "holds 1 records; dataset_info.json says 3")


def test_length_checksum_mismatch(tmp_path):
    folder = _copy(tmp_path)
    shard = _shard(folder, 0)
    raw = bytearray(shard.read_bytes())
    raw[9] ^= 0x01  # the length's own checksum
    shard.write_bytes(bytes(raw))
    _refused(tmp_path, folder, CorruptData, r"record 0 at byte 0: the length's checksum")


def test_without_the_extra_it_says_how_to_install(tmp_path, monkeypatch):
    from treadle.errors import MissingDependency
    from treadle.importers.rlds import example_proto

    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    _refused(tmp_path, BRIDGE, MissingDependency, r"google-crc32c.*pip install 'treadle\[rlds\]'")
    monkeypatch.undo()
    example_proto.example_class.cache_clear()
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    try:
        _refused(tmp_path, BRIDGE, MissingDependency, r"'protobuf'.*treadle\[rlds\]")
    finally:
        monkeypatch.undo()
        example_proto.example_class.cache_clear()


def test_shard_template_cannot_leave_the_folder(tmp_path):
    from treadle.errors import InvalidName

    folder = _copy(tmp_path)
    info = json.loads((folder / "dataset_info.json").read_text())
    info["splits"][0]["filepathTemplate"] = "../../{SPLIT}-{SHARD_X_OF_Y}"
    (folder / "dataset_info.json").write_text(json.dumps(info))
    _refused(tmp_path, folder, InvalidName, "escapes the source root")


def _as_16_bit(tmp_path) -> Path:
    """The bridge fixture, its main camera declared 16-bit (as a depth camera would be)."""
    folder = _copy(tmp_path)
    doc = json.loads((folder / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["observation"]["featuresDict"]["features"]["image"]["image"]["dtype"] = (
        "uint16"
    )
    (folder / "features.json").write_text(json.dumps(doc))
    return folder


def test_decoded_refuses_16_bit_images(tmp_path):
    folder = _as_16_bit(tmp_path)
    _refused(tmp_path, folder, UnsupportedFormat, "is uint16; images='decoded'", images="decoded")


def test_video_keeps_other_than_8_bit_colour_encoded_and_says_why(tmp_path, local_root):
    client = Client(local_root)
    res = importers.rlds(_as_16_bit(tmp_path), client.project("p"), "t", fps=5, progress=False)
    kept, video = res.cameras
    assert kept["column"] == "observation_image" and kept["stored_as"] == "encoded"
    assert "kept as encoded images" in kept["why"] and kept["psnr_mean_db"] is None
    assert kept["stored_bytes"] == kept["source_bytes"]
    assert video["stored_as"] == "video"
    t = _table(client, "t")
    assert t.video_columns == ["observation_wrist_image"]
    assert pa.types.is_large_binary(t.schema.field("observation_image").type)


def test_an_episode_without_steps_is_skipped_and_named(tmp_path, local_root):
    folder = _copy(tmp_path)

    def empty_first(ex, seen=[]):  # noqa: B006 - counts the records of this one shard
        seen.append(1)
        if len(seen) == 1:
            for key, feature in ex.features.feature.items():
                if key.startswith("steps/"):
                    kind = feature.WhichOneof("kind")
                    del getattr(feature, kind).value[:]

    _rewrite(_shard(folder, 0), empty_first)
    client = Client(local_root)
    with pytest.warns(UserWarning, match="episode_000000 has no steps; skipped"):
        res = importers.rlds(folder, client.project("p"), "t", images="encoded", progress=False)
    assert res.episodes == 6
    assert _table(client, "t").episodes().names[0] == "episode_000001"


def test_pixels_tfds_equal_tfds_own_decode(local_root):
    """pixels="tfds": every decoded pixel equals TF's default (fast IDCT) decode, as TFDS's."""
    client = Client(local_root)
    want = expected("fractal_like", "train")
    importers.rlds(FRACTAL, client.project("p"), "t", images="decoded", pixels="tfds",
                   progress=False)  # fmt: skip
    got = _column(_table(client, "t"), "observation_image")
    fast = np.concatenate([want[f"{e}/steps/observation/image.tf_default"] for e in range(5)])
    accurate = np.concatenate([want[f"{e}/steps/observation/image.pixels"] for e in range(5)])
    assert not np.array_equal(fast, accurate)  # so the test can tell the two apart
    np.testing.assert_array_equal(got, fast)
    with pytest.raises(ValueError, match="pixels must be"):
        importers.rlds(FRACTAL, client.project("p"), "t2", images="encoded", pixels="tfds")


def test_episode_metadata_with_two_values_is_refused(tmp_path):
    folder = _copy(tmp_path)

    def two_paths(ex):
        ex.features.feature["episode_metadata/file_path"].bytes_list.value.append(b"/other")

    _rewrite(_shard(folder, 2), two_paths)
    _refused(tmp_path, folder, CorruptData, r"'episode_metadata/file_path': 2 values, expected 1")


@pytest.mark.parametrize(
    "entry,match",
    [
        (b"not zlib", "not zlib data"),
        (zlib.compress(bytes(10**7)), "81 bytes, 80 expected"),
    ],
)
def test_zlib_tensor_entries_are_checked_and_bounded(tmp_path, entry, match):
    """encoding='zlib': an entry is inflated no further than its shape needs (4x5 float32)."""
    folder = _copy(tmp_path, FRACTAL)

    def bad_depth(ex):
        ex.features.feature["steps/observation/depth"].bytes_list.value[0] = entry

    _rewrite(folder / "fractal_like-train.tfrecord-00000-of-00002", bad_depth)
    _refused(tmp_path, folder, CorruptData, rf"'steps/observation/depth', entry 0: {match}")


@pytest.mark.parametrize("workers", [0, 2])
def test_encoded_cameras_train_through_the_loader(store, workers):
    """`images="encoded"` keeps TFDS's JPEGs and the loader decodes them (`td.Video` over an
    image column): every moment's frames, from an EvalLoader pass, equal TF's accurate decode
    of the source (which is Pillow's)."""
    import treadle as td

    want = expected("bridge_like", "train")
    t = _table(store, "bridge_like_train_encoded")
    cams = {"observation_image": "steps/observation/image",
            "observation_wrist_image": "steps/observation/wrist_image"}  # fmt: skip
    windows = td.Windows({c: td.Video([0]) for c in cams})
    loader = td.EvalLoader(td.Component(t, windows), 8, workers=workers)
    seen = 0
    for batch in loader:
        for i in np.flatnonzero(batch["_valid"].numpy()):
            e, f = int(batch["_episode"][i]), int(batch["_frame"][i])
            for col, path in cams.items():
                pixels = want[f"{e}/{path}.pixels"][f]
                np.testing.assert_array_equal(batch[col][i, 0].numpy(), pixels)
            seen += 1
    assert seen == t.num_moments

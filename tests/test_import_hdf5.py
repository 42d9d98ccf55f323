"""HDF5 import (robomimic, LIBERO, ALOHA): files written by h5py, values read back by h5py."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from importer_fixtures import nothing_committed, run_memory_capped
from robot_fixtures import (
    ALOHA_CAMERAS,
    make_aloha,
    make_aloha_compressed,
    make_libero,
    make_robomimic,
)
from treadle.catalog import Client
from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput
from treadle.importers import hdf5 as import_hdf5
from treadle.table.tensors import to_numpy

h5py = pytest.importorskip("h5py")


@pytest.fixture(scope="module")
def robomimic(tmp_path_factory):
    return make_robomimic(tmp_path_factory.mktemp("rm") / "lift_ph.hdf5")


@pytest.fixture(scope="module")
def libero(tmp_path_factory):
    return make_libero(tmp_path_factory.mktemp("libero") / "suite")


def _column(t, name):
    return to_numpy(t.to_arrow([name]).column(name), t.schema.field(name))


def _episode_rows(t, episode):
    eps = t.episodes()
    i = list(eps.names).index(episode)
    return int(eps.starts[i]), int(eps.starts[i] + eps.lengths[i])


@pytest.fixture(scope="module")
def decoded(robomimic, tmp_path_factory):
    client = Client(str(tmp_path_factory.mktemp("store")))
    res = import_hdf5(str(robomimic), client.project("p"), "t", images="decoded", progress=False)
    return client, res, client.project("p").branch("main").table("t").pin()


def test_robomimic_demos_in_numeric_order_with_every_value(robomimic, decoded):
    _, res, t = decoded
    assert list(t.episodes().names) == [
        f"demo_{i}" for i in range(12)
    ]  # not demo_0, demo_1, demo_10
    assert res.episodes == 12 and res.rows == t.num_moments and res.cameras == [
        {"column": "obs_agentview_image", "stored_as": "decoded", "episodes": 12,
         "source_bytes": 72 * 32 * 32 * 3, "stored_bytes": 72 * 32 * 32 * 3,
         "psnr_mean_db": None, "psnr_min_db": None}]  # fmt: skip
    assert "next_obs_agentview_image" not in t.schema.names
    with h5py.File(robomimic, "r") as f:
        assert res.rows == f["data"].attrs["total"]
        for col, path in [
            ("actions", "actions"),
            ("rewards", "rewards"),
            ("dones", "dones"),
            ("states", "states"),
            ("obs_robot0_eef_pos", "obs/robot0_eef_pos"),
            ("obs_object", "obs/object"),
            ("obs_agentview_image", "obs/agentview_image"),
        ]:
            got = _column(t, col)
            for i in (0, 2, 10, 11):
                a, b = _episode_rows(t, f"demo_{i}")
                want = f[f"data/demo_{i}/{path}"][()]
                assert got.dtype == want.dtype, col
                np.testing.assert_array_equal(got[a:b], want, err_msg=col)


def test_robomimic_metadata_and_filter_keys(robomimic, decoded):
    _, _, t = decoded
    ep_meta = t.to_arrow(["ep_meta"]).column(0).to_pylist()
    a, b = _episode_rows(t, "demo_7")
    assert {json.loads(m)["lang"] for m in ep_meta[a:b]} == {"task 7"}  # RoboCasa's ep_meta
    assert json.loads(t.metadata["env_args"])["env_kwargs"]["control_freq"] == 20
    assert t.metadata["total"] == t.num_moments
    sets = t.episode_sets()
    with h5py.File(robomimic, "r") as f:
        assert sets["train"] == [b.decode() for b in f["mask/train"][()]]
        assert sets["valid"] == ["demo_10", "demo_11"]
    assert t.fps == 20  # env_args control_freq


def test_metadata_outlives_later_commits_and_sets_drop_deleted_episodes(tmp_path):
    src = make_robomimic(tmp_path / "a.hdf5", [3, 4, 2], images=False)
    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(src), client.project("p"), "t", progress=False)
    tref = client.project("p").branch("main").table("t")
    tref.delete_episodes(["demo_0"])
    assert tref.episode_sets() == {"train": [], "valid": ["demo_1", "demo_2"]}
    assert json.loads(tref.metadata["env_args"])["env_name"] == "Lift"


def test_rerun_is_a_no_op(robomimic, decoded):
    client, res, _ = decoded
    again = import_hdf5(str(robomimic), client.project("p"), "t", images="decoded", progress=False)
    assert again.skipped and again.commit.id == res.commit.id


def test_next_obs_when_asked(tmp_path):
    src = make_robomimic(tmp_path / "a.hdf5", [3, 4], images=False)
    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(src), client.project("p"), "t", next_obs=True, progress=False)
    t = client.project("p").branch("main").table("t").pin()
    with h5py.File(src, "r") as f:
        want = np.concatenate([f[f"data/demo_{i}/next_obs/object"][()] for i in range(2)])
    np.testing.assert_array_equal(_column(t, "next_obs_object"), want)


def test_cameras_encoded_as_lossless_png(robomimic, tmp_path):
    from PIL import Image

    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(robomimic), client.project("p"), "t", images="encoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    pngs = t.to_arrow(["obs_agentview_image"]).column(0).to_pylist()
    a, b = _episode_rows(t, "demo_3")
    with h5py.File(robomimic, "r") as f:
        want = f["data/demo_3/obs/agentview_image"][()]
    got = np.stack([np.asarray(Image.open(io.BytesIO(p))) for p in pngs[a:b]])
    np.testing.assert_array_equal(got, want)


def test_libero_folder_video_with_psnr_tasks_and_metadata(libero, tmp_path):
    client = Client(str(tmp_path / "store"), create=True)
    res = import_hdf5(str(libero), client.project("p"), "t", fps=20, progress=False)
    t = client.project("p").branch("main").table("t").pin()
    stems = ["open_the_drawer_demo", "pick_up_the_bowl_demo"]  # files in name order
    assert list(t.episodes().names) == [f"{s}__demo_{d}" for s in stems for d in (0, 1)]
    assert t.video_columns == ["obs_agentview_rgb"]
    (cam,) = res.cameras
    assert cam["column"] == "obs_agentview_rgb" and cam["stored_as"] == "video"
    assert cam["episodes"] == 4 and 25 < cam["psnr_mean_db"] < 99 and cam["psnr_min_db"] > 20
    assert 0 < cam["stored_bytes"] < cam["source_bytes"]  # raw frames in, H.264 out
    tasks = t.to_arrow(["task"]).column(0).to_pylist()
    a, b = _episode_rows(t, "pick_up_the_bowl_demo__demo_1")
    assert set(tasks[a:b]) == {"pick up the bowl"}
    info = json.loads(t.metadata["open_the_drawer_demo"]["problem_info"])
    assert info["language_instruction"] == "open the drawer"
    with h5py.File(libero / "open_the_drawer_demo.hdf5", "r") as f:
        want = f["data/demo_1/obs/joint_states"][()]
    a, b = _episode_rows(t, "open_the_drawer_demo__demo_1")
    np.testing.assert_array_equal(_column(t, "obs_joint_states")[a:b], want)


def test_folder_of_robomimic_files_remaps_filter_keys(tmp_path):
    make_robomimic(tmp_path / "src" / "b_mh.hdf5", [2, 3, 2], images=False)
    make_robomimic(tmp_path / "src" / "a_ph.hdf5", [2, 2, 3], images=False)
    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(tmp_path / "src"), client.project("p"), "t", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    assert list(t.episodes().names)[:4] == [
        "a_ph__demo_0",
        "a_ph__demo_1",
        "a_ph__demo_2",
        "b_mh__demo_0",
    ]
    assert t.episode_sets() == {
        "train": ["a_ph__demo_0", "b_mh__demo_0"],
        "valid": ["a_ph__demo_1", "a_ph__demo_2", "b_mh__demo_1", "b_mh__demo_2"],
    }
    assert set(t.metadata) == {"a_ph", "b_mh"} and t.metadata["b_mh"]["total"] == 7


def test_aloha_files_are_episodes(tmp_path):
    src = make_aloha(tmp_path / "aloha")
    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(src), client.project("p"), "t", images="decoded", fps=50, progress=False)
    t = client.project("p").branch("main").table("t").pin()
    assert list(t.episodes().names) == ["episode_0", "episode_1"]
    assert t.metadata["episode_1"] == {"sim": True}
    with h5py.File(src / "episode_1.hdf5", "r") as f:
        a, b = _episode_rows(t, "episode_1")
        np.testing.assert_array_equal(
            _column(t, "observations_qpos")[a:b], f["observations/qpos"][()]
        )
        np.testing.assert_array_equal(_column(t, "action")[a:b], f["action"][()])
        np.testing.assert_array_equal(
            _column(t, "observations_images_top")[a:b], f["observations/images/top"][()]
        )


@pytest.fixture(scope="module")
def aloha_jpeg(tmp_path_factory):
    pytest.importorskip("cv2")  # ALOHA's recorder encodes with OpenCV (requirements/peers.txt)
    return make_aloha_compressed(tmp_path_factory.mktemp("aloha_jpeg") / "episode_3.hdf5")


def _recorded_jpegs(path):
    """Per camera, the JPEG bytes as ALOHA's reader cuts them (row k of compress_len is
    the recorder's k-th camera)."""
    with h5py.File(path, "r") as f:
        lengths = f["compress_len"][()].astype(int)
        return {
            cam: [f[f"observations/images/{cam}"][i, :n].tobytes() for i, n in enumerate(lengths[k])]
            for k, cam in enumerate(ALOHA_CAMERAS)
        }  # fmt: skip


def test_aloha_compressed_jpegs_kept_as_stored(aloha_jpeg, tmp_path):
    client = Client(str(tmp_path / "store"), create=True)
    res = import_hdf5(str(aloha_jpeg), client.project("p"), "t", images="encoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    assert list(t.episodes().names) == ["episode_3"] and "compress_len" not in t.schema.names
    assert t.metadata == {"sim": False, "compress": True}
    for cam, jpegs in _recorded_jpegs(aloha_jpeg).items():
        col = f"observations_images_{cam}"
        assert t.to_arrow([col]).column(0).to_pylist() == jpegs  # the bytes as stored
        row = next(r for r in res.cameras if r["column"] == col)
        assert row["stored_bytes"] == row["source_bytes"] == sum(map(len, jpegs))
    with h5py.File(aloha_jpeg, "r") as f:
        np.testing.assert_array_equal(_column(t, "observations_qpos"), f["observations/qpos"][()])


def test_aloha_compressed_decoded_as_lerobot_and_pillow_do(aloha_jpeg, tmp_path):
    import cv2
    from PIL import Image

    _, t = _import_one(aloha_jpeg, tmp_path, images="decoded")
    for cam, jpegs in _recorded_jpegs(aloha_jpeg).items():
        got = _column(t, f"observations_images_{cam}")
        assert got.shape == (6, 24, 40, 3)
        for frame, b in zip(got, jpegs):
            bgr = cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)
            np.testing.assert_array_equal(frame, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            np.testing.assert_array_equal(
                frame, np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
            )
    res, t = _import_one(aloha_jpeg, tmp_path / "v", images="video", fps=50)
    assert len(t.video_columns) == 3 and all(r["psnr_min_db"] > 25 for r in res.cameras)


def _import_one(path, tmp_path, **kw):
    client = Client(str(tmp_path / "store"), create=True)
    res = import_hdf5(str(path), client.project("p"), "t", progress=False, **kw)
    return res, client.project("p").branch("main").table("t").pin()


def test_aloha_compressed_without_lengths_and_with_wrong_ones(tmp_path):
    pytest.importorskip("cv2")
    bare = make_aloha_compressed(tmp_path / "bare" / "episode_0.hdf5", lengths=False)
    _, t = _import_one(bare, tmp_path / "bare", images="encoded")
    got = t.to_arrow(["observations_images_cam_low"]).column(0).to_pylist()
    assert all(b[:2] == b"\xff\xd8" and b[-2:] == b"\xff\xd9" for b in got)  # cut at the padding
    bad = make_aloha_compressed(tmp_path / "bad" / "episode_0.hdf5")
    with h5py.File(bad, "a") as f:
        f["compress_len"][...] = f["compress_len"][()] - 1
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match=r"camera 'observations_images_cam_high': no row of "
                       r"/compress_len cuts this camera's frames into whole JPEGs"):  # fmt: skip
        import_hdf5(str(bad), client.project("p"), "t", images="encoded", progress=False)
    assert nothing_committed(client.project("p"))


def _bad(tmp_path, edit):
    path = make_robomimic(tmp_path / "bad.hdf5", [3, 4], images=False)
    with h5py.File(path, "a") as f:
        edit(f)
    return path


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda f: f.move("data", "other"), CorruptData, "no 'data' group"),
        (lambda f: f.create_dataset("data/demo_1/extra", data=np.zeros(9)), CorruptData,
         r"demo_1, dataset 'extra' has 9 rows, the demo has 4"),
        (lambda f: f["data/demo_0"].attrs.__setitem__("num_samples", 7), CorruptData,
         "demo_0: attribute num_samples is 7, actions has 3"),
        (lambda f: f.create_dataset("data/demo_0/obs/name", data=np.array([b"a"] * 3)),
         SchemaMismatch, r"demo_0, dataset 'obs/name': \|S1 is not numeric"),
        (lambda f: f.create_dataset("data/demo_1/obs/huge", shape=(4, 1 << 20, 1 << 10),
                                    dtype=np.float32, chunks=(1, 1, 1 << 10)), CorruptData,
         "over 4294967296 bytes"),
        (lambda f: f["mask"].create_dataset("odd", data=np.array([b"demo_9"])), CorruptData,
         "mask/odd names 'demo_9'"),
        (lambda f: (f["data/demo_1"].__delitem__("actions"),
                    f["data/demo_1"].attrs.__delitem__("num_samples")), CorruptData,
         "demo_1: no 'actions' dataset and no num_samples attribute"),
        # bytes that are not UTF-8 were stored with replacement characters ("caf\ufffd")
        (lambda f: f["data/demo_1"].attrs.__setitem__("ep_meta", np.bytes_(b'{"l": "caf\xe9"}')),
         CorruptData, r"demo_1: attribute 'ep_meta' of '/data/demo_1' is not UTF-8 text"),
        (lambda f: f["data"].attrs.__setitem__("note", np.bytes_(b"\xff\xfe")), CorruptData,
         r"attribute 'note' of '/data' is not UTF-8 text .*: b'\\xff\\xfe'"),
        (lambda f: f["mask"].create_dataset("odd", data=np.array([b"demo_\xff"])), CorruptData,
         r"filter key mask/odd is not UTF-8 text"),
        # before: table.metadata got their repr ('<HDF5 object reference>', "b'\\x00\\x01'")
        (lambda f: f["data"].attrs.__setitem__("r", f["data/demo_0"].ref), SchemaMismatch,
         r"attribute 'r' of '/data' is Reference .*cannot hold"),
        (lambda f: f["data"].attrs.__setitem__("o", np.void(b"\x00\x01")), SchemaMismatch,
         r"attribute 'o' of '/data' is void .*cannot hold"),
    ],
)  # fmt: skip
def test_named_errors_and_nothing_committed(tmp_path, edit, error, match):
    path = _bad(tmp_path, edit)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(error, match=match):
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def _other_files(tmp_path, kind):
    """An edit that makes both demos read bytes of a file beside the HDF5 file."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"AWS_SECRET_ACCESS_KEY=not-for-a-table-0123456789")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g.create_dataset("x", data=np.arange(4.0))
        g.create_group("data/demo_0").create_dataset("actions", data=np.zeros((3, 7)))

    def edit(f):
        for demo, n in (("demo_0", 3), ("demo_1", 4)):
            g = f[f"data/{demo}"]
            if kind == "external":
                g.create_dataset("leak", (n, 12), "u1", external=[(str(secret), 0, 48)])
            elif kind == "virtual":
                layout = h5py.VirtualLayout(shape=(n,), dtype="f8")
                layout[:n] = h5py.VirtualSource(str(other), "x", shape=(4,))[:n]
                g.create_virtual_dataset("leak", layout)
        if kind == "link":
            del f["data/demo_0"]
            f["data/demo_0"] = h5py.ExternalLink(str(other), "/data/demo_0")
        if kind == "soft":
            f["elsewhere"] = h5py.ExternalLink(str(other), "/data")
            del f["mask"]
            f["mask"] = h5py.SoftLink("/elsewhere")

    return edit


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("external", r"demo_0: 'leak' is stored in external files \('.*secret.txt'"),
        ("virtual", r"demo_0: 'leak' is a virtual dataset"),
        ("link", r"bad.hdf5: 'data/demo_0' is a link to '.*other.h5'"),
        ("soft", r"bad.hdf5: 'mask' is a link to '.*other.h5'"),
    ],
)
def test_only_the_files_own_bytes_are_read(tmp_path, kind, match):
    # a hostile file could copy any file its user can read (keys, other datasets) into a table
    path = _bad(tmp_path, _other_files(tmp_path, kind))
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(UnsafeInput, match=match):
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_a_filter_key_longer_than_the_demos_is_refused_before_it_is_read(tmp_path):
    def edit(f):  # 64 GiB if read: HDF5 stores none of it (never written, chunked)
        f["mask"].create_dataset("big", shape=(1 << 33,), dtype="S8", chunks=(1 << 16,))

    path = _bad(tmp_path, edit)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match="filter key mask/big lists 8589934592 names, the file "
                       "has 2 demos"):  # fmt: skip
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_moments_count_against_max_episode_bytes_and_need_values(tmp_path):
    # a demo of 2**20 one-byte moments is 1 MiB of data, and ~30 MiB once a table's rows
    def edit(f):
        for demo, n in (("demo_0", 1 << 20), ("demo_1", 4)):
            del f[f"data/{demo}"]
            f.create_dataset(f"data/{demo}/actions", shape=(n, 1), dtype="u1", chunks=True)

    path = _bad(tmp_path, edit)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match=r"demo_0: its 1048576 moments and datasets hold over "
                       r"16777216 bytes \(max_episode_bytes; 32 a moment"):  # fmt: skip
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False,
                    max_episode_bytes=16 << 20)  # fmt: skip
    path = _bad(tmp_path / "empty", lambda f: f.create_dataset("data/demo_1/obs/none", (4, 0)))
    with pytest.raises(SchemaMismatch, match=r"demo_1, dataset 'obs/none' is \(4, 0\): no values"):
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def test_an_empty_attribute_is_none(tmp_path):
    path = _bad(tmp_path, lambda f: f["data"].attrs.__setitem__("none", h5py.Empty("f8")))
    _, t = _import_one(path, tmp_path)
    assert t.metadata["none"] is None


def test_demos_without_actions_are_num_samples_long(tmp_path):
    def drop(f):
        for demo in ("demo_0", "demo_1"):
            del f[f"data/{demo}/actions"]

    path = _bad(tmp_path, drop)
    client = Client(str(tmp_path / "store"), create=True)
    import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    t = client.project("p").branch("main").table("t").pin()
    assert list(t.episodes().lengths) == [3, 4] and "actions" not in t.schema.names


def test_not_hdf5_and_no_files(tmp_path):
    (tmp_path / "fake.hdf5").write_bytes(b"not an hdf5 file at all")
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match="fake.hdf5 is not a readable HDF5 file"):
        import_hdf5(str(tmp_path / "fake.hdf5"), client.project("p"), "t", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound, match="no HDF5 files"):
        import_hdf5(str(tmp_path / "empty"), client.project("p"), "t", progress=False)
    with pytest.raises(ValueError, match="images must be one of"):
        import_hdf5(str(tmp_path / "fake.hdf5"), client.project("p"), "t", images="jpeg")
    assert nothing_committed(client.project("p"))


def test_video_needs_a_rate(tmp_path):
    path = make_aloha(tmp_path / "aloha", episodes=1)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(SchemaMismatch, match="needs fps="):
        import_hdf5(str(path), client.project("p"), "t", progress=False)


@pytest.mark.s3
def test_from_and_into_s3(robomimic, s3_server, s3_root):
    from treadle.storage import Store

    opts = s3_server.storage_options()
    url = s3_server.url(f"src-hdf5-{id(robomimic)}")
    Store.open(url, opts).put("lift_ph.hdf5", robomimic.read_bytes())
    root, root_opts = s3_root
    client = Client(root, root_opts)
    res = import_hdf5(f"{url}/lift_ph.hdf5", client.project("p"), "t", images="decoded",
                      source_options=opts, progress=False)  # fmt: skip
    t = client.project("p").branch("main").table("t").pin()
    assert res.episodes == 12 and t.episode_sets()["valid"] == ["demo_10", "demo_11"]
    with h5py.File(robomimic, "r") as f:
        a, b = _episode_rows(t, "demo_10")
        np.testing.assert_array_equal(_column(t, "actions")[a:b], f["data/demo_10/actions"][()])


def test_cli_import_hdf5(libero, tmp_path, capsys):
    from treadle.cli import main

    root = str(tmp_path / "store")
    argv = ["--root", root, "import", "hdf5", str(libero), "--project", "p", "--table", "t"]
    assert main([*argv, "--fps", "20", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 4 and [c["column"] for c in out["cameras"]] == ["obs_agentview_rgb"]
    assert main([*argv, "--images", "decoded"]) == 1  # the table holds video now
    assert "error" in capsys.readouterr().err


def test_big_endian_datasets_are_read_as_h5py_reads_them(tmp_path):
    # h5py hands big-endian datasets back as '>f4'/'>i8' arrays; Arrow holds native order
    # only, and the import stopped on pyarrow's "Byte-swapped arrays not supported"
    stamps = 1_700_000_000_123_456_789 + np.arange(7, dtype=np.int64) * 33_333_333

    def edit(f):
        for demo, (a, b) in (("demo_0", (0, 3)), ("demo_1", (3, 7))):
            obs = f[f"data/{demo}/obs"]
            obs.create_dataset(
                "be_pos", data=np.arange(a * 2, b * 2).reshape(-1, 2) / 3, dtype=">f4"
            )
            obs.create_dataset("be_stamp", data=stamps[a:b], dtype=">i8")
            obs.create_dataset("be_count", data=np.arange(a, b) + 65000, dtype=">u2")

    path = _bad(tmp_path, edit)
    _, t = _import_one(path, tmp_path)
    with h5py.File(path, "r") as f:
        for key in ("be_pos", "be_stamp", "be_count"):
            want = np.concatenate([f[f"data/demo_{i}/obs/{key}"][()] for i in (0, 1)])
            got = _column(t, f"obs_{key}")
            assert got.dtype == want.dtype.newbyteorder("=")
            np.testing.assert_array_equal(got, want)
    assert _column(t, "obs_be_stamp").tolist() == stamps.tolist()


def _zlib_of_zeros(n: int) -> bytes:
    """``n`` zero bytes through zlib (HDF5's deflate filter), a MiB at a time."""
    import zlib

    z, parts = zlib.compressobj(1), []
    for start in range(0, n, 1 << 20):
        parts.append(z.compress(bytes(min(1 << 20, n - start))))
    return b"".join([*parts, z.flush()])


def test_a_chunk_larger_than_its_dataset_counts_as_the_chunk(tmp_path, local_root):
    """A 3-row dataset in one 1 GiB deflate chunk of zeros (1 MiB of file) took 1 GiB to
    read, past max_episode_bytes: HDF5 inflates a whole chunk to read any of it."""
    rows = 1 << 27  # float64: 1 GiB a chunk

    def edit(f):
        del f["data/demo_0/actions"]
        ds = f.create_dataset("data/demo_0/actions", shape=(3,), maxshape=(None,),
                              chunks=(rows,), dtype="f8", compression="gzip")  # fmt: skip
        ds.id.write_direct_chunk((0,), _zlib_of_zeros(rows * 8))

    path = _bad(tmp_path, edit)
    assert path.stat().st_size < 8 << 20
    call = (f"td.importers.hdf5({str(path)!r}, client.project('p'), 't', images='decoded', "
            "progress=False, max_episode_bytes=64 << 20)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=768 << 20)
    assert out["error"] == "CorruptData", out
    assert re.search(r"demo_0: .*'actions' alone is \(3,\) float64 in chunks of \(134217728,\)",
                     out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20


def test_a_dataset_hdf5_cannot_read_is_named(tmp_path):
    def edit(f):
        ds = f.create_dataset("data/demo_1/obs/noisy", data=np.random.rand(4, 50),
                              chunks=(4, 50), compression="gzip")  # fmt: skip
        offset = ds.id.get_chunk_info(0).byte_offset
        f.flush()
        with open(f.filename, "r+b") as raw:
            raw.seek(offset + 10)
            raw.write(b"\xff" * 40)

    path = _bad(tmp_path, edit)
    client = Client(str(tmp_path / "store"), create=True)
    with pytest.raises(CorruptData, match=r"bad.hdf5, demo_1, dataset 'obs/noisy' cannot be read"):
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))


def _aloha_with_frames(tmp_path, frames):
    """A compressed ALOHA file (no compress_len) whose first camera holds ``frames``."""
    pytest.importorskip("cv2")
    path = make_aloha_compressed(tmp_path / "aloha" / "episode_0.hdf5", n=len(frames),
                                 lengths=False)  # fmt: skip
    with h5py.File(path, "a") as f:
        cam = f"observations/images/{ALOHA_CAMERAS[0]}"
        del f[cam]
        arr = np.zeros((len(frames), max(len(b) for b in frames)), np.uint8)
        for i, b in enumerate(frames):
            arr[i, : len(b)] = np.frombuffer(b, np.uint8)
        f.create_dataset(cam, data=arr)
    return path


def _jpeg(w, h):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, "JPEG", quality=50)
    return buf.getvalue()


def test_aloha_jpeg_frames_are_bounded_from_their_headers(tmp_path, local_root):
    """6 JPEGs of 8000x8000 black (a few hundred KB) were decoded to 1.1 GB before
    max_episode_bytes was consulted; frames of two sizes were a bare ValueError (np.stack)."""
    path = _aloha_with_frames(tmp_path / "big", [_jpeg(8000, 8000)] * 6)
    assert path.stat().st_size < 8 << 20
    call = (f"td.importers.hdf5({str(path)!r}, client.project('p'), 't', images='decoded', "
            "progress=False, max_episode_bytes=256 << 20)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=384 << 20)
    assert out["error"] == "CorruptData", out
    assert re.search(r"episode_0.hdf5, camera '.*': 6 frames of 8000x8000 decode to "
                     r"1,152,000,000 bytes, over max_episode_bytes \(268,435,456\)",
                     out["message"])  # fmt: skip
    assert out["rss_growth"] < 64 << 20
    path = _aloha_with_frames(tmp_path / "two", [_jpeg(40, 24), _jpeg(40, 24), _jpeg(20, 12)])
    client = Client(str(tmp_path / "store2"), create=True)
    with pytest.raises(CorruptData, match=r"camera '.*': frame 0 is 40x24, frame 2 20x12"):
        import_hdf5(str(path), client.project("p"), "t", images="decoded", progress=False)
    assert nothing_committed(client.project("p"))

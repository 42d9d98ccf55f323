"""td.Video over binary columns of encoded images (issue 44): each frame is Pillow's decode,
bit for bit, whatever wrote the bytes; every td.Video option equals the same operation by
hand on Pillow's frames; bad inputs are named errors; other binary columns are list[bytes]."""

from __future__ import annotations

import contextlib
import fractions
import io
import zlib

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

import treadle as td
from treadle.errors import CorruptData, PlanError
from treadle.table.image_sizes import IMAGES_KEY, recorded_images

H, W, T = 48, 64, 6  # frames per episode


def _picture(rng, h=H, w=W):
    """A smooth gradient with noise: JPEG's IDCT paths differ on it (not flat colour)."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], -1)
    return np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)


def _pil(a, fmt, **kw):
    b = io.BytesIO()
    Image.fromarray(a).save(b, format=fmt, **kw)
    return b.getvalue()


def _cv2_jpeg(a):
    cv2 = pytest.importorskip("cv2")
    ok, buf = cv2.imencode(".jpg", a[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


def _ffmpeg_jpeg(a):
    import av

    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt = a.shape[1], a.shape[0], "yuvj420p"
    ctx.time_base = fractions.Fraction(1, 25)
    frame = av.VideoFrame.from_ndarray(a, format="rgb24").reformat(format="yuvj420p")
    packets = list(ctx.encode(frame)) + list(ctx.encode(None))
    return bytes(packets[0])


def _png16(rng):
    return _pil((rng.integers(0, 65535, (H, W))).astype(np.uint16), "PNG")


WRITERS = {
    "jpeg_pillow": lambda rng: _pil(_picture(rng), "JPEG", quality=90),
    "jpeg_opencv": lambda rng: _cv2_jpeg(_picture(rng)),
    "jpeg_ffmpeg": lambda rng: _ffmpeg_jpeg(_picture(rng)),
    "png_rgb": lambda rng: _pil(_picture(rng), "PNG"),
    "png_rgba": lambda rng: _pil(
        np.concatenate([_picture(rng), rng.integers(0, 255, (H, W, 1), dtype=np.uint8)], -1),
        "PNG",
    ),
    "png_palette": lambda rng: _pil_palette(_picture(rng)),
    "png_grey": lambda rng: _pil(_picture(rng)[:, :, 0], "PNG"),
    "webp": lambda rng: _pil(_picture(rng), "WEBP", quality=80),
}


def _pil_palette(a):
    b = io.BytesIO()
    Image.fromarray(a).convert("P", palette=Image.ADAPTIVE, colors=32).save(b, format="PNG")
    return b.getvalue()


def _rgb(data, size=None, mode="RGB"):
    img = Image.open(io.BytesIO(data)).convert(mode)
    if size is not None:
        img = img.resize((size[1], size[0]), Image.BILINEAR)
    return np.asarray(img)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("images"))
    branch = td.Client(root, create=True).project("p").branch("main")
    rng = np.random.default_rng(44)
    for name, write in WRITERS.items():
        if name == "jpeg_opencv":
            pytest.importorskip("cv2")
        for e in range(2):
            frames = [write(rng) for _ in range(T)]
            branch.table(name).append_episode(
                {"cam": frames, "x": np.arange(T, dtype=np.float32)}, episode=f"e{e}", fps=10
            )
    for e in range(2):
        branch.table("depth").append_episode({"cam": [_png16(rng) for _ in range(T)]},
                                             episode=f"e{e}")  # fmt: skip
    branch.table("depth_less").append_episode({"x": np.arange(T, dtype=np.float32)}, episode="e0")
    return branch


def _every_moment(branch, table, spec, batch=4, rename=None, **kw):
    """Every eligible moment's window in table order, as numpy, with the moments."""
    comp = td.Component(branch.table(table), td.Windows({"cam": spec}), rename=rename)
    out, moments = {}, []
    for b in td.EvalLoader(comp, batch, **kw):
        valid = b["_valid"].numpy()
        for k, v in b.items():
            if isinstance(v, torch.Tensor):
                out.setdefault(k, []).append(v[valid].float().numpy() if v.dtype == torch.bfloat16
                                             else v[valid].numpy())  # fmt: skip
        moments += b["_moment"][valid].tolist()
    return {k: np.concatenate(v) for k, v in out.items()}, moments


def _values(branch, table):
    return branch.table(table).pin().to_arrow(["cam"]).column("cam").to_pylist()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_frames_equal_pillows_decode(store, writer):
    if writer == "jpeg_opencv":
        pytest.importorskip("cv2")
    got, moments = _every_moment(store, writer, td.Video([0]))
    values = _values(store, writer)
    assert got["cam"].shape == (2 * T, 1, H, W, 3) and got["cam"].dtype == np.uint8
    for i, m in enumerate(moments):
        np.testing.assert_array_equal(got["cam"][i, 0], _rgb(values[m]), err_msg=f"{writer} {m}")
    meta = store.table(writer).pin().schema.metadata[IMAGES_KEY]
    assert b'"sizes":[[64,48,"e0"]]' in meta  # one size, recorded at write time


def test_16_bit_png_stays_uint16_and_floats_are_raw(store):
    values = _values(store, "depth")
    want = np.stack([np.asarray(Image.open(io.BytesIO(v))) for v in values])
    assert want.dtype == np.uint16
    got, moments = _every_moment(store, "depth", td.Video([0], channels=1))
    assert got["cam"].dtype == np.uint16 and got["cam"].shape == (2 * T, 1, H, W, 1)
    np.testing.assert_array_equal(got["cam"][:, 0, :, :, 0], want[moments])
    got, moments = _every_moment(store, "depth", td.Video([0], channels=1, dtype="float32",
                                                          layout="TCHW"))  # fmt: skip
    np.testing.assert_array_equal(got["cam"][:, 0, 0], want[moments].astype(np.float32))
    got, moments = _every_moment(store, "depth", td.Video([0], channels=1, size=(24, 32)))
    for i, m in enumerate(moments):
        img = Image.open(io.BytesIO(values[m])).resize((32, 24), Image.BILINEAR)
        np.testing.assert_array_equal(got["cam"][i, 0, :, :, 0], np.asarray(img))
    with pytest.raises(PlanError, match="16-bit images.*channels=1"):
        _every_moment(store, "depth", td.Video([0]))


def test_every_option_equals_the_same_operation_on_pillows_frames(store):
    values = _values(store, "jpeg_pillow")
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    spec = td.Video(seconds=[-0.2, 0.0, 0.1], pad=True, size=(32, 40), layout="TCHW",
                    dtype="float32", mean=mean, std=std)  # fmt: skip
    got, moments = _every_moment(store, "jpeg_pillow", spec, rename={"cam": "image"})
    assert got["image"].shape == (2 * T, 3, 3, 32, 40)
    starts = {0: 0, 1: T}
    for i, m in enumerate(moments):
        first = starts[m // T]
        rows = np.clip(np.array([m - 2, m, m + 1]), first, first + T - 1)
        np.testing.assert_array_equal(got["image_is_pad"][i], rows != [m - 2, m, m + 1])
        for j, r in enumerate(rows):
            q = torch.from_numpy(_rgb(values[r], (32, 40)).copy()).permute(2, 0, 1).float() / 255
            q = (q - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
            np.testing.assert_array_equal(got["image"][i, j], q.numpy(), err_msg=f"{m} {j}")
    got, moments = _every_moment(store, "jpeg_pillow", td.Video([0], dtype="bfloat16"))
    for i, m in enumerate(moments):
        want = (torch.from_numpy(_rgb(values[m]).copy()).float() / 255).to(torch.bfloat16).float()
        np.testing.assert_array_equal(got["cam"][i, 0], want.numpy())
    got, moments = _every_moment(store, "png_rgb", td.Video([0, 1], channels=1))
    grey = _values(store, "png_rgb")
    for i, m in enumerate(moments):
        np.testing.assert_array_equal(got["cam"][i, 1, :, :, 0], _rgb(grey[m + 1], mode="L"))


def test_optional_image_column_gives_zeros_and_presence(store):
    spec = td.Video([0], size=(H, W), optional=True)
    recipe = td.Recipe(seed=0, batch_size=4, components=[
        td.Component(store.table("webp"), td.Windows({"cam": spec, "x": td.Rows([0])}), weight=1),
        td.Component(store.table("depth_less"), td.Windows({"cam": spec, "x": td.Rows([0])}),
                     weight=1)])  # fmt: skip
    values = _values(store, "webp")
    for b in td.TrainLoader(recipe, steps=3):
        for i in range(4):
            if b["cam_is_present"][i]:
                want = _rgb(values[int(b["_moment"][i])])
                np.testing.assert_array_equal(b["cam"][i, 0].numpy(), want)
            else:
                assert not b["cam"][i].any()
        assert b["cam_is_present"].tolist().count(True) == 2


def test_trains_with_workers_0_and_2(store):
    recipe = td.Recipe(seed=3, batch_size=4, components=[
        td.Component(store.table("jpeg_opencv" if _has_cv2() else "jpeg_ffmpeg"),
                     td.Windows({"cam": td.Video(range(2))}), weight=0.5),
        td.Component(store.table("png_palette"), td.Windows({"cam": td.Video(range(2))}),
                     weight=0.5)])  # fmt: skip
    runs = [[b["cam"].clone() for b in td.TrainLoader(recipe, steps=4, workers=w)] for w in (0, 2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    first = next(iter(td.TrainLoader(recipe, steps=1)))
    table = recipe.components[int(first["_component"][0])].table
    values = table.pin().to_arrow(["cam"]).column("cam").to_pylist()
    m = int(first["_moment"][0])
    np.testing.assert_array_equal(first["cam"][0, 1].numpy(), _rgb(values[m + 1]))


def _has_cv2():
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def test_binary_non_image_columns_arrive_as_lists_of_bytes(tmp_path):
    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    blobs = [bytes([i]) * (i + 1) for i in range(8)]
    branch.table("t").append({"blob": pa.array(blobs, pa.large_binary()),
                              "x": np.arange(8, dtype=np.float32)})  # fmt: skip
    comp = td.Component(branch.table("t"), td.Windows({"blob": td.Rows([0, 1]), "x": td.Rows([0])}))
    for b in td.EvalLoader(comp, 3):
        for i, m in enumerate(b["_moment"].tolist()):
            if b["_valid"][i]:
                assert b["blob"][i] == [blobs[m], blobs[m + 1]]
    whole = next(iter(td.EvalLoader(td.Component(branch.table("t")), 8)))
    assert whole["blob"] == blobs  # no windows: every column, bytes as a list
    with pytest.raises(PlanError, match=r"column 'blob'.*first value.*not a JPEG, PNG or WebP"):
        td.Recipe(seed=0, batch_size=2,
                  components=[td.Component(branch.table("t"), td.Windows({"blob": td.Video([0])}))]
                  ).plan()  # fmt: skip


def test_bad_images_are_named_errors(tmp_path):
    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(1)
    small = [_pil(_picture(rng), "JPEG") for _ in range(4)]
    big = [_pil(_picture(rng, 64, 80), "JPEG") for _ in range(4)]
    branch.table("sizes").append_episode({"cam": small}, episode="a")
    branch.table("sizes").append_episode({"cam": big}, episode="b")

    def read(table, spec=None, b=8):
        comp = td.Component(branch.table(table), td.Windows({"cam": spec or td.Video([0])}))
        return list(td.EvalLoader(comp, b))

    with pytest.raises(PlanError, match=r"64x48 \(episode 'a'\) and 80x64 \(episode 'b'\).*size="):
        read("sizes")
    got = read("sizes", td.Video([0], size=(H, W)))[0]["cam"]
    np.testing.assert_array_equal(got[5, 0].numpy(), _rgb(big[1], (H, W)))
    # a column written before sizes were recorded: the frame of another size is CorruptData
    with _unchecked():
        branch.table("legacy").append_episode({"cam": small}, episode="a")
        branch.table("legacy").append_episode({"cam": big}, episode="b")
    assert IMAGES_KEY not in (branch.table("legacy").pin().schema.metadata or {})
    with pytest.raises(CorruptData, match=r"table 'legacy', episode 'b', column 'cam', frame 0: "
                                          r"80x64, the column's first image is 64x48"):  # fmt: skip
        read("legacy")
    damaged = list(small)
    damaged[2] = small[2][: len(small[2]) // 2] + b"\x00" * 64
    branch.table("damaged").append_episode({"cam": damaged[:2]}, episode="a")
    with _unchecked():
        branch.table("damaged").append_episode({"cam": [damaged[2], b"\xff\xd8\xffjunk"]},
                                               episode="b")  # fmt: skip
    with pytest.raises(
        CorruptData, match=r"table 'damaged', episode 'b', column 'cam', frame [01]"
    ):
        read("damaged")
    bomb = _pil(np.zeros((1, 1), np.uint8), "PNG")
    ihdr = (9000).to_bytes(4, "big") * 2 + bomb[24:29]
    bomb = bomb[:16] + ihdr + zlib.crc32(b"IHDR" + ihdr).to_bytes(4, "big") + bomb[33:]
    with pytest.raises(CorruptData, match="decompression bomb"):
        branch.table("bomb").append_episode({"cam": [bomb]}, episode="a")


def test_values_td_video_cannot_read_are_plan_errors_unless_left_out(tmp_path):
    """A null, a value that is not an image, or an image of the other bit depth in an image
    column was a CorruptData at whatever step first drew it; the plan now refuses a window
    that reads it, naming the episode and frame, and plans those that leave it out."""
    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(2)
    jpegs = [_pil(_picture(rng), "JPEG") for _ in range(4)]
    gif = _pil(_picture(rng), "GIF")
    bad = {"null": [jpegs[0], None, *jpegs[2:]], "gif": [*jpegs[:3], gif],
           "deep": [_png16(rng)] * 2 + [_pil(_picture(rng)[..., 0], "PNG")] * 2}  # fmt: skip
    found = {"null": r"is null at episode 'b', frame 1", "gif": r"'b', frame 3, not a JPEG",
             "deep": r"'b', frame 2, an 8-bit image among 16-bit ones"}  # fmt: skip
    for name, values in bad.items():
        t = branch.table(name)
        good = values[:1] * 4
        t.append_episode({"cam": good, "x": np.arange(4)}, episode="a", fps=10)
        t.append_episode({"cam": values, "x": np.arange(4)}, episode="b", fps=10)
        ch = 1 if name == "deep" else 3

        def plan(spec, t=t, **kw):
            comp = td.Component(t, td.Windows({"cam": spec}), **kw)
            return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()

        with pytest.raises(PlanError, match=found[name]):
            plan(td.Video([0], channels=ch))
        if name == "gif":  # frame 3 reached by padding only: offset 5 from frame 0
            with pytest.raises(PlanError, match=found[name]):
                plan(td.Video([0, 5], pad=True), where="frame = 0 AND episode = 'b'")
        left_out = plan(td.Video([0], channels=ch), episodes=["a"])
        assert len(list(td.TrainLoader(left_out, steps=2))) == 2


@contextlib.contextmanager
def _unchecked():
    """Rows written with no write-time header check: what an older treadle wrote."""
    import treadle.table.write as write

    real = write.with_image_sizes
    write.with_image_sizes = lambda schema, rows, where: schema
    try:
        yield
    finally:
        write.with_image_sizes = real


def _train_frames(table, column, workers):
    """Every frame TrainLoader delivers over 3 steps, keyed by moment."""
    recipe = td.Recipe(seed=5, batch_size=4,
                       components=[td.Component(table, td.Windows({column: td.Video([0])}))])  # fmt: skip
    seen = {}
    for b in td.TrainLoader(recipe, steps=3, workers=workers):
        assert b[column].shape[1:] == (1, H, W, 3)
        for i, m in enumerate(b["_moment"].tolist()):
            seen[m] = b[column][i, 0].numpy()
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_imported_webdataset_and_hf_images_train(tmp_path_factory, workers):
    wds = pytest.importorskip("webdataset")
    datasets = pytest.importorskip("datasets")
    from treadle.importers import hf as import_hf
    from treadle.importers import webdataset as import_wds

    tmp = tmp_path_factory.mktemp(f"imports{workers}")
    rng = np.random.default_rng(9)
    shard = str(tmp / "s-000000.tar")
    with wds.TarWriter(shard) as w:
        for i in range(12):
            w.write({"__key__": f"k{i:03d}", "jpg": _picture(rng), "cls": i % 3})
    hf = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(_picture(rng)) for _ in range(12)], "label": list(range(12))},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
    )
    hf.save_to_disk(str(tmp / "hf"))
    project = td.Client(str(tmp / "store"), create=True).project("p")
    import_wds(shard, project, "wds", progress=False)
    import_hf(str(tmp / "hf"), project, "hf", progress=False)
    main = project.branch("main")
    theirs = [s["jpg"] for s in wds.WebDataset(shard, shardshuffle=False).decode("rgb8")]
    seen = _train_frames(main.table("wds"), "jpg", workers)
    assert len(seen) >= 8
    for m, frame in seen.items():
        np.testing.assert_array_equal(frame, theirs[m])
    hf = datasets.load_from_disk(str(tmp / "hf"))
    for table, col, fmt in (("wds", "jpg", "JPEG"), ("hf", "image", "PNG")):
        recorded = recorded_images(main.table(table).pin().schema)[col]  # cameras, by import
        assert recorded["format"] == fmt and recorded["sizes"][0][:2] == [W, H]
    seen = _train_frames(main.table("hf"), "image", workers)
    for m, frame in seen.items():
        np.testing.assert_array_equal(frame, np.asarray(hf[m]["image"].convert("RGB")))


def test_image_column_on_s3_and_info_names_the_decoder(s3_root):
    root, opts = s3_root
    branch = td.Client(root, storage_options=opts, create=True).project("p").branch("main")
    rng = np.random.default_rng(4)
    frames = [_pil(_picture(rng), "JPEG", quality=90) for _ in range(T)]
    branch.table("cams").append_episode({"cam": frames}, episode="e0")
    got, moments = _every_moment(branch, "cams", td.Video([0, 1], size=(32, 40)))
    for i, m in enumerate(moments):
        np.testing.assert_array_equal(got["cam"][i, 1], _rgb(frames[m + 1], (32, 40)))
    assert td.info().versions["images"].startswith(f"Pillow {Image.__version__} (libjpeg")


def test_table_and_plan_stats_treat_image_columns_as_cameras(store):
    values = _values(store, "png_rgba")
    px = np.stack([_rgb(v) for v in values]).reshape(-1, 3).astype(np.float64)
    stats = store.table("png_rgba").pin().stats(frames=1000)
    assert set(stats) == {"cam", "x"}  # the image column, found from what its writes recorded
    np.testing.assert_allclose(stats["cam"].mean, px.mean(0), rtol=1e-12)
    np.testing.assert_array_equal(stats["cam"].max, px.max(0))
    comp = td.Component(store.table("png_rgba"), td.Windows({"cam": td.Video([0])}))
    plan = td.Recipe(seed=0, batch_size=2, components=[comp]).plan()
    got = plan.stats(["cam"], frames=1000)["cam"]
    np.testing.assert_allclose(got.mean, px.mean(0), rtol=1e-12)


def test_treadle_tables_shows_image_columns_as_cameras(store, capsys):
    from treadle.cli import main

    assert main(["--root", store.project.client.root, "tables", "p"]) == 0
    out = capsys.readouterr().out
    assert "cam [jpeg 64x48]" in out and "cam [png 64x48]" in out and "cam [webp 64x48]" in out


def test_sizes_staged_in_other_processes_and_by_other_writers_are_all_kept(tmp_path):
    """Rows staged apart (a distributed import's tasks) and a writer that lost a race each
    recorded other sizes: the commit keeps them all, so the plan still sees both."""
    from treadle.table.handoff import add_staged, take_staged

    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(2)
    staged = []
    for e, (h, w) in enumerate([(H, W), (64, 80)]):
        other = branch.transaction("never committed").table("t")
        other.append_episode({"cam": [_pil(_picture(rng, h, w), "PNG")] * 2}, episode=f"e{e}")
        staged.append(take_staged(other))
        other.tx.close()
    with branch.transaction("import") as tx:
        for s in staged:
            add_staged(tx.table("t"), s)
    sizes = recorded_images(branch.table("t").pin().schema)["cam"]["sizes"]
    assert sizes == [[W, H, "e0"], [80, 64, "e1"]]
    with pytest.raises(PlanError, match=r"64x48 \(episode 'e0'\) and 80x64 \(episode 'e1'\)"):
        td.Recipe(seed=0, batch_size=2, components=[
            td.Component(branch.table("t"), td.Windows({"cam": td.Video([0])}))]).plan()  # fmt: skip


def test_lerobot_windows_read_image_features_as_cameras(store):
    import treadle.lerobot as tl

    windows = tl.windows(store.table("png_rgb"), {"cam": [-0.1, 0.0]})
    spec = windows["cam"]
    assert isinstance(spec, td.Video) and (spec.layout, spec.dtype) == ("TCHW", "float32")
    got, moments = _every_moment(store, "png_rgb", spec)
    values = _values(store, "png_rgb")
    m = moments[3]
    want = torch.from_numpy(_rgb(values[m]).copy()).permute(2, 0, 1).float() / 255
    np.testing.assert_array_equal(got["cam"][3, 1], want.numpy())


def test_only_jpeg_png_and_webp_reach_pillow_plugins(monkeypatch):
    """Pillow picks its plugin from the bytes: a value holding EPS reached the EPS plugin
    (which hands files to Ghostscript) before the format was checked."""
    from PIL import EpsImagePlugin

    from treadle.video.image_decode import image_header

    reached = []
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", lambda self: reached.append(1))
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 4\n0 0 moveto showpage\n%%EOF\n"
    with pytest.raises(CorruptData, match="frame 3: not a decodable image"):
        image_header(eps, "frame 3")
    assert reached == []


def test_a_purged_first_image_is_not_what_plans_and_the_viewer_remember(tmp_path):
    """The first image's header (the frame size without a resize, the viewer's label) is
    kept per table version in the process; a purge rewrites the version under the same
    number. After purging the episode of that image, its size was still served: the
    viewer named it, and a plan refused the kept episode's frames as another size. Read
    afresh, row 0 of the old version (purged) raised td.Purged for a plan of the kept one."""
    from treadle.plan.image_columns import first_header
    from treadle.ui.image_frames import image_cameras

    project = td.Client(str(tmp_path), create=True).project("p")
    branch = project.branch("main")
    rng = np.random.default_rng(3)
    big = [_pil(_picture(rng, 64, 80), "JPEG") for _ in range(4)]
    small = [_pil(_picture(rng), "JPEG") for _ in range(4)]
    with _unchecked():  # written before sizes were recorded: the first image gives the size
        branch.table("legacy").append_episode({"cam": big}, episode="a")
        branch.table("legacy").append_episode({"cam": small}, episode="b")
    before = branch.table("legacy").pin()
    assert first_header(before, "cam").size == (64, 80)
    assert image_cameras(before)["cam"].size == "80x64"
    project.purge("legacy", ["a"], reason="consent withdrawn")
    for table in (before, branch.table("legacy").pin()):  # the purged version, the head
        assert first_header(table, "cam").size == (H, W)
        assert image_cameras(table)["cam"].size == f"{W}x{H}"
    for table in (branch.table("legacy"), before):  # the old version: its kept episode
        comp = td.Component(table, td.Windows({"cam": td.Video([0])}), episodes=["b"])
        got = list(td.EvalLoader(comp, 4))[0]["cam"]
        np.testing.assert_array_equal(got[1, 0].numpy(), _rgb(small[1]))


def test_a_project_made_again_at_its_root_is_not_served_the_old_headers(tmp_path):
    """The first image's header was kept per (table URI, Lance version) for the process: a
    project deleted and made again at the same root has another table at that URI and
    version, and its plans and the viewer were served the deleted table's frame size."""
    import shutil

    from treadle.plan.image_columns import first_header
    from treadle.ui.image_frames import image_cameras

    rng = np.random.default_rng(5)
    root = tmp_path / "store"
    for h, w in ((64, 80), (H, W)):  # the deleted project's images, then the new one's
        shutil.rmtree(root, ignore_errors=True)
        branch = td.Client(str(root), create=True).project("p").branch("main")
        frames = [_pil(_picture(rng, h, w), "JPEG") for _ in range(3)]
        branch.table("t").append_episode({"cam": frames}, episode="a")
        table = branch.table("t").pin()
        assert (table.version, first_header(table, "cam").size) == (1, (h, w))
        assert image_cameras(table)["cam"].size == f"{w}x{h}"
        comp = td.Component(branch.table("t"), td.Windows({"cam": td.Video([0])}))
        got = list(td.EvalLoader(comp, 3))[0]["cam"]
        np.testing.assert_array_equal(got[2, 0].numpy(), _rgb(frames[2]))


def _png16_colour(a):
    """A 16-bit PNG of ``a`` (uint16 [H, W, 3] RGB, [H, W, 2] grey+alpha), written by hand:
    Pillow writes neither."""
    colour = {2: 4, 3: 2}[a.shape[2]]
    rows = b"".join(b"\x00" + r.astype(">u2").tobytes() for r in a)

    def chunk(kind, data):
        return (
            len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
        )

    ihdr = (
        a.shape[1].to_bytes(4, "big") + a.shape[0].to_bytes(4, "big") + bytes([16, colour, 0, 0, 0])
    )
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))  # fmt: skip


@pytest.mark.parametrize("channels,kind", [(3, "RGB"), (2, "grey\\+alpha")])
def test_16_bit_colour_pngs_are_refused_not_cut_to_8_bits(tmp_path, channels, kind):
    """Pillow opens a 16-bit RGB (or grey+alpha) PNG as 8-bit: its low bytes would be lost
    silently while the docs promise a 16-bit PNG is never converted."""
    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(3)
    frames = [
        _png16_colour(rng.integers(0, 65535, (H, W, channels)).astype(np.uint16)) for _ in range(2)
    ]
    refused = rf"a 16-bit {kind} PNG, which Pillow reads as 8-bit"
    with pytest.raises(CorruptData, match=refused):
        branch.table("t").append_episode({"cam": frames}, episode="a")
    with _unchecked():  # written before the check: the plan and the decode refuse it too
        branch.table("old").append_episode({"cam": frames}, episode="a")
        branch.table("mixed").append_episode({"cam": [_pil(_picture(rng), "PNG"), frames[0]]},
                                             episode="b")  # fmt: skip
    comp = td.Component(branch.table("old"), td.Windows({"cam": td.Video([0], channels=1)}))
    with pytest.raises(PlanError, match=refused):
        list(td.EvalLoader(comp, 2))
    comp = td.Component(branch.table("mixed"), td.Windows({"cam": td.Video([0])}))
    with pytest.raises(CorruptData, match=r"episode 'b', column 'cam', frame 1: " + refused):
        list(td.EvalLoader(comp, 2))


def test_alpha_is_dropped_and_exif_orientation_is_not_applied(tmp_path):
    """Documented choices: an RGBA frame is its RGB (no compositing), a JPEG tagged to be
    shown rotated (EXIF orientation 6) arrives as stored, not turned to [W, H], and an
    embedded ICC profile (here a Lab one, far from sRGB) is not applied."""
    from PIL import ImageCms

    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(6)
    rgb = _picture(rng)
    clear = np.concatenate([rgb, np.zeros((H, W, 1), np.uint8)], -1)  # fully transparent
    exif = Image.Exif()
    exif[0x0112] = 6
    tagged = _pil(rgb, "JPEG", quality=95, exif=exif.tobytes())
    branch.table("rgba").append_episode({"cam": [_pil(clear, "PNG")]}, episode="a")
    branch.table("exif").append_episode({"cam": [tagged]}, episode="a")
    lab = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()
    branch.table("icc").append_episode({"cam": [_pil(rgb, "PNG", icc_profile=lab)]}, episode="a")

    def frame(table):
        comp = td.Component(branch.table(table), td.Windows({"cam": td.Video([0])}))
        return list(td.EvalLoader(comp, 1))[0]["cam"][0, 0].numpy()

    np.testing.assert_array_equal(frame("rgba"), rgb)
    np.testing.assert_array_equal(frame("icc"), rgb)
    got = frame("exif")
    assert got.shape == (H, W, 3)
    np.testing.assert_array_equal(got, np.asarray(Image.open(io.BytesIO(tagged))))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_images_raise_even_when_pillow_is_told_to_load_them(tmp_path, monkeypatch, fmt):
    """Training scripts often set PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True; Pillow then
    gave the missing rows of a truncated frame as grey (JPEG) or zeros (PNG), with no error.
    The frame is CorruptData whatever the flag, and the flag the process set is kept."""
    from PIL import ImageFile

    branch = td.Client(str(tmp_path), create=True).project("p").branch("main")
    rng = np.random.default_rng(9)
    frames = [_pil(_picture(rng), fmt) for _ in range(3)]
    frames[1] = frames[1][: len(frames[1]) // 2]
    branch.table("t").append_episode({"cam": frames}, episode="a")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    comp = td.Component(branch.table("t"), td.Windows({"cam": td.Video([0])}))
    with pytest.raises(CorruptData, match=r"episode 'a', column 'cam', frame 1: .*truncated"):
        list(td.EvalLoader(comp, 3))
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True

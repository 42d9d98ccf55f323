"""Each window is converted with its own stream's colour matrix and range, whatever was read
before it, on the CPU path, through TrainLoader and on the GPU path's reference (on CPU).

The streams are H.264 files written with PyAV directly (BT.709, untagged, full range, and
FCC, and a BT.709 tag that only the container carries), imported through ``td.VideoFile``; the
oracle is a fresh, single-stream PyAV decode of each file converted to rgb24 with the
matrix and range the file was tagged with.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pytest
import torch

import treadle as td
import treadle.video as tv
from treadle.errors import VideoError
from treadle.gpu.nvdec_reader import GpuVideoReader
from treadle.plan.windows import Video
from treadle.video import column_layout as layout
from treadle.video._testing import synthetic_frames

T, H, W = 24, 48, 64
BT709 = {"colorspace": 1, "color_primaries": 1, "color_trc": 1, "color_range": 1}
# name -> (encoder tags, extra x264-params, the (colorspace, color_range) a fresh decode of
# the file reports, the conversion that means in swscale's names)
STREAMS = {
    "bt709": (BT709, "", (1, 1), ("ITU709", "MPEG")),
    "untagged": ({}, "", (2, 0), ("ITU601", "MPEG")),
    "full": ({"color_range": 2}, "", (2, 2), ("ITU601", "JPEG")),
    # FCC: swscale has its matrix (Kr=0.30, Kb=0.11), 1-2 levels from BT.601's
    "fcc": ({"colorspace": 4, "color_range": 1}, "", (4, 1), ("FCC", "MPEG")),
    # the SPS has no colour description; only the container (MKV colour elements) says BT.709
    "container709": (
        BT709,
        "colorprim=undef:transfer=undef:colormatrix=undef",
        (1, 1),
        ("ITU709", "MPEG"),
    ),
}
ORDER = [
    "bt709",
    "untagged",
    "full",
    "fcc",
    "untagged",
    "container709",
    "untagged",
    "full",
    "bt709",
]


def pyav_file(name: str, seed: int) -> bytes:
    """An MKV written by PyAV's libx264 with ``name``'s tags (B-frames, 8-frame GOPs)."""
    tags, extra, _, (matrix, rng) = STREAMS[name]
    params = "keyint=8:min-keyint=8:scenecut=0:bframes=2" + (":" + extra if extra else "")
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as c:
        s = c.add_stream("libx264", rate=Fraction(30))
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for k, v in tags.items():
            setattr(s.codec_context, k, v)
        s.options = {"preset": "veryfast", "x264-params": params}
        for i, rgb in enumerate(synthetic_frames(T, H, W, seed=seed)):
            vf = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=matrix, dst_color_range=rng
            )
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


def fresh_decode(data: bytes, matrix: str, rng: str) -> np.ndarray:
    """A fresh single-stream decode of the file, rgb24 with the given matrix and range."""
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(video=0))
    return np.stack(
        [
            f.reformat(format="rgb24", src_colorspace=matrix, src_color_range=rng).to_ndarray()
            for f in frames
        ]
    )


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return {name: pyav_file(name, seed=k) for k, name in enumerate(STREAMS)}


@pytest.fixture(scope="module")
def refs(files) -> dict[str, np.ndarray]:
    out = {}
    for name, data in files.items():
        _, _, tags, (matrix, rng) = STREAMS[name]
        out[name] = fresh_decode(data, matrix, rng)
        with av.open(io.BytesIO(data)) as c:  # the file is tagged as the test claims
            f = next(c.decode(video=0))
            assert (int(f.colorspace), int(f.color_range)) == tags, name
    # the matrices differ enough that converting with another stream's would show
    wrong = fresh_decode(files["bt709"], "ITU601", "MPEG").astype(int)
    assert np.abs(wrong - out["bt709"]).max() > 8
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory, files):
    """One table, one episode per stream (episode name = stream name), via td.VideoFile."""
    root = tmp_path_factory.mktemp("colour")
    paths = {}
    for name, data in files.items():
        paths[name] = root / f"{name}.mkv"
        paths[name].write_bytes(data)
    branch = td.Client(str(root / "store"), create=True).project("p").branch()
    with branch.transaction("four colour conventions") as tx:
        for name in STREAMS:
            tx.table("cams").append_episode({"cam": td.VideoFile(str(paths[name]))}, name)
    return branch


def episode_indexes(table) -> dict[str, tuple[str, tv.StreamIndex]]:
    col = table.to_arrow(["cam"]).column("cam")
    eps = table.episodes()
    return {
        n: tv.index_from_arrow(col.slice(int(s), int(k)))
        for n, s, k in zip(eps.names, eps.starts, eps.lengths)
    }


def windows(order: list[str], seed: int, length: int = 5) -> list[tuple[str, int]]:
    rng = np.random.default_rng(seed)
    return [(name, int(rng.integers(0, T - length + 1))) for name in order]


def test_recorded_tags(project):
    got = {
        n: (i.colorspace, i.color_range)
        for n, (_, i) in episode_indexes(project.table("cams").pin()).items()
    }
    # what a fresh decode of each file reports: the SPS's tags, else the container's
    assert got == {name: tags for name, (_, _, tags, _) in STREAMS.items()}


@pytest.mark.parametrize(
    "threads, decoder_threads", [(1, 1), (2, 1), (1, 2), (3, 0)], ids=lambda v: str(v)
)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
def test_reader_windows_are_exact_in_any_order(project, refs, threads, decoder_threads, reverse):
    table = project.table("cams").pin()
    idx = episode_indexes(table)
    order = ORDER[::-1] if reverse else ORDER
    proj = table.project
    with tv.VideoReader(
        proj.client.store, prefix=proj.prefix, threads=threads, decoder_threads=decoder_threads
    ) as reader:
        for batch in range(2):  # a second read call starts where the first left its decoders
            wins = windows(order, seed=batch)
            reqs = [
                tv.WindowRequest.at(*idx[n], s, Video(range(5)), ("cams", n, "cam"))
                for n, s in wins
            ]
            for (n, s), out in zip(wins, reader.read(reqs)):
                diff = np.abs(out.astype(int) - refs[n][s : s + 5]).max()
                assert diff == 0, f"{n} window at {s} read after others is {diff} levels off"


@pytest.mark.parametrize("video_threads", [1, 3])
def test_trainloader_batches_are_exact(project, refs, video_threads):
    table = project.table("cams")
    recipe = td.Recipe(
        seed=7,
        batch_size=8,
        components=[td.Component(table, td.Windows({"cam": td.Video(range(4))}))],
    )
    eps = table.pin().episodes()
    checked = set()
    for batch in td.TrainLoader(recipe, steps=4, video_threads=video_threads):
        cam = batch["cam"].numpy()
        for i, m in enumerate(batch["_moment"].tolist()):
            e = int(np.searchsorted(eps.starts, m, side="right") - 1)
            name, frame = eps.names[e], int(m - eps.starts[e])
            diff = np.abs(cam[i].astype(int) - refs[name][frame : frame + 4]).max()
            assert diff == 0, f"episode {name} frame {frame}: {diff} levels off"
            checked.add(name)
    assert checked == set(STREAMS)


@pytest.mark.parametrize("streams", [1, 2])
def test_gpu_path_converts_with_each_streams_tags(project, refs, streams):
    """The GPU reader's pipeline on CPU (software decode, torch reference kernel)."""
    table = project.table("cams").pin()
    idx = episode_indexes(table)
    proj = table.project
    wins = windows(ORDER + ORDER[::-1], seed=3)
    reqs = [tv.WindowRequest.at(*idx[n], s, Video(range(5)), ("cams", n, "cam")) for n, s in wins]
    with GpuVideoReader(
        proj.client.store, device="cpu", prefix=proj.prefix, hw=False, impl="torch", streams=streams
    ) as reader:
        outs = reader.read(reqs)
    for (n, s), out in zip(wins, outs):
        want = torch.from_numpy(refs[n][s : s + 5]).int()
        diff = int((out.int() - want).abs().max())
        assert diff == 0, f"{n} window at {s}: {diff} levels off"


# --- episodes written before colour was recorded --------------------------------------


def test_older_index_takes_tags_from_the_sps(project, refs, files):
    """An index without colour fields (an older table): the window's SPS decides."""
    table = project.table("cams").pin()
    idx = episode_indexes(table)
    legacy = layout._legacy_struct_type()
    old = {}
    for n in ("bt709", "untagged", "full"):
        stream = tv.from_container(files[n])
        key, new = idx[n]
        arr = tv.index_to_arrow(key, stream, like=legacy)
        assert arr.type == legacy
        old[n] = tv.index_from_arrow(arr)
        assert (old[n][1].colorspace, old[n][1].color_range) == (None, None)
    proj = table.project
    wins = windows(["bt709", "untagged", "full", "untagged", "bt709"], seed=5)
    with tv.VideoReader(proj.client.store, prefix=proj.prefix) as reader:
        reqs = [tv.WindowRequest.at(*old[n], s, Video(range(5))) for n, s in wins]
        for (n, s), out in zip(wins, reader.read(reqs)):
            assert np.array_equal(out, refs[n][s : s + 5]), n
    # a tag only the container carries cannot go into an older table: it would be lost
    with pytest.raises(VideoError, match="container only"):
        tv.index_to_arrow("media/t/x.h264", tv.from_container(files["container709"]), like=legacy)


def test_appending_to_an_older_table(tmp_path, files, refs, monkeypatch):
    """A table written by a treadle without colour fields still takes new episodes."""
    for n, data in files.items():
        (tmp_path / f"{n}.mkv").write_bytes(data)
    branch = td.Client(str(tmp_path / "store"), create=True).project("p").branch()
    with monkeypatch.context() as m:  # the video column type treadle wrote before
        legacy = layout._legacy_struct_type()
        m.setattr(layout, "video_struct_type", lambda: legacy)
        with branch.transaction("old writer") as tx:
            tx.table("cams").append_episode(
                {"cam": td.VideoFile(str(tmp_path / "bt709.mkv"))}, "bt709"
            )
    assert not layout.records_colour(branch.table("cams").schema.field("cam").type)
    with branch.transaction("new writer") as tx:
        for n in ("untagged", "full"):
            tx.table("cams").append_episode({"cam": td.VideoFile(str(tmp_path / f"{n}.mkv"))}, n)
    with pytest.raises(VideoError, match=r"table 'cams' column 'cam'.*container only"):
        with branch.transaction("container-only tag") as tx:
            path = str(tmp_path / "container709.mkv")
            tx.table("cams").append_episode({"cam": td.VideoFile(path)}, "c709")
    table = branch.table("cams").pin()
    assert table.episodes().names == ["bt709", "untagged", "full"]
    col = table.to_arrow(["cam"]).column("cam")
    assert isinstance(col.type, pa.StructType) and not layout.records_colour(col.type)
    recipe = td.Recipe(
        seed=1,
        batch_size=6,
        components=[td.Component(branch.table("cams"), td.Windows({"cam": td.Video(range(4))}))],
    )
    eps = table.episodes()
    for batch in td.TrainLoader(recipe, steps=3, video_threads=1):
        for i, mo in enumerate(batch["_moment"].tolist()):
            e = int(np.searchsorted(eps.starts, mo, side="right") - 1)
            name, frame = eps.names[e], int(mo - eps.starts[e])
            assert np.array_equal(batch["cam"][i].numpy(), refs[name][frame : frame + 4]), name


def test_colour_change_mid_stream_is_refused(files):
    """One index entry per episode cannot describe two colour conventions: raise."""

    def raw(name: str) -> bytes:  # the file's packets as a raw Annex-B stream
        with av.open(io.BytesIO(files[name])) as c:
            s = c.streams.video[0]
            bsf = av.BitStreamFilterContext("h264_mp4toannexb", in_stream=s)
            return b"".join(bytes(q) for p in c.demux(s) if p.size for q in bsf.filter(p))

    # an SPS without colour keeps the earlier one's in FFmpeg's own decode too
    one = tv.from_container(raw("bt709") + raw("untagged"), fps=30)
    assert (one.index.colorspace, one.index.color_range) == (1, 1) and one.num_frames == 2 * T
    with pytest.raises(VideoError, match="change colour mid-stream"):
        tv.from_container(raw("bt709") + raw("full"), fps=30)


@pytest.mark.parametrize("matrix, name", [(8, "YCgCo"), (14, "ICtCp")])
@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
def test_a_matrix_no_read_path_converts_is_refused(tmp_path, matrix, name, codec):
    """YCgCo or ICtCp is not BT.601 with other weights: storing it is refused (a remux of
    H.264, whose SPS carries the matrix, and a re-encode, whose frames do), not read back
    converted as BT.601."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as c:
        s = c.add_stream(codec, rate=Fraction(30))
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.colorspace, s.codec_context.color_range = matrix, 1
        for i, rgb in enumerate(synthetic_frames(8, H, W, seed=1)):
            vf = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    path = tmp_path / "odd.mkv"
    path.write_bytes(buf.getvalue())
    with av.open(str(path)) as c:  # the file is tagged so: FFmpeg's own decode says it
        assert int(next(c.decode(video=0)).colorspace) == matrix
    with pytest.raises(VideoError, match=rf"odd\.mkv.*{name}"):
        tv.from_container(str(path))
    branch = td.Client(str(tmp_path / "store"), create=True).project("p").branch()
    with pytest.raises(VideoError, match=name):
        with branch.transaction("odd matrix") as tx:
            tx.table("cams").append_episode({"cam": td.VideoFile(str(path))}, "e")
    assert branch.tables() == []

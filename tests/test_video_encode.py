"""Video writing: encode, remux, index, arrow layout, bad input."""

from __future__ import annotations

import io

import av
import numpy as np
import pyarrow as pa
import pytest

import treadle.video as tv
from treadle.errors import VideoError
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames
from treadle.video.nal import nal_units

FAST = {"preset": "ultrafast"}


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return synthetic_frames(40, 48, 64)


@pytest.mark.parametrize("gop", [1, 2, 10, 30])
def test_encode_fixed_gop_closed_no_bframes_params_in_band(clip, gop):
    s = tv.encode_frames(clip, fps=30, gop=gop, **FAST)
    idx = s.index
    assert s.num_frames == len(clip) == s.meta.num_frames
    assert np.array_equal(np.flatnonzero(idx.key), np.arange(0, len(clip), gop))
    assert np.array_equal(idx.decode, np.arange(len(clip)))  # no B-frames: decode == display
    assert np.array_equal(idx.pts, np.arange(len(clip)))
    # packets tile the stream in decode order
    assert idx.offset[0] == 0 and idx.offset[-1] + idx.size[-1] == len(s.data)
    assert np.array_equal(idx.offset[1:], idx.offset[:-1] + idx.size[:-1])
    for o, n, k in zip(idx.offset, idx.size, idx.key):
        types = [t for t, _ in nal_units(s.data[o : o + n])]
        if k:
            assert types[:2] == [7, 8] and 5 in types  # SPS, PPS, then an IDR slice
        else:
            assert 5 not in types and 7 not in types


def test_encode_meta_colour_tags_and_quality(clip):
    s = tv.encode_frames(clip, fps=25, crf=18, **FAST)
    m = s.meta
    assert (m.codec, m.width, m.height, m.fps, m.pix_fmt) == ("h264", 64, 48, 25.0, "yuv420p")
    assert (m.colorspace, m.color_range, m.color_primaries, m.color_trc) == (6, 1, 6, 6)
    with av.open(io.BytesIO(s.data), format="h264") as c:
        f = next(c.decode(video=0))
        assert (int(f.colorspace), int(f.color_range)) == (6, 1)
    dec = reference_decode(s.data, "h264")
    assert dec.shape == clip.shape
    assert np.abs(dec.astype(int) - clip).mean() < 8  # lossy, but the same picture


def test_crc_is_zlib_crc32_of_packet(clip):
    import zlib

    s = tv.encode_frames(clip, gop=10, **FAST)
    i = 7
    o, n = s.index.offset[i], s.index.size[i]
    assert s.index.crc[i] == zlib.crc32(s.data[o : o + n])
    assert s.media_key("cams") == f"media/cams/{s.sha256}.h264"


def test_encode_value_dispatch(clip):
    s = tv.encode_value(tv.VideoFrames(clip, fps=30, gop=10, preset="ultrafast"))
    assert np.flatnonzero(s.index.key).tolist() == [0, 10, 20, 30]
    assert tv.encode_value(s) is s
    with pytest.raises(VideoError, match="VideoFrames"):
        tv.encode_value(clip)


@pytest.mark.parametrize(
    "frames, match",
    [
        (np.zeros((4, 48, 64, 3), np.float32), "uint8"),
        (np.zeros((48, 64, 3), np.uint8), "shape"),
        (np.zeros((4, 48, 64, 4), np.uint8), "shape"),
        (np.zeros((4, 47, 64, 3), np.uint8), "even"),
        (np.zeros((4, 48, 63, 3), np.uint8), "even"),
        (np.zeros((0, 48, 64, 3), np.uint8), "T=0"),
        ([[1, 2, 3]], "numpy"),
    ],
)
def test_bad_frames(frames, match):
    with pytest.raises(VideoError, match=match):
        tv.VideoFrames(frames)
    with pytest.raises(VideoError, match=match):
        tv.encode_frames(frames)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fps": 0}, "fps"),
        ({"fps": -3}, "fps"),
        ({"fps": float("nan")}, "fps"),
        ({"gop": 0}, "gop"),
        ({"crf": 70}, "crf"),
        ({"preset": "warp"}, "preset"),
    ],
)
def test_bad_encoder_settings(clip, kwargs, match):
    with pytest.raises(VideoError, match=match):
        tv.VideoFrames(clip, **kwargs)


def test_bad_files(tmp_path):
    with pytest.raises(VideoError, match="cannot open"):
        tv.from_container(b"not a video at all" * 20)
    with pytest.raises(VideoError, match="empty"):
        tv.VideoFile(b"")
    with pytest.raises(VideoError, match="does not exist"):
        tv.VideoFile(tmp_path / "missing.mp4")
    with pytest.raises(VideoError, match="path or bytes"):
        tv.VideoFile(123)
    # an MP4 cut short: the header promises frames the file does not have
    mp4 = make_mp4(synthetic_frames(20, 48, 64), options={"preset": "ultrafast"})
    with pytest.raises(VideoError):
        tv.from_container(mp4[: len(mp4) // 3])
    # a container with no video stream
    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as c:
        s = c.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 800), np.int16), format="s16", layout="mono"
        )
        frame.sample_rate = 8000
        for p in s.encode(frame):
            c.mux(p)
    with pytest.raises(VideoError, match="no video stream"):
        tv.from_container(buf.getvalue())


def test_remux_h264_keeps_packets_bit_exact(tmp_path):
    frames = synthetic_frames(30, 48, 64)
    mp4 = make_mp4(frames, options={"preset": "ultrafast", "g": "10"})
    path = tmp_path / "clip.mp4"
    path.write_bytes(mp4)
    s = tv.encode_value(tv.VideoFile(path))
    # every slice NAL of the file is in the stream unchanged (no re-encode)
    with av.open(io.BytesIO(mp4)) as c:
        sizes = [p.size for p in c.demux(video=0) if p.size]
    assert len(sizes) == s.num_frames == 30
    assert s.meta.fps == 30.0 and s.meta.codec == "h264"
    assert np.array_equal(reference_decode(s.data, "h264"), reference_decode(mp4))


def test_mkv_input(tmp_path):
    frames = synthetic_frames(12, 48, 64)
    mkv = make_mp4(frames, options={"preset": "ultrafast"}, fmt="matroska")
    s = tv.from_container(mkv)
    assert s.num_frames == 12
    assert np.array_equal(reference_decode(s.data, "h264"), reference_decode(mkv))


def test_other_codec_is_reencoded_to_h264():
    frames = synthetic_frames(35, 48, 64)
    m4v = make_mp4(frames, codec="mpeg4")  # not H.264: decoded and re-encoded
    s = tv.from_container(m4v, gop=15, crf=12, preset="ultrafast")
    assert s.meta.codec == "h264" and s.num_frames == 35
    assert np.flatnonzero(s.index.key).tolist() == [0, 15, 30]
    src = reference_decode(m4v).astype(int)
    got = reference_decode(s.data, "h264").astype(int)
    assert np.abs(src - got).mean() < 4


def test_arrow_layout_round_trip(clip):
    s = tv.encode_frames(clip, gop=10, **FAST)
    arr = tv.index_to_arrow("media/t/x.h264", s)
    assert arr.type == tv.video_struct_type()
    assert [f.name for f in arr.type] == [
        "stream", "offset", "size", "key", "pts", "decode", "crc",
        "width", "height", "fps", "codec", "colorspace", "color_range",
    ]  # fmt: skip
    assert len(arr) == len(clip)
    row = arr[3].as_py()
    assert row["stream"] == "media/t/x.h264" and row["width"] == 64 and row["height"] == 48
    assert row["offset"] == s.index.offset[3] and row["crc"] == s.index.crc[3]
    key, idx = tv.index_from_arrow(pa.chunked_array([arr.slice(0, 15), arr.slice(15)]))
    assert key == "media/t/x.h264"
    for name in ("offset", "size", "key", "pts", "decode", "crc"):
        assert np.array_equal(getattr(idx, name), getattr(s.index, name)), name
    assert (idx.width, idx.height, idx.fps, idx.codec) == (64, 48, 30.0, "h264")
    assert (idx.colorspace, idx.color_range) == (6, 1)  # treadle's own encode: BT.601 limited
    other = tv.index_to_arrow("media/t/y.h264", s)
    with pytest.raises(VideoError, match="more than one stream"):
        tv.index_from_arrow(pa.concat_arrays([arr, other]))


def test_a_written_video_column_is_tagged_video(tmp_path, clip):
    """The table writer (the one place video columns are made) tags the field."""
    import treadle as td
    from treadle.table.tensors import is_video

    branch = td.Client(str(tmp_path)).project("p").branch()
    with branch.transaction("write") as tx:
        tx.table("t").append_episode(
            {"wrist_camera": td.VideoFrames(clip[:6], fps=30), "x": np.arange(6, dtype=np.int32)},
            episode="ep-0",
        )
    table = branch.table("t").pin()
    field = table.schema.field("wrist_camera")
    assert field.metadata == {b"treadle:kind": b"video"} and is_video(field)
    assert not is_video(table.schema.field("x"))
    assert table.video_columns == ["wrist_camera"]
    assert field.type == tv.video_struct_type()


@pytest.mark.parametrize("bframes", [0, 2])
def test_raw_annexb_file_is_indexed_by_decoding(bframes):
    frames = synthetic_frames(30, 48, 64, seed=4)
    params = f"bframes={bframes}:keyint=10:min-keyint=10:scenecut=0"
    src = tv.from_container(
        make_mp4(frames, options={"preset": "ultrafast", "x264-params": params})
    )
    raw = tv.encode_value(tv.VideoFile(src.data, fps=15))  # a bare .h264: no timestamps
    assert raw.data == src.data
    assert np.array_equal(raw.index.decode, src.index.decode)
    assert np.array_equal(raw.index.key, src.index.key)
    assert np.array_equal(raw.index.pts, np.arange(30)) and raw.meta.fps == 15.0


def test_av1_input_is_reencoded():
    frames = synthetic_frames(24, 64, 64, seed=9)
    av1 = make_mp4(frames, codec="libsvtav1", options={"preset": "11", "g": "2"})
    with av.open(io.BytesIO(av1)) as c:
        assert c.streams.video[0].codec_context.name in ("libdav1d", "av1")
    s = tv.from_container(av1, gop=12, crf=10, preset="ultrafast")
    assert s.meta.codec == "h264" and s.num_frames == 24
    assert np.flatnonzero(s.index.key).tolist() == [0, 12]
    diff = np.abs(reference_decode(av1).astype(int) - reference_decode(s.data, "h264"))
    assert diff.mean() < 4


def test_mp4_edit_list_hiding_frames_is_reencoded_to_the_presented_frames():
    frames = synthetic_frames(20, 48, 64, seed=6)
    mp4 = make_mp4(frames, options={"preset": "ultrafast", "g": "10"}, first_pts=-3)
    shown = reference_decode(mp4)
    assert len(shown) == 17  # the edit list hides the first 3 decoded frames
    s = tv.from_container(mp4, crf=10, preset="ultrafast")
    assert s.num_frames == 17
    got = reference_decode(s.data, "h264")
    assert np.abs(got.astype(int) - shown).mean() < 4

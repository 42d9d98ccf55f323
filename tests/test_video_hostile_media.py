"""Hostile or unusual H.264 files given to ``td.VideoFile``.

A video whose SPS claims huge frames is refused at write time, naming table, episode and
column, before anything is decoded. Before: a 1.5 KB MKV whose SPS claimed 12000x8000
frames was stored, its first GOP decoded (FFmpeg concealing the missing macroblocks), and
every window of it allocated 288 MB a frame of grey.

A gradual-refresh stream (x264 ``intra-refresh``: keyframes are recovery points whose
pictures are clean only some frames later) is re-encoded, and every window reads. Before:
it was stored as it was, and a window whose frames were the first after such a keyframe
failed mid-training with ``CorruptData ... decoder produced no picture``.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

import treadle as td
from treadle.errors import VideoError
from treadle.video import nal
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames
from treadle.video.encode import encode_frames


def _ue(v: int) -> str:
    b = bin(v + 1)[2:]
    return "0" * (len(b) - 1) + b


def _claim_size(unit: bytes, mbs_w: int, mbs_h: int) -> bytes:
    """An SPS unit rewritten to claim ``mbs_w`` x ``mbs_h`` macroblocks (all else kept)."""
    calls = []

    class Recorded(nal._Bits):
        def ue(self) -> int:
            s = self.pos
            v = super().ue()
            calls.append((s, self.pos, v))
            return v

    real, nal._Bits = nal._Bits, Recorded
    try:
        sps = nal.parse_sps(unit)
    finally:
        nal._Bits = real
    want = (sps.coded_width // 16 - 1, sps.coded_height // 16 - 1)
    i = next(
        i
        for i in range(len(calls) - 1)
        if (calls[i][2], calls[i + 1][2]) == want and calls[i][1] == calls[i + 1][0]
    )
    bits = "".join(f"{x:08b}" for x in unit[1:].replace(b"\x00\x00\x03", b"\x00\x00"))
    bits = bits[: calls[i][0]] + _ue(mbs_w - 1) + _ue(mbs_h - 1) + bits[calls[i + 1][1] :]
    bits = bits.rstrip("0")[:-1] + "1"  # the stop bit, then byte alignment
    bits += "0" * (-len(bits) % 8)
    out, zeros = bytearray(), 0
    for x in (int(bits[k : k + 8], 2) for k in range(0, len(bits), 8)):
        if zeros >= 2 and x <= 3:
            out.append(3)  # emulation prevention
            zeros = 0
        out.append(x)
        zeros = zeros + 1 if x == 0 else 0
    return unit[:1] + bytes(out)


def _claiming(mbs_w: int, mbs_h: int) -> bytes:
    small = encode_frames(synthetic_frames(4, 32, 32), fps=30, gop=2).data
    return b"".join(
        b"\x00\x00\x00\x01" + (_claim_size(u, mbs_w, mbs_h) if t == nal.NAL_SPS else u)
        for t, u in nal.nal_units(small)
    )


def _mkv(annexb: bytes) -> bytes:
    buf = io.BytesIO()
    with av.open(io.BytesIO(annexb), format="h264") as c, av.open(buf, "w", format="matroska") as o:
        src = c.streams.video[0]
        dst = o.add_stream_from_template(src)
        dst.time_base = Fraction(1, 30)
        for i, p in enumerate(q for q in c.demux(src) if q.size):
            p.stream, p.time_base = dst, Fraction(1, 30)
            p.pts = p.dts = i
            p.duration = 1
            o.mux(p)
    return buf.getvalue()


@pytest.fixture
def branch(tmp_path):
    return td.Client(str(tmp_path / "root"), create=True).project("p").branch()


def _append(branch, value) -> None:
    with branch.transaction("hostile") as tx:
        tx.table("t").append_episode({"cam": value}, episode="e0")


def test_the_claiming_sps_is_what_ffmpeg_reads():
    with av.open(io.BytesIO(_mkv(_claiming(750, 500)))) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (12000, 8000)


@pytest.mark.parametrize(("mbs", "fmt"), [((750, 500), "mkv"), ((4096, 4096), "h264")])
def test_a_stream_claiming_huge_frames_is_refused_naming_its_episode(branch, mbs, fmt):
    data = _claiming(*mbs)
    data = _mkv(data) if fmt == "mkv" else data
    size = rf"{mbs[1] * 16}x{mbs[0] * 16} \(HxW\), more than 67,108,864 pixels"
    with pytest.raises(VideoError, match=rf"table 't', episode 'e0', column 'cam'.*{size}"):
        _append(branch, td.VideoFile(data))
    assert branch.tables() == []


def test_a_reencoded_video_over_the_limit_is_refused(branch, monkeypatch):
    from treadle.video import geometry

    monkeypatch.setattr(geometry, "MAX_PIXELS", 48 * 64 - 1)
    mpeg4 = make_mp4(synthetic_frames(3, 48, 64), codec="mpeg4", fmt="matroska")
    with pytest.raises(VideoError, match=r"column 'cam'.*48x64 \(HxW\), more than 3,071 pixels"):
        _append(branch, td.VideoFile(mpeg4))
    ok = make_mp4(synthetic_frames(3, 32, 32), codec="mpeg4", fmt="matroska")
    _append(branch, td.VideoFile(ok))
    assert branch.tables() == ["t"]


_REFRESH = "intra-refresh=1:keyint=10:bframes=0:scenecut=0"


@pytest.mark.parametrize("fmt", ["matroska", "mp4"])
def test_a_gradual_refresh_stream_reads_every_window(branch, fmt):
    frames = synthetic_frames(30, 64, 64)
    data = make_mp4(frames, fmt=fmt, options={"x264-params": _REFRESH})
    with av.open(io.BytesIO(data)) as c:
        keys = [k for k, p in enumerate(q for q in c.demux(c.streams.video[0]) if q.size)
                if p.is_keyframe]  # fmt: skip
    assert keys == [0, 10, 20]  # recovery points flagged as keyframes
    ref = reference_decode(data)
    _append(branch, td.VideoFile(data))
    windows = td.Windows({"cam": td.Video(range(2))})
    recipe = td.Recipe(seed=0, batch_size=29, components=[td.Component(branch.table("t"), windows)])
    batch = next(iter(td.TrainLoader(recipe, steps=1)))
    got, anchors = batch["cam"].numpy().astype(int), batch["_frame"].numpy()
    assert sorted(anchors.tolist()) == list(range(29))
    for cam, f in zip(got, anchors):
        assert np.abs(cam - ref[f : f + 2]).mean() < 4  # re-encoded: lossy, same frames


def test_an_open_gop_stream_is_still_stored_as_it_is():
    from treadle.video import nal
    from treadle.video.encode import from_container

    params = "bframes=3:keyint=10:open-gop=1:scenecut=0"
    data = make_mp4(synthetic_frames(30, 64, 64), options={"x264-params": params})
    stream = from_container(data)
    counts = {
        nal.recovery_frame_count(u) for t, u in nal.nal_units(stream.data) if t == nal.NAL_SEI
    }
    assert 0 in counts and not counts - {0, None}
    # its own packets: B-frames (decode order != display order), not treadle's re-encode
    assert len(stream.index) == 30 and (stream.index.decode != np.arange(30)).any()


def test_a_span_from_a_gradual_refresh_keyframe_is_decoded_from_further_back():
    """LeRobot v3.0's many-episode files: a span starting at an intra-refresh keyframe.
    Before: its packets were copied (a file whose first pictures FFmpeg withholds), and
    decoding it from that keyframe was short of those frames (CorruptData)."""
    from treadle.video.span import decode_span, span_value

    frames = synthetic_frames(40, 64, 64)
    data = make_mp4(frames, options={"x264-params": _REFRESH})
    ref = reference_decode(data)
    value = span_value(data, (20 / 30, 28 / 30), np.arange(8) / 30, 30.0, 1e-4, "ep")
    assert isinstance(value, td.VideoFrames)
    np.testing.assert_array_equal(value.frames, ref[20:28])
    np.testing.assert_array_equal(decode_span(data, 21 / 30, 5, 30.0, 1e-4, "ep"), ref[21:26])


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A video outside the dataset's folder, and the dataset's folder."""
    base = tmp_path_factory.mktemp("playlists")
    (base / "outside").mkdir()
    (base / "data").mkdir()
    secret = base / "outside" / "secret.ts"
    secret.write_bytes(make_mp4(synthetic_frames(6, 32, 32, seed=9), fmt="mpegts"))
    (base / "data" / "beside.ts").write_bytes(secret.read_bytes())
    return secret, base / "data"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        (
            "clip.m3u8",
            "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:1.0,\n{secret}\n#EXT-X-ENDLIST\n",
        ),
        ("clip.ffconcat", "ffconcat version 1.0\nfile 'beside.ts'\n"),
    ],
)
def test_a_playlist_given_as_a_video_is_refused(branch, outside, name, body):
    """Before: FFmpeg's HLS demuxer read the video the playlist named (any local path), and
    its frames were stored as the episode's; a concat list likewise."""
    secret, data = outside
    path = data / name
    path.write_text(body.format(secret=secret))
    with pytest.raises(VideoError, match=r"column 'cam'.*is a \w+ playlist, which names other"):
        _append(branch, td.VideoFile(path))
    assert branch.tables() == []


def _ts(frames: np.ndarray, shift: int = 0) -> bytes:
    """An MPEG-TS of ``frames`` (B-frames), its timestamps moved by ``shift`` (90 kHz)."""
    opts = {"x264-params": "keyint=5:scenecut=0:bframes=2"}
    made = make_mp4(frames, fmt="mpegts", options=opts)
    buf = io.BytesIO()
    with av.open(io.BytesIO(made)) as c, av.open(buf, "w", format="mpegts") as o:
        src = c.streams.video[0]
        dst = o.add_stream_from_template(src)
        for p in (q for q in c.demux(src) if q.size):
            p.stream = dst
            p.pts += shift
            p.dts += shift
            o.mux(p)
    return buf.getvalue()


def test_concatenated_recordings_whose_timestamps_restart_are_refused(branch):
    """``cat a.ts b.ts``: b's timestamps start again, half a frame after a's. Before: the
    episode's frames were ordered by timestamp, a's and b's interleaved (frame 1 was b's
    first), where a decoder shows a then b."""
    a, b = synthetic_frames(15, 32, 32, seed=1), synthetic_frames(15, 32, 32, seed=2)
    data = _ts(a) + _ts(b, shift=1500)
    assert len(reference_decode(data)) == 30
    with pytest.raises(VideoError, match=r"column 'cam'.*timestamps go back at the keyframe 15"):
        _append(branch, td.VideoFile(data))
    _append(branch, td.VideoFile(_ts(a)))  # one recording: stored
    assert branch.tables() == ["t"]

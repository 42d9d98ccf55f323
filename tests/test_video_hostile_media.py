"""A video whose SPS claims huge frames is refused at write time, naming table, episode and
column, before anything is decoded.

Before: a 1.5 KB MKV whose SPS claimed 12000x8000 frames was stored, its first GOP decoded
(FFmpeg concealing the missing macroblocks), and every window of it allocated 288 MB a
frame of grey: a batch of 90-frame windows asked for more memory than any host has.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import pytest

import treadle as td
from treadle.errors import VideoError
from treadle.video import nal
from treadle.video._testing import make_mp4, synthetic_frames
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

"""video/nal.py, the one H.264 NAL parser, on files FFmpeg wrote (MP4 samples, avcC, Annex-B)."""

from __future__ import annotations

import io

import av

from treadle.video._testing import make_mp4, synthetic_frames
from treadle.video.nal import (
    NAL_PPS,
    NAL_SPS,
    avcc_params,
    iter_length_prefixed,
    nal_units,
    parse_sps,
)


def test_mp4_samples_and_avcc_split_like_annexb():
    frames = synthetic_frames(12, 48, 64, seed=1)
    mp4 = make_mp4(frames, options={"x264-params": "keyint=4:bframes=2"})
    with av.open(io.BytesIO(mp4)) as c:
        stream = c.streams.video[0]
        params = avcc_params(bytes(stream.codec_context.extradata))
        assert params is not None
        size, units = params
        assert size == 4 and [u[0] & 0x1F for u in units] == [NAL_SPS, NAL_PPS]
        sps = parse_sps(units[0])
        assert (sps.width, sps.height) == (64, 48)
        bsf = av.BitStreamFilterContext("h264_mp4toannexb", in_stream=stream)
        n = 0
        for pkt in c.demux(stream):
            if not pkt.size:
                continue
            mp4_units = list(iter_length_prefixed(bytes(pkt), size))
            (annexb,) = bsf.filter(pkt)
            annexb_units = nal_units(bytes(annexb))
            # the filter puts the avcC's SPS/PPS in band before keyframes; the rest is equal
            assert [u for t, u in annexb_units if t not in (NAL_SPS, NAL_PPS)] == [
                u for t, u in mp4_units if t not in (NAL_SPS, NAL_PPS)
            ]
            if pkt.is_keyframe:
                assert [u for t, u in annexb_units if t in (NAL_SPS, NAL_PPS)] == units
            n += 1
    assert n == len(frames)


def test_avcc_params_refuses_what_is_not_an_avcc_record():
    assert avcc_params(b"") is None
    assert avcc_params(b"\x00\x00\x00\x01\x67\x42\x00") is None  # Annex-B, not avcC
    assert avcc_params(b"\x01\x64\x00\x1f\xff\xe1\x00\x20\x67") is None  # SPS cut short

"""H.264 syntax: NAL units (Annex-B byte streams, and MP4's length-prefixed samples and
avcC record), and the sequence parameter set (SPS) fields treadle reads. Every place that
splits H.264 into NAL units uses this module.

The SPS parser follows ITU-T H.264 7.3.2.1.1 (sequence parameter set) and E.1.1 (VUI) up
to the chroma location; it reports what the stream *says*, with ``None`` for the VUI
fields it leaves out (what that means is :mod:`treadle.video.colour_tags`'s business).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

NAL_SLICE = 1
NAL_IDR = 5
NAL_SEI = 6
NAL_SPS = 7
NAL_PPS = 8
_SEI_RECOVERY_POINT = 6
_HIGH_PROFILES = (100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135)


def iter_nal_units(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, unit bytes without start code) for each NAL of an Annex-B buffer, lazily."""
    for t, s, e in iter_nal_spans(data):
        yield t, data[s:e]


def iter_nal_spans(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, start, end) of each NAL of an Annex-B buffer (``data[start:end]`` is the unit
    without start code or trailing zero bytes), lazily, copying nothing."""
    i = data.find(b"\x00\x00\x01")
    while i >= 0:
        s = i + 3
        i = data.find(b"\x00\x00\x01", s)
        e = len(data) if i < 0 else i
        if i >= 0:
            while e > s and data[e - 1] == 0:
                e -= 1
        if e > s:
            yield data[s] & 0x1F, s, e


#: a start code and the header byte of an SPS (nal_ref_idc any, type 7); emulation
#: prevention keeps ``00 00 01`` out of every unit's payload, so each match is a unit
_SPS_START = re.compile(b"\x00\x00\x01[\x07\x27\x47\x67]")


def iter_sps_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each SPS unit of an Annex-B buffer (``data[start:end]`` as
    :func:`iter_nal_spans` gives it): the search runs in C, Python sees only the SPSs."""
    for m in _SPS_START.finditer(data):
        s = m.start() + 3
        i = data.find(b"\x00\x00\x01", s)
        e = len(data) if i < 0 else i
        if i >= 0:
            while e > s and data[e - 1] == 0:
                e -= 1
        yield s, e


def iter_length_prefixed(data: bytes, size: int) -> Iterator[tuple[int, bytes]]:
    """(type, unit bytes) for each NAL of an MP4 sample: units each preceded by its length
    in ``size`` big-endian bytes (the avcC record's ``lengthSizeMinusOne + 1``)."""
    i = 0
    while i + size < len(data):
        n = int.from_bytes(data[i : i + size], "big")
        unit = data[i + size : i + size + n]
        if unit:
            yield unit[0] & 0x1F, unit
        i += size + n


def avcc_params(extradata: bytes) -> tuple[int, list[bytes]] | None:
    """(NAL length size, SPS and PPS units) of an avcC record; None when it is not one."""
    if len(extradata) < 7 or extradata[0] != 1:
        return None
    size = (extradata[4] & 3) + 1
    units, i = [], 5
    for mask in (0x1F, 0xFF):  # SPS count (5 bits), then PPS count (8 bits)
        if i >= len(extradata):
            return None
        n, i = extradata[i] & mask, i + 1
        for _ in range(n):
            ln = int.from_bytes(extradata[i : i + 2], "big")
            unit = extradata[i + 2 : i + 2 + ln]
            if len(unit) != ln or not unit:
                return None
            units.append(unit)
            i += 2 + ln
    return size, units


def nal_units(data: bytes) -> list[tuple[int, bytes]]:
    """(type, unit bytes without start code) for each NAL of an Annex-B buffer."""
    return list(iter_nal_units(data))


@dataclass(frozen=True)
class Sps:
    """Fields of one SPS. VUI fields are ``None`` when the SPS does not carry them.

    ``full_range``: ``video_full_range_flag`` (present with ``video_signal_type``);
    ``matrix``/``primaries``/``transfer``: the colour description (H.273 codes, the same
    numbers as FFmpeg's AVColorSpace / AVColorPrimaries / AVColorTransferCharacteristic);
    ``chroma_loc``: ``chroma_sample_loc_type_top_field + 1`` (an AVChromaLocation code).

    ``width``/``height``: the picture after the SPS's frame cropping, exactly as the
    standard defines it; ``coded_width``/``coded_height``: the decoded picture before
    cropping (whole macroblocks); ``crop``: the cropped (left, right, top, bottom) in luma
    samples (``frame_crop_*_offset`` times the chroma unit, 7.4.2.1.1). What FFmpeg
    outputs by default is :func:`treadle.video.geometry.decoded_size`.
    """

    profile_idc: int
    width: int
    height: int
    chroma_format_idc: int
    bit_depth: int
    coded_width: int = 0
    coded_height: int = 0
    crop: tuple[int, int, int, int] = (0, 0, 0, 0)
    full_range: bool | None = None
    matrix: int | None = None
    primaries: int | None = None
    transfer: int | None = None
    chroma_loc: int | None = None


class _Bits:
    def __init__(self, rbsp: bytes):
        self.data = rbsp
        self.pos = 0

    def u(self, n: int) -> int:
        v = 0
        for _ in range(n):
            byte = self.data[self.pos >> 3] if (self.pos >> 3) < len(self.data) else 0
            v = (v << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return v

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("bad exp-Golomb code in SPS")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


def _skip_scaling_lists(b: _Bits, chroma_format_idc: int) -> None:
    for i in range(8 if chroma_format_idc != 3 else 12):
        if b.u(1):
            last, nxt = 8, 8
            for _ in range(16 if i < 6 else 64):
                if nxt:
                    nxt = (last + b.se() + 256) % 256
                last = nxt or last


def parse_sps(nal: bytes) -> Sps:
    """Parse an H.264 SPS NAL unit (header byte first, emulation bytes still in).

    Raises ``ValueError`` for a unit that is not an SPS or a malformed exp-Golomb code.
    """
    if not nal or nal[0] & 0x1F != NAL_SPS:
        raise ValueError("not an SPS NAL unit")
    b = _Bits(nal[1:].replace(b"\x00\x00\x03", b"\x00\x00"))
    profile = b.u(8)
    b.u(8)  # constraint flags
    b.u(8)  # level
    b.ue()  # seq_parameter_set_id
    chroma_format_idc, bit_depth = 1, 8
    if profile in _HIGH_PROFILES:
        chroma_format_idc = b.ue()
        if chroma_format_idc == 3:
            b.u(1)  # separate_colour_plane_flag
        bit_depth = b.ue() + 8
        b.ue()  # bit_depth_chroma_minus8
        b.u(1)  # qpprime_y_zero_transform_bypass_flag
        if b.u(1):  # seq_scaling_matrix_present_flag
            _skip_scaling_lists(b, chroma_format_idc)
    b.ue()  # log2_max_frame_num_minus4
    poc_type = b.ue()
    if poc_type == 0:
        b.ue()
    elif poc_type == 1:
        b.u(1)
        b.se()
        b.se()
        for _ in range(b.ue()):
            b.se()
    b.ue()  # max_num_ref_frames
    b.u(1)  # gaps_in_frame_num_value_allowed_flag
    mbs_w = b.ue() + 1
    map_units_h = b.ue() + 1
    frame_mbs_only = b.u(1)
    if not frame_mbs_only:
        b.u(1)
    b.u(1)  # direct_8x8_inference_flag
    coded_w, coded_h = mbs_w * 16, map_units_h * 16 * (2 - frame_mbs_only)
    crop = (0, 0, 0, 0)
    if b.u(1):  # frame_cropping_flag
        left, right, top, bottom = b.ue(), b.ue(), b.ue(), b.ue()
        sub_w = 2 if chroma_format_idc in (1, 2) else 1
        sub_h = 2 if chroma_format_idc == 1 else 1
        cx = sub_w if chroma_format_idc else 1
        cy = (sub_h if chroma_format_idc else 1) * (2 - frame_mbs_only)
        crop = (cx * left, cx * right, cy * top, cy * bottom)
    width, height = coded_w - crop[0] - crop[1], coded_h - crop[2] - crop[3]
    vui = _vui(b) if b.u(1) else {}  # vui_parameters_present_flag
    size = (width, height, chroma_format_idc, bit_depth, coded_w, coded_h)
    return Sps(profile, *size, crop, **vui)


def _vui(b: _Bits) -> dict[str, int | bool]:
    """The VUI fields :class:`Sps` reports, up to the chroma location (E.1.1)."""
    vui: dict[str, int | bool] = {}
    if b.u(1):  # aspect_ratio_info_present_flag
        if b.u(8) == 255:
            b.u(16)
            b.u(16)
    if b.u(1):  # overscan_info_present_flag
        b.u(1)
    if b.u(1):  # video_signal_type_present_flag
        b.u(3)
        vui["full_range"] = bool(b.u(1))
        if b.u(1):  # colour_description_present_flag
            vui["primaries"] = b.u(8)
            vui["transfer"] = b.u(8)
            vui["matrix"] = b.u(8)
    if b.u(1):  # chroma_loc_info_present_flag
        vui["chroma_loc"] = b.ue() + 1
        b.ue()
    return vui


def is_b_slice(units: list[tuple[int, bytes]]) -> bool:
    """Whether a picture's ``(type, unit)`` NAL units start with a B slice (``slice_type``
    1 or 6 in its first slice header, 7.3.3): a picture that may be shown before pictures
    decoded ahead of it."""
    for t, unit in units:
        if t in (NAL_SLICE, NAL_IDR):
            b = _Bits(unit[1:24].replace(b"\x00\x00\x03", b"\x00\x00"))
            try:
                b.ue()  # first_mb_in_slice
                return b.ue() % 5 == 1
            except ValueError:
                return False
    return False


def first_sps(annexb: bytes | memoryview) -> Sps | None:
    """The first SPS of an Annex-B byte string, or ``None`` when it has none."""
    for t, unit in iter_nal_units(bytes(annexb)):
        if t == NAL_SPS:
            return parse_sps(unit)
    return None


def recovery_frame_count(sei: bytes) -> int | None:
    """``recovery_frame_cnt`` of the recovery point message (D.1.8) in an SEI unit (header
    byte first), or ``None`` when it has none. Greater than 0: decoding from this picture
    gives clean pictures only that many frames later (gradual decoding refresh, as in
    x264's ``intra-refresh``); 0: from this picture on (an open GOP's I picture)."""
    rbsp = sei[1:].replace(b"\x00\x00\x03", b"\x00\x00")
    i = 0
    while i < len(rbsp) and rbsp[i] != 0x80:  # 0x80: the rbsp trailing bits
        kind = size = 0
        for field in (0, 1):
            while i < len(rbsp) and rbsp[i] == 0xFF:
                i += 1
                if field:
                    size += 255
                else:
                    kind += 255
            if i >= len(rbsp):
                return None
            if field:
                size += rbsp[i]
            else:
                kind += rbsp[i]
            i += 1
        if kind == _SEI_RECOVERY_POINT:
            try:
                return _Bits(rbsp[i : i + size]).ue()
            except ValueError:
                return None
        i += size
    return None


def refreshes_gradually(units: list[tuple[int, bytes]]) -> bool:
    """Whether a keyframe's ``(type, unit)`` NAL units are a non-IDR picture with a recovery
    point SEI whose ``recovery_frame_cnt`` is over 0 (an open GOP's I picture has 0)."""
    if any(t == NAL_IDR for t, _ in units):
        return False
    return any(t == NAL_SEI and (recovery_frame_count(u) or 0) > 0 for t, u in units)

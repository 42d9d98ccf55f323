"""Colour conventions of a YUV 4:2:0 stream: matrix, range and chroma siting.

Both read paths convert a window with its stream's matrix and range as recorded in the
video index (:mod:`treadle.video.colour_tags`, which documents where they come from and the
default for untagged streams; :func:`colour_for`); the chroma siting comes from the
H.264 sequence parameter set (SPS) that precedes every IDR in treadle's Annex-B
streams (:func:`colour_from_annexb`). Defaults follow FFmpeg: an untagged matrix is BT.601,
an untagged range is limited, and an H.264 stream without chroma location info has
its chroma *left*-sited (co-sited with even luma columns, between luma rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from treadle.video.nal import Sps, first_sps
from treadle.video.nal import parse_sps as nal_parse_sps

# Kr, Kb per matrix (ITU-T H.273 MatrixCoefficients / AVColorSpace values). The same
# choice as the CPU path (treadle.video.colour_tags.sws_colorspace): BT.709, FCC, BT.2020 (NCL
# coefficients for both 9 and 10), SMPTE 240M, and BT.601 for everything else.
_BT601 = (0.299, 0.114)
_KR_KB = {
    1: (0.2126, 0.0722),  # BT.709
    4: (0.30, 0.11),  # FCC
    7: (0.212, 0.087),  # SMPTE 240M
    9: (0.2627, 0.0593),  # BT.2020 non-constant luminance
    10: (0.2627, 0.0593),  # BT.2020 constant luminance: converted as NCL, as swscale does
}
# swscale's integer YUV->RGB table (ff_yuv2rgb_coeffs: crv, cbu, cgu, cgv in 16.16), used by
# its fast unscaled converter; BT.601 for every matrix not listed (as on the CPU path).
_SWS_INV = {
    1: (117489, 138438, 13975, 34925),
    4: (104448, 132798, 24759, 53109),
    7: (117579, 136230, 16907, 35559),
    9: (110013, 140363, 12277, 42626),
    10: (110013, 140363, 12277, 42626),
}
_SWS_INV_601 = (104597, 132201, 25675, 53279)
_MATRIX_NAMES = {"bt601": 6, "bt709": 1, "smpte240m": 7, "bt2020": 9}

# AVChromaLocation -> (horizontal, vertical) position of chroma sample (0, 0) in luma
# pixels: chroma sample (i, j) sits at luma (2i + dx, 2j + dy). Same table as
# FFmpeg's av_chroma_location_enum_to_pos (in 1/256 luma pixel there).
_CHROMA_SITING = {
    1: (0.0, 0.5),  # left (MPEG-2, H.264 default)
    2: (0.5, 0.5),  # center (MPEG-1, JPEG)
    3: (0.0, 0.0),  # top-left
    4: (0.5, 0.0),  # top
    5: (0.0, 1.0),  # bottom-left
    6: (0.5, 1.0),  # bottom
}
AVCHROMA_LOC_UNSPECIFIED = 0
AVCHROMA_LOC_LEFT = 1
AVCHROMA_LOC_CENTER = 2


@dataclass(frozen=True)
class Colour:
    """How to turn this stream's YUV into RGB.

    ``matrix`` is an ITU-T H.273 / AVColorSpace code (1 = BT.709, 4 = FCC, 7 = SMPTE 240M,
    9/10 = BT.2020; anything else, untagged included, is BT.601 as on the CPU path); ``full_range`` is True for JPEG range
    (0-255 luma) and False for limited range (16-235 luma, 16-240 chroma);
    ``chroma_loc`` is an AVChromaLocation code (0 = unspecified -> center, as
    FFmpeg's scaler assumes for frames that carry no location).
    """

    matrix: int = 6
    full_range: bool = False
    chroma_loc: int = AVCHROMA_LOC_LEFT

    @classmethod
    def named(cls, matrix: str, *, full_range: bool = False, chroma_loc: int = 1) -> Colour:
        """``Colour.named("bt709")``; matrices: bt601, bt709, smpte240m, bt2020."""
        try:
            return cls(_MATRIX_NAMES[matrix], full_range, chroma_loc)
        except KeyError:
            raise ValueError(f"unknown matrix {matrix!r}; one of {sorted(_MATRIX_NAMES)}") from None

    @property
    def kr_kb(self) -> tuple[float, float]:
        return _KR_KB.get(self.matrix, _BT601)

    @property
    def siting(self) -> tuple[float, float]:
        """(dx, dy): chroma sample (0, 0) sits at luma position (dx, dy)."""
        return _CHROMA_SITING.get(self.chroma_loc, _CHROMA_SITING[AVCHROMA_LOC_CENTER])

    def rgb_coefficients(self) -> tuple[float, float, float, float, float, float, float]:
        """(y_scale, y_offset, c_scale, r_v, g_u, g_v, b_u) for 8-bit samples.

        ``R = ys*(Y - yo) + r_v*cs*(V - 128)``, ``G = ys*(Y - yo) + cs*(g_u*(U - 128) +
        g_v*(V - 128))``, ``B = ys*(Y - yo) + b_u*cs*(U - 128)``; RGB in 0..255.
        """
        kr, kb = self.kr_kb
        kg = 1.0 - kr - kb
        if self.full_range:
            ys, yo, cs = 1.0, 0.0, 1.0
        else:
            ys, yo, cs = 255.0 / 219.0, 16.0, 255.0 / 224.0
        return (
            ys,
            yo,
            cs,
            2.0 * (1.0 - kr),
            -2.0 * kb * (1.0 - kb) / kg,
            -2.0 * kr * (1.0 - kr) / kg,
            2.0 * (1.0 - kb),
        )

    def sws_fixed_coefficients(self) -> tuple[int, int, int, int, int, int]:
        """(y, y_offset, vr, ub, ug, vg): swscale's 16-bit fixed-point conversion constants.

        Its unscaled yuv420p -> rgb24 converter (PyAV's default flags, native size)
        computes, with ``>>`` an arithmetic shift::

            y' = ((8*Y - y_offset) * y) >> 16;  u' = 8*U - 1024;  v' = 8*V - 1024
            R = clip(y' + ((v' * vr) >> 16))
            G = clip(y' + ((u' * ug) >> 16) + ((v' * vg) >> 16))
            B = clip(y' + ((u' * ub) >> 16))

        Reproducing this gives bit-identical output (checked in tests).
        """
        crv, cbu, cgu, cgv = _SWS_INV.get(self.matrix, _SWS_INV_601)
        cgu, cgv = -cgu, -cgv
        cy, oy = 1 << 16, 0
        if self.full_range:
            # C integer division truncates toward zero
            crv, cbu = crv * 224 // 255, cbu * 224 // 255
            cgu, cgv = -(-cgu * 224 // 255), -(-cgv * 224 // 255)
        else:
            cy, oy = cy * 255 // 219, 16 << 16

        def round16(v: int) -> int:
            return (v + (1 << 15)) >> 16

        return (
            round16(cy << 13),
            round16(oy << 3),
            round16(crv << 13),
            round16(cbu << 13),
            round16(cgu << 13),
            round16(cgv << 13),
        )


# --- colour from the stream's SPS (parsed by treadle.video.nal) ----------------------


@dataclass(frozen=True)
class SpsInfo:
    """What the GPU path needs from an H.264 SPS."""

    profile_idc: int
    width: int
    height: int
    chroma_format_idc: int
    bit_depth: int
    colour: Colour


def _info(sps: Sps) -> SpsInfo:
    matrix = sps.matrix if sps.matrix is not None else 2  # AVCOL_SPC_UNSPECIFIED
    loc = sps.chroma_loc if sps.chroma_loc is not None else AVCHROMA_LOC_LEFT
    colour = Colour(matrix, bool(sps.full_range), loc)
    return SpsInfo(
        sps.profile_idc, sps.width, sps.height, sps.chroma_format_idc, sps.bit_depth, colour
    )


def parse_sps(nal: bytes) -> SpsInfo:
    """Parse an H.264 SPS NAL unit (header byte first, emulation bytes still in)."""
    return _info(nal_parse_sps(nal))


def sps_from_annexb(annexb: bytes) -> SpsInfo | None:
    """The first SPS in an Annex-B byte string, or None."""
    sps = first_sps(annexb)
    return None if sps is None else _info(sps)


def colour_from_annexb(annexb: bytes, default: Colour | None = None) -> Colour:
    """Colour tags of the first SPS in ``annexb`` (``default`` or BT.601 limited if none)."""
    sps = sps_from_annexb(annexb)
    if sps is None:
        return default or Colour()
    return sps.colour


def colour_for(tags: tuple[int, int], chroma_loc: int = AVCHROMA_LOC_LEFT) -> Colour:
    """The :class:`Colour` of a stream's (colorspace, color_range) tags, as the CPU path
    converts them (:mod:`treadle.video.colour_tags`), with the chroma siting given."""
    return Colour(int(tags[0]), int(tags[1]) == 2, chroma_loc)

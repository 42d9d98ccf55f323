"""FFmpeg's C API through ctypes, on the libraries bundled with PyAV (``av.libs``).

The decode and conversion hot loop (:mod:`treadle.video.native`, :mod:`treadle.video.sws`)
calls ``avcodec_send_packet`` / ``avcodec_receive_frame`` / ``sws_scale_frame`` itself,
on the ``AVCodecContext`` a PyAV ``CodecContext`` created and opened, so that a frame
costs a few C calls instead of a PyAV ``Packet`` and ``VideoFrame`` object each.

Nothing here trusts a struct layout it has not checked: :func:`api` finds the offsets of
the ``AVFrame`` / ``AVPacket`` fields it uses and of the C pointer inside PyAV's
``Frame`` / ``Packet`` / ``CodecContext`` objects by writing distinct values through
PyAV's own setters and reading them back, and checks the pointers against PyAV's
``buffer_ptr`` / ``line_size`` / ``width`` / ``height`` / ``format``. When any check
fails (another PyAV build, another FFmpeg), :func:`api` is ``None`` and callers keep
PyAV's own objects.
"""

from __future__ import annotations

import ctypes
import glob
import os
import weakref
from dataclasses import dataclass
from typing import Any

from treadle import fastpaths

_P, _I, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
#: AVERROR(EAGAIN) and AVERROR_EOF
EAGAIN, EOF = -11, -0x20464F45
#: bytes of an AVFrame searched for a field: pts and the colour fields lie in its first
#: ~300 (FFmpeg 8; a few more in 7.x), and the struct is over 400 bytes long (FFmpeg 8.0,
#: its smallest yet): the scan stays inside it
_SCAN = 384
#: the PyAV builds whose object layouts were read (their Cython classes hold the C pointer
#: right after the type's vtable pointer); others are still checked, this only narrows it
_PYAV_MAJORS = {"17", "18"}


@dataclass(frozen=True)
class Layout:
    """Byte offsets of the fields used, checked at run time."""

    obj_ptr: int  # the C pointer in a PyAV Frame / Packet / CodecContext object
    frame_width: int
    frame_height: int
    frame_format: int
    frame_pts: int
    frame_colorspace: int
    frame_color_range: int
    frame_color_trc: int
    frame_color_primaries: int
    packet_pts: int
    packet_data: int
    packet_size: int


class Api:
    """The loaded functions and the checked :class:`Layout`."""

    def __init__(self, codec: Any, util: Any, sws: Any, layout: Layout):
        self.codec, self.util, self.sws, self.layout = codec, util, sws, layout
        self.send_packet = codec.avcodec_send_packet
        self.receive_frame = codec.avcodec_receive_frame
        self.flush_buffers = codec.avcodec_flush_buffers
        self.frame_unref = util.av_frame_unref
        self.scale_frame = sws.sws_scale_frame
        self.pix_fmt = util.av_get_pix_fmt
        self.copy_props = util.av_frame_copy_props
        lay = layout
        self.FrameView = _struct(
            ("data0", 0, _P),
            ("linesize0", 64, _I),
            ("width", lay.frame_width, _I),
            ("height", lay.frame_height, _I),
            ("format", lay.frame_format, _I),
            ("pts", lay.frame_pts, _I64),
            ("color_range", lay.frame_color_range, _I),
            ("color_primaries", lay.frame_color_primaries, _I),
            ("color_trc", lay.frame_color_trc, _I),
            ("colorspace", lay.frame_colorspace, _I),
        )
        self.PacketView = _struct(
            ("pts", lay.packet_pts, _I64),
            ("data", lay.packet_data, _P),
            ("size", lay.packet_size, _I),
        )

    def pointer(self, obj: object) -> int:
        """The C pointer a PyAV ``Frame``, ``Packet`` or ``CodecContext`` wraps."""
        return _P.from_address(id(obj) + self.layout.obj_ptr).value or 0

    def error_text(self, code: int) -> str:
        buf = ctypes.create_string_buffer(256)
        if self.util.av_strerror(code, buf, len(buf)) < 0:
            return f"FFmpeg error {code}"
        return buf.value.decode(errors="replace")


def free_with(owner: object, free: Any, ptr: int) -> None:
    """Call FFmpeg's ``free(&ptr)`` once ``owner`` is collected; never at exit: a daemon
    thread may still be decoding with it then (freed under it, the process crashed), and
    the process's memory goes with it."""
    weakref.finalize(owner, _free, free, ptr).atexit = False


def _free(free: Any, ptr: int) -> None:
    free(ctypes.byref(_P(ptr)))


def _struct(*fields: tuple[str, int, Any]) -> Any:
    """A packed ``ctypes.Structure`` with ``fields`` (name, offset, type) at their offsets:
    laid over a C struct (``from_address``), its attributes read and write those fields."""
    spec: list[tuple[str, Any]] = []
    at = 0
    for i, (name, off, kind) in enumerate(sorted(fields, key=lambda f: f[1])):
        if off < at:
            raise ValueError(f"field {name} overlaps the one before it")
        if off > at:
            spec.append((f"_gap{i}", ctypes.c_char * (off - at)))
        spec.append((name, kind))
        at = off + ctypes.sizeof(kind)
    return type("StructView", (ctypes.Structure,), {"_pack_": 1, "_fields_": spec})


def _libs() -> tuple[Any, Any, Any] | str:
    """PyAV's bundled libavcodec, libavutil and libswscale, or why they cannot be loaded."""
    import av

    root = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
    found = []
    for name in ("libavcodec", "libavutil", "libswscale"):
        so = glob.glob(os.path.join(root, f"{name}-*.so*")) or glob.glob(
            os.path.join(root, f"{name}.so*")
        )
        if len(so) != 1:
            return f"PyAV's bundled {name} is not one file in {root} (found {len(so)})"
        found.append(so[0])
    try:
        return tuple(ctypes.CDLL(p) for p in found)
    except OSError as e:
        return f"PyAV's bundled FFmpeg libraries do not load ({e})"


def _declare(codec: Any, util: Any, sws: Any) -> None:
    for f, res, args in (
        (codec.avcodec_send_packet, _I, [_P, _P]),
        (codec.avcodec_receive_frame, _I, [_P, _P]),
        (codec.avcodec_flush_buffers, None, [_P]),
        (codec.avcodec_get_class, _P, []),
        (codec.av_packet_alloc, _P, []),
        (codec.av_packet_free, None, [_P]),
        (util.av_frame_alloc, _P, []),
        (util.av_frame_free, None, [_P]),
        (util.av_frame_unref, None, [_P]),
        (util.av_frame_copy_props, _I, [_P, _P]),
        (util.av_get_pix_fmt, _I, [ctypes.c_char_p]),
        (util.av_strerror, _I, [_I, ctypes.c_char_p, ctypes.c_size_t]),
        (util.av_opt_set_int, _I, [_P, ctypes.c_char_p, _I64, _I]),
        (sws.sws_alloc_context, _P, []),
        (sws.sws_free_context, None, [_P]),
        (sws.sws_scale_frame, _I, [_P, _P, _P]),
    ):
        f.restype, f.argtypes = res, args


def _find(base: int, set_value: Any, width: int, values: tuple[int, int]) -> int:
    """The one offset (< _SCAN) of a ``width``-byte int in the struct at ``base`` that
    follows two writes through PyAV (``set_value(v)``), or -1."""
    kind = _I64 if width == 8 else _I
    hits = None
    for v in values:
        set_value(v)
        now = {off for off in range(0, _SCAN, width) if kind.from_address(base + off).value == v}
        hits = now if hits is None else hits & now
    return hits.pop() if hits and len(hits) == 1 else -1


def _probe(util: Any) -> Layout | str:
    """The checked struct layout, or which check failed."""
    import av

    if av.__version__.split(".")[0] not in _PYAV_MAJORS:
        return f"PyAV {av.__version__} is not a version whose object layout was read"
    vf = av.VideoFrame(48, 32, "yuv420p")
    obj = 24  # PyObject header (16) and the vtable pointer (8)
    ptr = _P.from_address(id(vf) + obj).value
    plane = vf.planes[0]
    if not ptr or _P.from_address(ptr).value != plane.buffer_ptr:
        return "a PyAV VideoFrame's AVFrame pointer does not hold the frame's data"
    if _I.from_address(ptr + 64).value != plane.line_size:  # linesize[0] after data[8]
        return "AVFrame.linesize is not where FFmpeg 4-8 keep it"
    w, h, fmt = 104, 108, 116  # after extended_data: width, height, nb_samples, format
    if (_I.from_address(ptr + w).value, _I.from_address(ptr + h).value) != (48, 32):
        return "AVFrame.width/height are not where FFmpeg 4-8 keep them"
    if _I.from_address(ptr + fmt).value != util.av_get_pix_fmt(b"yuv420p"):
        return "AVFrame.format is not where FFmpeg 4-8 keep it"

    def setter(name: str) -> Any:
        return lambda v: setattr(vf, name, v)

    pts = _find(ptr, setter("pts"), 8, (0x5EED_0000_1234_5678, 0x0BAD_0000_8765_4321))
    spc = _find(ptr, setter("colorspace"), 4, (9, 6))
    rng = _find(ptr, setter("color_range"), 4, (2, 1))
    trc = _find(ptr, setter("color_trc"), 4, (16, 13))
    pri = _find(ptr, setter("color_primaries"), 4, (12, 9))
    pkt = av.Packet(b"treadle-probe")
    pptr = _P.from_address(id(pkt) + obj).value
    if not pptr or min(pts, spc, rng, trc, pri) < 0:
        return "an AVFrame field (pts or a colour tag) was not found by writing through PyAV"
    # AVPacket: buf, pts, dts, data, size: a layout FFmpeg has kept since 4.x, checked here
    pkt.pts = 0x0123_0000_4567
    if _I64.from_address(pptr + 8).value != pkt.pts:
        return "AVPacket.pts is not where FFmpeg 4-8 keep it"
    if _P.from_address(pptr + 24).value != pkt.buffer_ptr or _I.from_address(pptr + 32).value != 13:
        return "AVPacket.data/size are not where FFmpeg 4-8 keep them"
    return Layout(obj, w, h, fmt, pts, spc, rng, trc, pri, 8, 24, 32)


def api() -> Api | None:
    """The checked API (loaded once per process), or ``None`` where a check failed
    (:func:`unavailable` says which; the first such call logs it once)."""
    return CHECKED.get()


def unavailable() -> str | None:
    """Why :func:`api` is ``None`` (None when it is loaded)."""
    return CHECKED.why()


def _load() -> Api | str:
    libs = _libs()
    if isinstance(libs, str):
        return libs
    codec, util, sws = libs
    try:
        _declare(codec, util, sws)
        layout = _probe(util)
    except (AttributeError, ValueError, TypeError) as e:
        return f"FFmpeg's C API does not match ({e})"
    if isinstance(layout, str):
        return layout
    out = Api(codec, util, sws, layout)
    if not _context_checks(out):
        return "a PyAV CodecContext's pointer is not an AVCodecContext"
    return out


CHECKED: fastpaths.Checked[Api] = fastpaths.Checked("native decode", _load)
"""The check (:func:`api` and :func:`unavailable` read it)."""


def _context_checks(a: Api) -> bool:
    """A PyAV H.264 decoder context's pointer is an ``AVCodecContext`` (its class is
    ``avcodec_get_class()``)."""
    import av

    ctx = av.CodecContext.create("h264", "r")
    ptr = a.pointer(ctx)
    return bool(ptr) and _P.from_address(ptr).value == a.codec.avcodec_get_class()

"""The compiled window loop: :class:`~treadle.video.native.NativeLoop`'s per-packet and
per-frame FFmpeg calls made by one C function per window (``_window_loop.c``).

Two decode threads that make a few ctypes calls per frame hand the GIL to each other a
few times per frame; each hand-over of a held GIL wakes a sleeping thread, which on a
2-core machine cost the pair 5-10% of the decode limit. Called through ctypes, the C loop
releases the GIL once per window. It makes the calls the Python loop makes, in the same
order, on the same FFmpeg objects; the rules stay in Python and go in as tables: the
wanted frames (sorted pts, each one's output position), and the source configurations
:class:`~treadle.video.sws.DirectScaler` checked against ``reformat`` (with the output
addresses, modulo 64, each was checked at). A frame of any other configuration ends the
window with "fallback", as the Python loop's :class:`~treadle.video.native.Fallback`.

The extension is built when the package is installed (``setup.py``; optional: no
compiler, no extension). Without it, :func:`load` is ``None``, :func:`treadle.info`
says why, and the Python loop runs.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

import numpy as np

from treadle import fastpaths
from treadle.video import ffmpeg

_P, _I32, _I64, _U64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
#: ``TL_ABI`` of the C file: the layout of the structures below (change both together)
ABI = 1
MAX_CONFIGS = 8
OK, FALLBACK, ERROR = 0, 1, 2
CALLS = ("avcodec_send_packet", "avcodec_receive_frame", "sws_scale_frame")


class ApiStruct(ctypes.Structure):
    """``tl_api``: FFmpeg's functions and the checked field offsets."""

    _fields_ = [
        ("send_packet", _P),
        ("receive_frame", _P),
        ("flush_buffers", _P),
        ("frame_unref", _P),
        ("copy_props", _P),
        ("scale_frame", _P),
        ("frame_width", _I64),
        ("frame_height", _I64),
        ("frame_format", _I64),
        ("frame_pts", _I64),
        ("frame_colorspace", _I64),
        ("frame_color_range", _I64),
        ("frame_color_trc", _I64),
        ("frame_color_primaries", _I64),
        ("packet_pts", _I64),
        ("packet_data", _I64),
        ("packet_size", _I64),
    ]


class ConfigStruct(ctypes.Structure):
    """``tl_config``: a checked source configuration and its checked alignments."""

    _fields_ = [
        ("format", _I32),
        ("width", _I32),
        ("height", _I32),
        ("colorspace", _I32),
        ("color_range", _I32),
        ("pad", _I32),
        ("aligned", _U64),
    ]


class WindowStruct(ctypes.Structure):
    """``tl_window``: one window's inputs and its result."""

    _fields_ = [
        ("ctx", _P),
        ("pkt", _P),
        ("frame", _P),
        ("dst", _P),
        ("sws", _P),
        ("base", _P),
        ("n_packets", _I64),
        ("offset", _P),
        ("size", _P),
        ("pts", _P),
        ("display", _P),
        ("n_wanted", _I64),
        ("wanted_pts", _P),
        ("wanted_slot", _P),
        ("taken", _P),
        ("out", _P),
        ("step", _I64),
        ("out_width", _I64),
        ("out_height", _I64),
        ("rgb24", _I64),
        ("src_color_range", _I64),
        ("src_colorspace", _I64),
        ("n_configs", _I64),
        ("configs", ConfigStruct * MAX_CONFIGS),
        ("own_colorspace", _I32 * 32),
        ("error", _I64),
        ("error_call", _I64),
        ("error_frame", _I64),
    ]


class CompiledLoop:
    """The loaded C function and the :class:`ApiStruct` it is given."""

    def __init__(self, lib: Any, a: ffmpeg.Api):
        self.run = lib.treadle_window_run
        self.run.restype = ctypes.c_int
        self.run.argtypes = [ctypes.POINTER(ApiStruct), ctypes.POINTER(WindowStruct)]
        lay = a.layout

        def addr(f: Any) -> int:
            return ctypes.cast(f, _P).value or 0

        self.api = ApiStruct(
            addr(a.send_packet),
            addr(a.receive_frame),
            addr(a.flush_buffers),
            addr(a.frame_unref),
            addr(a.copy_props),
            addr(a.scale_frame),
            lay.frame_width,
            lay.frame_height,
            lay.frame_format,
            lay.frame_pts,
            lay.frame_colorspace,
            lay.frame_color_range,
            lay.frame_color_trc,
            lay.frame_color_primaries,
            lay.packet_pts,
            lay.packet_data,
            lay.packet_size,
        )
        self.api_ref = ctypes.byref(self.api)


def load() -> CompiledLoop | None:
    """The compiled loop (loaded once per process), or ``None`` (:func:`unavailable`)."""
    return CHECKED.get()


def unavailable() -> str | None:
    """Why :func:`load` is ``None`` (``None`` when it is loaded)."""
    return CHECKED.why()


def _load() -> CompiledLoop | str:
    a = ffmpeg.api()
    if a is None:
        return f"no checked FFmpeg API: {ffmpeg.unavailable()}"
    try:
        mod = importlib.import_module("treadle.video._window_loop")
    except ImportError as e:
        return f"the extension was not built when treadle was installed ({e})"
    try:
        lib = ctypes.CDLL(mod.__file__)
        abi = lib.treadle_window_abi
        abi.restype = _I64
    except (OSError, AttributeError, TypeError) as e:
        return f"the extension does not load through ctypes ({e})"
    if abi() != ABI:
        return f"the extension is of another version ({abi()}, this treadle wants {ABI})"
    return CompiledLoop(lib, a)


CHECKED: fastpaths.Checked[CompiledLoop] = fastpaths.Checked("compiled window loop", _load)
"""The check (:func:`load` and :func:`unavailable` read it)."""


def wanted_tables(wanted_pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique wanted pts and the output position each converts into (its first)."""
    uniq, first = np.unique(np.asarray(wanted_pts, np.int64), return_index=True)
    return np.ascontiguousarray(uniq), np.ascontiguousarray(first.astype(np.int64))

"""libx264 settings that make treadle's own encodes byte-deterministic.

The same frames with the same ``crf``/``gop``/``preset`` encode to the same bytes, in any
process, after any other work, on any machine with the same libx264 build. Two settings
of the defaults broke that:

- **Threads.** libx264's default (``threads=0``) derives its thread count from the
  machine's cores, and with slice threads (PyAV's default thread type) the count is the
  number of slices per frame: a 2-core and an 8-core machine wrote different bytes.
  Encodes use :attr:`~treadle.concurrency.Concurrency.encode_threads` slice threads, a
  fixed number (slices encode independently, so a count gives the same bytes at any
  timing).
- **AVX-512.** On CPUs with AVX-512, libx264 (core 165, as bundled with PyAV) now and
  then gave a different stream for the same input: measured on this project's Xeon, two
  processes encoding a 40-frame 32x32 clip between other encodes differed in 45 of 1,200
  encodes, and in 0 of 2,400 with AVX-512 masked. Encodes use every instruction set
  libx264 detects except AVX-512 (``asm=<flags>``); the stream is then the one the
  AVX-512 path gave when it agreed with itself (the x86 kernels are bit-exact to each
  other), so nothing changes but the lottery.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform

log = logging.getLogger("treadle")


def x264_params() -> str:
    """``x264-params`` entries (``":asm=..."`` or ``""``) that keep an encode deterministic."""
    asm = _asm_flags()
    return "" if asm is None else f":asm={asm}"


@functools.cache
def _asm_flags() -> int | None:
    """libx264's detected CPU flags without AVX-512, or None when there is nothing to mask
    (no AVX-512) or the library cannot be asked (then a warning says so, once)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None  # AVX-512 is x86's
    try:
        lib = ctypes.CDLL(_library_path())
        lib.x264_cpu_detect.restype = ctypes.c_uint32
        names = _cpu_names(lib)
        detected = int(lib.x264_cpu_detect())
    except (OSError, AttributeError, StopIteration, KeyError) as e:
        log.warning(
            "treadle: cannot read libx264's CPU flags (%s); H.264 encodes on a CPU with "
            "AVX-512 may differ in bytes between runs",
            e,
        )
        return None
    avx512 = names["AVX512"] & ~names["AVX2"]
    if not detected & avx512:
        return None
    return detected & ~avx512


def _library_path() -> str:
    """The libx264 that PyAV's libavcodec loaded (mapped in this process)."""
    import av  # noqa: F401  (maps libavcodec and its libx264)

    with open("/proc/self/maps") as maps:
        return next(line.split()[-1] for line in maps if "libx264" in line)


def _cpu_names(lib: ctypes.CDLL) -> dict[str, int]:
    """``x264_cpu_names``: each instruction-set name to its flags (x264.h's table)."""

    class Name(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("flags", ctypes.c_uint32)]

    table = (Name * 64).in_dll(lib, "x264_cpu_names")
    out: dict[str, int] = {}
    for entry in table:
        if not entry.name:
            break
        out[entry.name.decode()] = int(entry.flags)
    return out

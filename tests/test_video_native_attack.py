"""Attacks on the native decode loop (:mod:`treadle.video.native`, :mod:`treadle.video.sws`):
hostile indexes and bytes give a :class:`CorruptData` naming the window and frame (never a
crash, never a write outside the batch slice), and files other tools wrote decode to the
same batches as PyAV's own path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treadle.video as tv
from treadle import fastpaths
from treadle.errors import CorruptData, VideoError
from treadle.plan.windows import Video
from treadle.storage import Store
from treadle.video import ffmpeg
from treadle.video import native as native_mod
from treadle.video._testing import synthetic_frames

WHERE = ("grasps", "ep-1", "cam")
NAMED = "table 'grasps' episode 'ep-1' column 'cam'"
GUARD = 4096


@pytest.fixture
def store(tmp_path) -> Store:
    return Store.open(str(tmp_path / "root"), create=True)


def _put(store: Store, s: tv.EncodedStream, data: bytes | None = None):
    key = s.media_key("grasps")
    store.put(f"projects/p/{key}", s.data if data is None else data)
    return tv.index_from_arrow(tv.index_to_arrow(key, s))


def _guarded(t: int, h: int, w: int, align: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A ``uint8 [t, h, w, 3]`` output at ``align`` modulo 64 inside guard bytes, and its
    buffer."""
    n = t * h * w * 3
    raw = np.full(2 * GUARD + n + 64, 0xA5, np.uint8)
    at = (align - raw.ctypes.data) % 64 + GUARD
    return raw[at : at + n].reshape(t, h, w, 3), raw


def _guards_intact(raw: np.ndarray, body: np.ndarray) -> bool:
    at = body.ctypes.data - raw.ctypes.data
    return bool((raw[:at] == 0xA5).all() and (raw[at + body.nbytes :] == 0xA5).all())


def _moved(idx: tv.StreamIndex, grow: dict[int, int]) -> tv.StreamIndex:
    """``idx`` without crcs, each packet at decode position ``d`` ``grow[d]`` bytes longer,
    the packets after it moved so that they stay contiguous."""
    dod = idx.display_of_decode
    size = np.asarray(idx.size, np.int64).copy()
    off = np.asarray(idx.offset, np.int64).copy()
    for d, extra in grow.items():
        size[dod[d]] += extra
    for d in range(1, len(idx)):
        off[dod[d]] = off[dod[d - 1]] + size[dod[d - 1]]
    return dataclasses.replace(idx, offset=off, size=size.astype(np.int32), crc=None)


#: the head of a test script run in a child process: stream(t, h, w, gop) stores a clip in
#: the store at argv[1] and gives (store, key, index)
_SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys
    import numpy as np
    import treadle.video as tv
    from treadle.errors import CorruptData
    from treadle.plan.windows import Video
    from treadle.storage import Store
    from treadle.video._testing import synthetic_frames

    def stream(t, h, w, gop):
        s = tv.encode_frames(synthetic_frames(t, h, w, seed=3), gop=gop, preset="ultrafast")
        store = Store.open(sys.argv[1], create=True)
        key = s.media_key("grasps")
        store.put(f"projects/p/{key}", s.data)
        return (store, *tv.index_from_arrow(tv.index_to_arrow(key, s)))
    """
)


def _run_script(body: str, root) -> subprocess.CompletedProcess:
    script = _SCRIPT + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=120
    )


_OVERLONG = """
    store, key, idx = stream(30, 64, 96, 10)
    dod = idx.display_of_decode
    size = np.asarray(idx.size, np.int64).copy()
    off = np.asarray(idx.offset, np.int64).copy()
    # decode position 23 claims 2 GB more than it has, 24 as much less: still contiguous,
    # the window's byte range (and so its length check) unchanged
    size[dod[23]] += 2_000_000_000
    off[dod[24]] = off[dod[23]] + size[dod[23]]
    size[dod[24]] = off[dod[25]] - off[dod[24]]
    bad = dataclasses.replace(idx, offset=off, size=size.astype(np.int32), crc=None)
    out = np.empty((8, 64, 96, 3), np.uint8)
    with tv.VideoReader(store, prefix="projects/p") as r:
        r.read([tv.WindowRequest(key, idx, range(10, 18), Video(range(8)), ("g", "e", "c"), out=out)])
        try:
            r.read([tv.WindowRequest(key, bad, range(20, 28), Video(range(8)), ("g", "e", "c"), out=out)])
        except CorruptData as e:
            print("CorruptData:", e)
"""


def test_packet_reaching_past_the_fetched_bytes_is_corrupt_not_a_crash(tmp_path):
    # before: the native loop handed FFmpeg base + offset with the index's size: it read
    # 2 GB past the window's bytes and the process died (SIGSEGV, rc -11)
    r = _run_script(_OVERLONG, tmp_path / "root")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CorruptData: table 'g' episode 'e' column 'c' frame" in r.stdout
    assert "outside the window's bytes" in r.stdout


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("case", ["overlong", "empty"])
def test_packet_index_outside_the_window_names_the_frame(
    store, monkeypatch, native, case, native_loop
):
    s = tv.encode_frames(synthetic_frames(30, 64, 96, seed=3), gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    dod = idx.display_of_decode
    if case == "overlong":  # decode position 3 reaches 100 kB past the window, 4 comes back
        bad, frame = _moved(idx, {3: 100_000, 4: -100_000}), int(dod[3])
    else:  # decode position 4 is empty
        bad, frame = _moved(idx, {4: -int(idx.size[dod[4]])}), int(dod[4])
    if not native:
        monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    body, raw = _guarded(8, 64, 96)
    with tv.VideoReader(store, prefix="projects/p") as r:
        r.read([tv.WindowRequest(key, idx, range(10, 18), Video(range(8)), WHERE, out=body)])
        with pytest.raises(CorruptData, match=f"{NAMED} frame {frame}: .*outside"):
            r.read([tv.WindowRequest(key, bad, range(0, 8), Video(range(8)), WHERE, out=body)])
    assert _guards_intact(raw, body)


@pytest.mark.parametrize("native", [True, False])
def test_read_only_out_is_refused_and_never_written(store, monkeypatch, native):
    # before: the direct and native paths wrote through the array's pointer into the
    # immutable bytes object under it (its bytes changed, no error); PyAV's path raised a
    # CorruptData "video does not decode (assignment destination is read-only)"
    s = tv.encode_frames(synthetic_frames(20, 64, 96, seed=5), gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    if not native:
        monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    blob = bytes(8 * 64 * 96 * 3)
    ro = np.frombuffer(blob, np.uint8).reshape(8, 64, 96, 3)
    good = np.empty_like(ro)
    with tv.VideoReader(store, prefix="projects/p") as r:
        r.read([tv.WindowRequest(key, idx, range(0, 8), Video(range(8)), WHERE, out=good)])
        for start in (0, 10):  # a configuration checked above, and a new address
            with pytest.raises(VideoError, match=f"{NAMED}: out is read-only"):
                r.read([tv.WindowRequest(key, idx, range(start, start + 8), Video(range(8)),
                                         WHERE, out=ro)])  # fmt: skip
    assert not any(blob)


def test_raw_pointer_writers_refuse_a_read_only_array():
    # before: both said yes (convert wrote the frame into the bytes object)
    from av.video.reformatter import VideoReformatter

    from treadle.video import cpu_decode as decode
    from treadle.video._testing import reference_frames

    s = tv.encode_frames(synthetic_frames(3, 64, 96, seed=6), gop=10, preset="ultrafast")
    frame = reference_frames(s.data, "h264")[0]
    blob = bytes(2 * 64 * 96 * 3)
    ro = np.frombuffer(blob, np.uint8).reshape(2, 64, 96, 3)
    dec = decode.Decoder()
    dec.context()
    scaler = decode.scaler_args((64, 96), (2, 0))
    assert not dec.can_run_native(ro, scaler)
    assert not dec.direct.convert(frame, ro[0], scaler, VideoReformatter())
    assert not any(blob)


@pytest.mark.parametrize("native", [True, False])
def test_decode_window_refuses_an_output_of_another_shape(monkeypatch, native):
    # before: the native loop wrote each frame at its own size, one slot of the given
    # (one row shorter) shape apart: the last frame ran past the array (guard bytes written);
    # PyAV's path raised a CorruptData "could not broadcast input array"
    from treadle.video import cpu_decode as decode
    from treadle.video.window_plan import plan_window

    if not native:
        monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    s = tv.encode_frames(synthetic_frames(20, 64, 96, seed=7), gop=10, preset="ultrafast")
    idx = s.index
    dec = decode.Decoder()
    plan = plan_window(idx, range(0, 8))
    data = s.data[plan.start : plan.end]
    for align in (0, 32):  # check the configurations of the slots below (0 or 32 mod 64)
        full, _ = _guarded(8, 64, 96, align)
        decode.decode_window(dec, data, plan, (64, 96), full, "w", (2, 0))
    body, raw = _guarded(8, 63, 96)  # one row short: 8 rows past the end, inside the guard
    with pytest.raises(VideoError, match="w: frames_out is"):
        decode.decode_window(dec, data, plan, (64, 96), body, "w", (2, 0))
    assert _guards_intact(raw, body)


def _encode(frames: np.ndarray, codec: str, pix_fmt: str, params: str, tags=None, pts=None):
    """An MP4 of ``frames`` by FFmpeg's ``codec`` (libx264 / libx264rgb) with ``params``;
    ``tags``: (colorspace, range, trc, primaries) on the stream."""
    import io
    from fractions import Fraction

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        st = c.add_stream(codec, rate=Fraction(1000 if pts else 10))
        st.width, st.height, st.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        st.options = {"preset": "fast", "x264-params": params}
        cc = st.codec_context
        if tags:
            cc.colorspace, cc.color_range, cc.color_trc, cc.color_primaries = tags
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format=pix_fmt)
            if tags:
                vf.colorspace, vf.color_range = tags[:2]
            vf.pts = pts[i] if pts else i
            for p in st.encode(vf):
                c.mux(p)
        for p in st.encode(None):
            c.mux(p)
    return buf.getvalue()


OTHER_TOOLS = {
    "interlaced_tff_mbaff": ("libx264", "yuv420p", "keyint=10:interlaced=1:tff=1:bframes=2", None),
    "cavlc_weightp_slices_aud": (
        "libx264", "yuv420p", "keyint=10:cabac=0:weightp=2:bframes=3:slices=4:aud=1", None
    ),
    "x264rgb_gbrp": ("libx264rgb", "bgr24", "keyint=10:bframes=2", None),
    "high422_10bit_bt2020_hlg_full": ("libx264", "yuv422p10le", "keyint=10", (9, 2, 18, 9)),
    "vfr_b_pyramid_open_gop": (
        "libx264", "yuv420p", "keyint=10:bframes=3:b-pyramid=normal:open-gop=1", None
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(OTHER_TOOLS))
@pytest.mark.parametrize("size", [None, (32, 48)])
def test_other_tools_files_native_equals_pyav(store, monkeypatch, name, size, native_loop):
    codec, pix_fmt, params, tags = OTHER_TOOLS[name]
    frames = synthetic_frames(24, 64, 96, seed=len(name))
    pts = np.cumsum(np.random.default_rng(1).integers(1, 7, 24)).tolist() if "vfr" in name else None
    key, idx = _put(store, tv.from_container(_encode(frames, codec, pix_fmt, params, tags, pts)))
    wins = [np.arange(0, 8), np.arange(5, 17), np.arange(16, 24), np.array([23, 2, 11, 11])] * 2
    done = []
    real = native_mod.NativeLoop.run
    monkeypatch.setattr(native_mod.NativeLoop, "run", lambda *a: done.append(real(*a)))

    def read():
        reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w)), size=size), WHERE) for w in wins]
        with tv.VideoReader(store, prefix="projects/p") as r:
            return r.read(reqs)

    got = read()
    assert len(done) >= 3  # the native loop ran (windows of configurations checked)
    monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    for a, b in zip(got, read()):
        np.testing.assert_array_equal(a, b)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_thousands_of_native_windows_and_readers_do_not_grow_memory(store):
    s = tv.encode_frames(synthetic_frames(40, 64, 96, seed=8), gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    bad = bytearray(s.data)  # and windows that fail in the native loop, in between
    dod = idx.display_of_decode
    a, b = int(idx.offset[dod[21]]), int(idx.offset[dod[28]])
    bad[a:b] = np.random.default_rng(0).integers(0, 256, b - a, dtype=np.uint8).tobytes()
    store.put("projects/p/bad.h264", bytes(bad))
    nocrc = dataclasses.replace(idx, crc=None)
    out = np.empty((8, 64, 96, 3), np.uint8)
    rng = np.random.default_rng(0)

    def windows(reader: tv.VideoReader, n: int) -> None:
        for i in range(n):
            st = int(rng.integers(0, 32))
            reader.read([tv.WindowRequest(key, idx, range(st, st + 8), Video(range(8)), WHERE,
                                          out=out)])  # fmt: skip
            if i % 10 == 0:
                with pytest.raises(CorruptData):
                    reader.read([tv.WindowRequest("bad.h264", nocrc, range(20, 28), Video(range(8)),
                                                  WHERE, out=out)])  # fmt: skip

    with tv.VideoReader(store, prefix="projects/p") as r:
        windows(r, 300)  # warm: pools and checked configurations
        before = _rss_mib()
        windows(r, 3000)
    for _ in range(200):
        with tv.VideoReader(store, prefix="projects/p", threads=2) as r:
            windows(r, 2)
    # a leaked frame per window (~9 kB of pixels, more with its pool) would be > 30 MiB
    assert _rss_mib() - before < 16


def _concat(a: tv.EncodedStream, b: tv.EncodedStream) -> tuple[bytes, tv.StreamIndex]:
    """``b``'s packets after ``a``'s, one index (``a``'s size and tags, no crcs)."""
    x, y = a.index, b.index
    cat = np.concatenate
    index = dataclasses.replace(
        x,
        offset=cat([np.asarray(x.offset, np.int64), np.asarray(y.offset, np.int64) + len(a.data)]),
        size=cat([x.size, y.size]).astype(np.int32),
        key=cat([x.key, y.key]),
        pts=cat([np.asarray(x.pts, np.int64), np.asarray(y.pts, np.int64) + int(x.pts[-1]) + 1]),
        decode=cat([x.decode, np.asarray(y.decode) + len(x)]).astype(np.int32),
        crc=None,
    )
    return a.data + b.data, index


def test_a_frame_of_another_size_than_the_index_says_is_corrupt(store, monkeypatch, native_loop):
    # both paths resized it silently to the index's size (a 128x192 frame came out 64x96)
    first = tv.encode_frames(synthetic_frames(20, 64, 96, seed=1), gop=10, preset="ultrafast")
    other = tv.encode_frames(synthetic_frames(20, 128, 192, seed=2), gop=10, preset="ultrafast")
    data, idx = _concat(first, other)
    store.put("projects/p/cat.h264", data)
    for api in (None, False):
        if api is False:
            monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
        body, raw = _guarded(14, 64, 96)
        with tv.VideoReader(store, prefix="projects/p") as r:
            r.read([tv.WindowRequest("cat.h264", idx, range(0, 14), Video(range(14)), WHERE,
                                     out=body)])  # fmt: skip
            with pytest.raises(
                CorruptData, match="frame 20: decodes to 192x128, the episode's index says 96x64"
            ):
                r.read([tv.WindowRequest("cat.h264", idx, range(14, 28), Video(range(14)), WHERE,
                                         out=body)])  # fmt: skip
        assert _guards_intact(raw, body)


@pytest.mark.parametrize("second", ["yuv444p", "interlaced"])
def test_stream_changing_format_mid_window_stays_in_the_batch(
    store, monkeypatch, second, native_loop
):
    # the second stream's frames meet configurations the first window did not check: the
    # native loop falls back before writing one, PyAV's path converts them; nothing is
    # written outside the window's slots
    first = tv.encode_frames(synthetic_frames(20, 64, 96, seed=1), gop=10, preset="ultrafast")
    pix, params = ("yuv444p", "keyint=10") if second == "yuv444p" else (
        "yuv420p", "keyint=10:interlaced=1:tff=1")  # fmt: skip
    other = tv.from_container(_encode(synthetic_frames(20, 64, 96, seed=2), "libx264", pix, params))
    data, idx = _concat(first, other)
    store.put("projects/p/cat.h264", data)
    got = []
    for api in (None, False):
        if api is False:
            monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
        body, raw = _guarded(14, 64, 96)
        with tv.VideoReader(store, prefix="projects/p") as r:
            r.read([tv.WindowRequest("cat.h264", idx, range(0, 14), Video(range(14)), WHERE,
                                     out=body)])  # fmt: skip
            r.read([tv.WindowRequest("cat.h264", idx, range(14, 28), Video(range(14)), WHERE,
                                     out=body)])  # fmt: skip
        assert _guards_intact(raw, body)
        got.append(body.copy())
    np.testing.assert_array_equal(got[0], got[1])


_EXIT_WHILE_DECODING = """
    from treadle.read.prefetch import prefetch

    store, key, idx = stream(60, 240, 320, 60)
    out = np.empty((59, 240, 320, 3), np.uint8)
    reader = tv.VideoReader(store, prefix="projects/p")
    req = tv.WindowRequest(key, idx, range(1, 60), Video(range(59)), ("g", "e", "c"), out=out)

    def batches():
        while True:
            yield reader.read([req])

    it = prefetch(batches(), depth=1)
    next(it)
    print("leaving")  # with the producer thread in the native loop
"""


def test_ffmpeg_objects_are_not_freed_by_the_exit_hook():
    # before: every free_with finalizer had atexit=True (the child processes below crashed)
    import weakref

    from treadle.video import cpu_decode as decode

    dec = decode.Decoder()
    assert dec.native is not None
    mine = [f for f in list(weakref.finalize._registry) if (f.peek() or (0, 0))[1] is ffmpeg._free]
    assert len(mine) >= 4  # the loop's packet and frame, the scaler's context and frame
    assert not any(f.atexit for f in mine)


@pytest.mark.slow  # child processes
def test_leaving_the_interpreter_while_a_thread_decodes_does_not_crash(tmp_path):
    # before: the weakref.finalize exit hook (registered after prefetch's, so run before
    # it stops the producers) freed the AVFrame / AVPacket / SwsContext the producer thread
    # was decoding with: SIGSEGV at exit (rc -11 in 5 of 6 runs on a busy machine, 3 of 8
    # on another: a use after free, not always a crash); PyAV's path exited with 0
    for k in range(3):
        r = _run_script(_EXIT_WHILE_DECODING, tmp_path / f"root{k}")
        assert "leaving" in r.stdout
        assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_usable_size")
def test_the_layout_probe_reads_only_inside_an_avframe():
    # before: _SCAN was 448 bytes, past the 424 bytes glibc holds for FFmpeg 8's AVFrame
    # (the probe read the heap after it; a match there would also have made the field's
    # offset ambiguous)
    import ctypes

    api = ffmpeg.api()
    assert api is not None
    libc = ctypes.CDLL(None)
    libc.malloc_usable_size.restype, libc.malloc_usable_size.argtypes = (
        ctypes.c_size_t, [ctypes.c_void_p])  # fmt: skip
    frame = api.util.av_frame_alloc()
    try:
        assert ffmpeg._SCAN <= libc.malloc_usable_size(frame)
    finally:
        api.util.av_frame_free(ctypes.byref(ctypes.c_void_p(frame)))
    lay = api.layout
    colour = (lay.frame_colorspace, lay.frame_color_range, lay.frame_color_trc,
              lay.frame_color_primaries)  # fmt: skip
    assert max(lay.frame_pts + 8, *(c + 4 for c in colour)) <= ffmpeg._SCAN

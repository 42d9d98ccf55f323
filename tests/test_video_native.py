"""The native decode loop (:mod:`treadle.video.native`: FFmpeg's send/receive calls on
PyAV's context, frames converted by the checked :class:`DirectScaler`) gives the same
windows as PyAV's own packets and frames, on files other tools wrote; it falls back to
PyAV, before writing a frame, for configurations not yet checked or refused; and without
the checked API everything still decodes through PyAV."""

from __future__ import annotations

import numpy as np
import pytest

import treadle.video as tv
from treadle import fastpaths
from treadle.errors import CorruptData
from treadle.plan.windows import Video
from treadle.storage import Store
from treadle.video import cpu_decode as decode
from treadle.video import ffmpeg, native
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames

WHERE = ("grasps", "ep-1", "cam")
pytestmark = pytest.mark.usefixtures("native_loop")  # each test with both window loops


@pytest.fixture
def store(tmp_path) -> Store:
    return Store.open(str(tmp_path / "root"), create=True)


@pytest.fixture
def runs(monkeypatch):
    """Counts of native loop runs: finished, fallen back, failed."""
    seen = {"done": 0, "fallback": 0, "error": 0}
    real = native.NativeLoop.run

    def run(self, *a, **k):
        try:
            out = real(self, *a, **k)
        except native.Fallback:
            seen["fallback"] += 1
            raise
        except native.NativeError:
            seen["error"] += 1
            raise
        seen["done"] += 1
        return out

    monkeypatch.setattr(native.NativeLoop, "run", run)
    return seen


def _put(store: Store, s: tv.EncodedStream) -> tuple[str, tv.StreamIndex]:
    key = s.media_key("grasps")
    store.put(f"projects/p/{key}", s.data)
    return tv.index_from_arrow(tv.index_to_arrow(key, s))


def _windows(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [np.arange(0, min(n, 12))]
    for _ in range(6):
        length = int(rng.integers(1, min(n, 24) + 1))
        start = int(rng.integers(0, n - length + 1))
        out.append(np.arange(start, start + length))
    out.append(rng.permutation(n)[:5])  # sparse and unordered
    return out


def _read(store, key, idx, wins, size=None):
    reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w)), size=size), WHERE) for w in wins]
    with tv.VideoReader(store, prefix="projects/p") as reader:
        return reader.read(reqs)


ENCODES = {
    "bframes_open_gop": {
        "preset": "ultrafast",
        "x264-params": "bframes=3:b-pyramid=normal:keyint=12:min-keyint=12:scenecut=0:open-gop=1",
    },
    "bt709_full_range": {
        "preset": "ultrafast",
        "x264-params": "keyint=10:colorprim=bt709:transfer=bt709:colormatrix=bt709:fullrange=on",
    },
    "bt601_tagged": {"preset": "ultrafast", "x264-params": "keyint=8:colormatrix=smpte170m"},
}


@pytest.mark.parametrize("name", sorted(ENCODES))
@pytest.mark.parametrize("hw", [(48, 64), (66, 98)])
def test_native_windows_equal_pyav_and_sequential_decode(store, runs, monkeypatch, name, hw):
    frames = synthetic_frames(40, *hw, seed=hw[0])
    mp4 = make_mp4(frames, options=ENCODES[name])
    s = tv.from_container(mp4)
    key, idx = _put(store, s)
    ref = reference_decode(mp4)
    wins = _windows(len(idx), seed=hw[1])
    got = _read(store, key, idx, wins)
    for w, out in zip(wins, got):
        np.testing.assert_array_equal(out, ref[w])
    if hw[1] % 16 == 0:
        # a window whose first frame meets an unchecked configuration (here: each new
        # address modulo 64 of the fresh outputs) goes back to PyAV, which checks it
        assert 1 <= runs["fallback"] <= 4 and runs["error"] == 0
        assert runs["done"] + runs["fallback"] == len(wins)
    else:  # rows the direct path cannot write: PyAV throughout
        assert runs == {"done": 0, "fallback": 0, "error": 0}
    # the same through PyAV alone
    monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked.fixed("native decode", None))
    for w, out in zip(wins, _read(store, key, idx, wins)):
        np.testing.assert_array_equal(out, ref[w])


def test_resized_windows_run_natively_and_equal_reformat(store, runs):
    frames = synthetic_frames(30, 60, 80, seed=5)
    s = tv.encode_frames(frames, gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    wins = _windows(len(idx), seed=1)
    got = _read(store, key, idx, wins, size=(32, 48))
    refs = tv._testing.reference_frames(s.data, "h264")
    scaler = decode.scaler_args((32, 48), (2, 0))
    from av.video.reformatter import VideoReformatter

    rf = VideoReformatter()
    ref = np.stack([rf.reformat(f, **scaler).to_ndarray() for f in refs])
    for w, out in zip(wins, got):
        np.testing.assert_array_equal(out, ref[w])
    assert runs["done"] >= len(wins) - 4 and runs["fallback"] <= 4


def test_refused_configuration_stays_on_pyav(store, runs, monkeypatch):
    monkeypatch.setattr(tv.sws.DirectScaler, "_check", lambda self, *a: False)
    frames = synthetic_frames(30, 48, 64, seed=2)
    s = tv.encode_frames(frames, gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    wins = _windows(len(idx), seed=3)
    for w, out in zip(wins, _read(store, key, idx, wins)):
        np.testing.assert_array_equal(out, reference_decode(s.data, "h264")[w])
    # the first window met an unchecked frame; PyAV refused it there; no native run since
    assert runs == {"done": 0, "fallback": 1, "error": 0}


def test_without_the_checked_api_everything_decodes_through_pyav(store, runs, monkeypatch):
    monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked("native decode", ffmpeg._load))
    monkeypatch.setattr(ffmpeg, "_PYAV_MAJORS", set())  # the layout check now fails
    assert ffmpeg.api() is None
    dec = decode.Decoder()
    assert dec.native is None and not dec.direct.available
    frames = synthetic_frames(20, 48, 64, seed=4)
    s = tv.encode_frames(frames, gop=10, preset="ultrafast")
    key, idx = _put(store, s)
    wins = _windows(len(idx), seed=4)
    for w, out in zip(wins, _read(store, key, idx, wins)):
        np.testing.assert_array_equal(out, reference_decode(s.data, "h264")[w])
    assert runs == {"done": 0, "fallback": 0, "error": 0}


def test_native_decode_error_names_the_window_and_frame(store, runs):
    s = tv.encode_frames(synthetic_frames(60, 48, 64), gop=30, preset="ultrafast")
    key, idx = _put(store, s)
    nocrc = tv.StreamIndex(**{**idx.__dict__, "crc": None})
    junk = bytearray(s.data)
    a, b = int(idx.offset[31]), int(idx.offset[40])
    junk[a:b] = np.random.default_rng(0).integers(0, 256, b - a, dtype=np.uint8).tobytes()
    store.put(f"projects/p/{key}", bytes(junk))
    buf = np.empty((20, 48, 64, 3), np.uint8)  # one address: one checked configuration

    def req(frames):
        return tv.WindowRequest(key, nocrc, frames, Video(range(len(frames))), WHERE,
                                out=buf[: len(frames)])  # fmt: skip

    with tv.VideoReader(store, prefix="projects/p") as reader:
        (ok,) = reader.read([req(np.arange(0, 20))])
        np.testing.assert_array_equal(ok, reference_decode(s.data, "h264")[:20])
        with pytest.raises(CorruptData, match="table 'grasps' episode 'ep-1' column 'cam'"):
            reader.read([req(np.arange(30, 40))])
        assert runs == {"done": 0, "fallback": 1, "error": 1}  # the native loop raised it
        (again,) = reader.read([req(np.arange(5, 15))])  # and the next window decodes
        np.testing.assert_array_equal(again, reference_decode(s.data, "h264")[5:15])
    assert runs == {"done": 1, "fallback": 1, "error": 1}

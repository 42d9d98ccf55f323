"""The compiled window loop (:mod:`treadle.video.window_loop`): built with the package, it
decodes windows to the same bytes as the Python loop at 1 and 2 threads, it holds no GIL
while it decodes, and where it is missing or of another version the Python loop runs and
:func:`treadle.info` says why (one warning)."""

from __future__ import annotations

import ctypes
import importlib
import logging

import numpy as np
import pytest

import treadle as td
import treadle.video as tv
from treadle import fastpaths
from treadle.plan.windows import Video
from treadle.storage import Store
from treadle.video import cpu_decode, native, window_loop
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames

WHERE = ("grasps", "ep-1", "cam")


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """An open-GOP B-frame stream another tool wrote, in a store, with its reference frames."""
    root = tmp_path_factory.mktemp("wl") / "root"
    store = Store.open(str(root), create=True)
    frames = synthetic_frames(60, 64, 96, seed=11)
    mp4 = make_mp4(
        frames,
        options={
            "preset": "ultrafast",
            "x264-params": "bframes=3:b-pyramid=normal:keyint=12:min-keyint=12:open-gop=1",
        },
    )
    s = tv.from_container(mp4)
    store.put(f"projects/p/{s.media_key('grasps')}", s.data)
    key, idx = tv.index_from_arrow(tv.index_to_arrow(s.media_key("grasps"), s))
    return store, key, idx, reference_decode(mp4)


@pytest.fixture
def fresh(monkeypatch, caplog):
    """The window loop not loaded yet in this process, no fast path recorded off."""
    monkeypatch.setattr(
        window_loop, "CHECKED", fastpaths.Checked("compiled window loop", window_loop._load)
    )
    monkeypatch.setattr(fastpaths, "_OFF", {})
    caplog.set_level(logging.WARNING, logger="treadle")
    return caplog


def _windows(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = [np.arange(s, s + 16) for s in range(0, n - 16, 5)]
    out += [rng.permutation(n)[:6], np.array([40, 3, 3, 17, 40])]  # unordered, repeats
    return out


def _read(stream, threads: int) -> list[np.ndarray]:
    store, key, idx, _ = stream
    reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w))), WHERE) for w in _windows(len(idx))]
    with tv.VideoReader(store, prefix="projects/p", threads=threads) as reader:
        return [np.array(x) for x in reader.read(reqs)]


@pytest.mark.parametrize("threads", [1, 2])
def test_two_decode_threads_give_the_reference_frames(stream, native_loop, threads):
    ref = stream[3]
    for w, got in zip(_windows(len(ref)), _read(stream, threads)):
        np.testing.assert_array_equal(got, ref[w])


def test_the_compiled_loop_runs_without_the_gil():
    loop = window_loop.load()
    assert loop is not None, window_loop.unavailable()
    # a ctypes function of a CDLL releases the GIL for the call; a PyDLL's would hold it
    assert not loop.run._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert cpu_decode.Decoder().native.compiled is loop


def _offs(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "compiled window loop is off" in r.message]


def test_without_the_extension_the_python_loop_runs_and_info_says_why(stream, fresh, monkeypatch):
    real = importlib.import_module

    def no_extension(name, *a, **k):
        if name == "treadle.video._window_loop":
            raise ImportError("No module named 'treadle.video._window_loop'")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", no_extension)
    assert window_loop.load() is None and window_loop.load() is None
    why = window_loop.unavailable()
    assert why and "not built when treadle was installed" in why
    (rec,) = _offs(fresh)
    assert why in rec.message and "GIL" in rec.message  # what runs instead
    assert cpu_decode.Decoder().native.compiled is None
    ran = []
    real_receive = native.NativeLoop._receive
    monkeypatch.setattr(native.NativeLoop, "_receive", lambda *a: ran.append(1) or real_receive(*a))
    ref = stream[3]
    for w, got in zip(_windows(len(ref)), _read(stream, 2)):
        np.testing.assert_array_equal(got, ref[w])
    assert ran  # the Python loop decoded them
    path = td.info().paths["compiled window loop"]
    assert not path.on and path.reason == why
    assert len(_offs(fresh)) == 1


def test_an_extension_of_another_version_is_not_called(fresh, monkeypatch):
    monkeypatch.setattr(window_loop, "ABI", window_loop.ABI + 1)
    assert window_loop.load() is None
    assert "of another version" in window_loop.unavailable()

"""td.info() / ``treadle info``: every CPU fast path is on with the pinned versions, and a
path that goes off says so once, through the ``treadle`` logger, with its reason."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import treadle as td
from treadle import fastpaths
from treadle.read import fixed
from treadle.video import ffmpeg, sws, window_loop

CPU_PATHS = (
    "native decode",
    "compiled window loop",
    "direct conversion",
    "fixed-width reads",
    "cached reads",
    "unflushed chunks",
)


@pytest.fixture
def fresh(monkeypatch, caplog):
    """No fast path recorded off yet; the treadle logger's records captured."""
    monkeypatch.setattr(fastpaths, "_OFF", {})
    caplog.set_level(logging.WARNING, logger="treadle")
    return caplog


def _offs(caplog, path):
    return [
        r
        for r in caplog.records
        if r.name == "treadle" and r.levelno == logging.WARNING and f"{path} is off" in r.message
    ]


def test_every_cpu_fast_path_is_on_with_the_pinned_versions_in_a_fresh_process():
    out = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "info", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    for path in CPU_PATHS:
        assert found["fast_paths"][path] == {
            "on": True,
            "reason": None,
            "instead": fastpaths.PATHS[path],
        }
    nvdec = found["fast_paths"]["nvdec"]
    assert nvdec["on"] is False and "CUDA" in nvdec["reason"]  # no GPU on this machine
    assert found["versions"]["pylance"] == "14.0.2" and found["versions"]["av"] == "18.1.0"
    assert "is off" not in out.stderr  # no CPU path went off while probing
    cache = found["object_cache"]  # the session's folder (conftest), the default bound
    assert cache["directory"] == os.environ["TREADLE_CACHE_DIR"]
    assert cache["max_bytes"] == 16 << 30 and cache["used_bytes"] >= 0


def test_treadle_info_prints_each_path_and_refuses_a_root():
    from treadle.cli import main

    assert main(["info", "--root", "/tmp/x"]) == 2  # info reads no store


def test_a_checked_fast_path_loads_once_logs_once_and_says_why(fresh):
    calls = []
    off = fastpaths.Checked("nvdec", lambda: calls.append(1) or "no NVIDIA GPU here")
    assert off.get() is None and off.get() is None and off.why() == "no NVIDIA GPU here"
    assert calls == [1]
    (rec,) = _offs(fresh, "nvdec")
    assert "no NVIDIA GPU here" in rec.message
    on = fastpaths.Checked("nvdec", lambda: calls.append(2) or ("a decoder",))
    assert on.get() == ("a decoder",) and on.why() is None and calls == [1, 2]
    assert fastpaths.Checked.fixed("nvdec", None, "set by a test").why() == "set by a test"
    assert len(_offs(fresh, "nvdec")) == 1  # fixed ones log nothing
    with pytest.raises(KeyError, match="no fast path 'gpu'"):
        fastpaths.Checked("gpu", lambda: "x")


def test_native_decode_off_logs_one_warning_with_its_reason(fresh, monkeypatch):
    monkeypatch.setattr(ffmpeg, "CHECKED", fastpaths.Checked("native decode", ffmpeg._load))
    # the compiled loop rests on the API: a fresh check here, undone after (it would stay off)
    fresh_loop = fastpaths.Checked("compiled window loop", window_loop._load)
    monkeypatch.setattr(window_loop, "CHECKED", fresh_loop)
    monkeypatch.setattr(ffmpeg, "_PYAV_MAJORS", set())  # the layout check now fails
    assert ffmpeg.api() is None and ffmpeg.api() is None
    why = ffmpeg.unavailable()
    assert why and "object layout" in why
    sws.DirectScaler()
    sws.DirectScaler()
    (rec,) = _offs(fresh, "native decode")
    assert why in rec.message and "PyAV's objects" in rec.message
    (rec,) = _offs(fresh, "direct conversion")  # it rests on the same checked API
    assert why in rec.message
    found = td.info().paths
    assert not found["native decode"].on and found["native decode"].reason == why
    assert not found["direct conversion"].on
    assert not found["compiled window loop"].on and why in found["compiled window loop"].reason


def test_a_conversion_check_that_fails_turns_direct_conversion_off_once(fresh, monkeypatch):
    monkeypatch.setattr(sws.DirectScaler, "scale", lambda self, *a: -1)
    found = td.info().paths["direct conversion"]
    assert not found.on and "did not give reformat's bytes" in found.reason
    td.info()
    assert len(_offs(fresh, "direct conversion")) == 1


@pytest.fixture
def branch(local_root):
    return td.Client(local_root).project("p").branch("main")


def test_a_wide_column_that_does_not_map_logs_once_and_reads_the_same(fresh, monkeypatch, branch):
    wide = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)  # 256 bytes a row
    narrow = np.arange(8 * 7, dtype=np.float32).reshape(8, 7)
    branch.table("t").append_episode({"wide": wide, "narrow": narrow}, episode="e")
    table = branch.table("t").pin()
    reader = fixed.FixedReader()
    assert reader.path(table, "wide") == "mapped" and reader.path(table, "narrow") != "mapped"
    assert _offs(fresh, "fixed-width reads") == []  # narrow columns never map: not "off"
    monkeypatch.setattr(fixed, "_FULL_ZIP", re.compile("never matches"))
    other = fixed.FixedReader()
    got = other.read(table, [5, 1, 5], ["wide", "narrow"])
    np.testing.assert_array_equal(got["wide"], wide[[5, 1, 5]])
    np.testing.assert_array_equal(got["narrow"], narrow[[5, 1, 5]])
    assert other.path(table, "wide") != "mapped"
    (rec,) = _offs(fresh, "fixed-width reads")
    assert "'wide'" in rec.message and "full-zip" in rec.message
    assert not td.info().paths["fixed-width reads"].on
    reader.close()
    other.close()


@pytest.mark.parametrize("setting", ["TREADLE_CACHE_MIN_FREE", "TREADLE_CACHE_BYTES"])
def test_a_bad_cache_setting_is_reported_by_info_not_raised(fresh, monkeypatch, capsys, setting):
    # "info itself never fails": a bad size turned td.info() and `treadle info` into a traceback
    from treadle.cli import main

    monkeypatch.setenv(setting, "abc")
    found = td.info()
    cached = found.paths["cached reads"]
    assert not cached.on and f"{setting}='abc' is not a size" in cached.reason
    assert found.object_cache == {}  # no cache is configured: empty, as when it is off
    assert main(["info"]) == 0
    assert f"{setting}='abc'" in capsys.readouterr().out

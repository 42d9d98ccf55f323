"""Image (binary) columns of object-store tables read from copies of their data files in the
object cache (``treadle.read.cached_values``), equal to a Lance take of the table."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import treadle as td
from treadle import fastpaths
from treadle.read.cached_values import CachedValues


def _jpegs(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (16, 24, 3), np.uint8)).save(b, format="JPEG")
        out.append(b.getvalue())
    return out


@pytest.fixture(scope="module")
def s3_table(s3_server):
    url = s3_server.url("cached-values")
    branch = (
        td.Client(url, create=True, storage_options=s3_server.storage_options())
        .project("p")
        .branch()
    )
    values = []
    for e, n in enumerate((7, 5, 9)):  # one fragment per episode
        frames = _jpegs(n, e)
        branch.table("cams").append_episode({"cam": frames}, episode=f"e{e}")
        values += frames
    return branch.table("cams").pin(), values


def test_rows_come_from_the_cached_copies_and_equal_the_take(s3_table, tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    table, values = s3_table
    cached = CachedValues()
    rows = np.array([0, 3, 6, 7, 11, 12, 20], np.int64)
    assert cached.take(table, rows, "cam") == [values[r] for r in rows]
    files = {df.path for f in table.dataset.get_fragments() for df in f.metadata.files}
    copies = [p for p in (tmp_path / "cache").iterdir() if "." not in p.name]
    assert len(files) >= 1 and len(copies) == len(files)
    assert cached.take(table, np.array([20]), "cam") == [values[20]]  # files kept open
    cached.close()
    local = td.Client(str(tmp_path / "local"), create=True).project("p").branch()
    local.table("cams").append_episode({"cam": values[:3]}, episode="e0")
    got = CachedValues(copy_objects=False).take(local.table("cams").pin(), rows[:1], "cam")
    assert got == values[:1]  # a local table's own files: read in place, never copied
    assert len([p for p in (tmp_path / "cache").iterdir() if "." not in p.name]) == len(files)


def test_no_copy_when_the_cache_is_off_or_too_small(s3_table, tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fastpaths, "_OFF", {})
    table, _ = s3_table
    assert CachedValues(copy_objects=False).take(table, np.array([1]), "cam") is None
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "1K")
    assert CachedValues().take(table, np.array([1]), "cam") is None
    assert "larger than the object cache's bound" in fastpaths.reasons()["cached reads"]
    assert not (tmp_path / "cache").exists() or not any(
        "." not in p.name for p in (tmp_path / "cache").iterdir()
    )

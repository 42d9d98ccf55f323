"""Image (binary) columns of local tables read straight from their Lance data files
(``treadle.read.file_values`` through ``CachedValues``), equal to a Lance take; every
layout it does not know (compressed or nullable pages, deletions, small values) falls back
to the take and says why."""

from __future__ import annotations

import io
import os
import shutil

import lance
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import treadle as td
from treadle import fastpaths
from treadle.errors import CorruptData, Purged
from treadle.read.cached_values import _TAKE, CachedValues
from treadle.read.file_values import FileValues, open_values
from treadle.read.image_requests import image_windows
from treadle.table.image_sizes import UNCOMPRESSED


def _jpegs(n: int, seed: int, size: int = 24) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (size, size, 3), np.uint8)).save(b, format="JPEG")
        out.append(b.getvalue())
    return out


def _pngs(n: int, seed: int) -> list[bytes]:
    """PNGs that zstd still shrinks a little (a gradient with noise): Lance compresses them
    unless told not to."""
    rng = np.random.default_rng(seed)
    ramp = np.tile(np.arange(320, dtype=np.uint8)[None, :, None], (240, 1, 3))
    out = []
    for _ in range(n):
        b = io.BytesIO()
        Image.fromarray(ramp + rng.integers(0, 8, ramp.shape, dtype=np.uint8)).save(b, "PNG")
        out.append(b.getvalue())
    return out


def _readers(cached: CachedValues) -> list[object]:
    return [r for f in cached._files.values() if f is not None for r in f.readers]


def _lance_table(root: str, values: list, version: str, rows_per_file: int, name: str = "x"):
    project = td.Client(root, create=True).project("p")
    project.branch().table("t").append({"a": np.zeros(2)})  # the project exists
    data = pa.table({"cam": pa.array(values, pa.binary())})
    lance.write_dataset(data, project.table_uri(name), data_storage_version=version,
                        max_rows_per_file=rows_per_file)  # fmt: skip
    return project.table_at(name, 1)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("file_values"))


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_several_files_are_read_directly_and_equal_the_take(root, version):
    values = _jpegs(40, 1)
    table = _lance_table(root, values, version, 7, f"v{version.replace('.', '')}")
    assert len(table.dataset.get_fragments()) == 6
    cached = CachedValues()
    assert cached.take(table, np.array([1, 2]), "cam") == values[1:3]
    opened = [r is not None for r in _readers(cached)]
    assert opened == [True] + [False] * 5  # a fragment's file is opened when first read
    rows = np.array([0, 6, 7, 13, 14, 20, 27, 33, 39], np.int64)
    assert cached.take(table, rows, "cam") == table.take(rows, ["cam"]).column("cam").to_pylist()
    assert cached.take(table, rows, "cam") == [values[r] for r in rows]
    with pytest.raises(IndexError, match="out of range"):
        cached.take(table, np.array([39, 40]), "cam")
    readers = _readers(cached)
    assert len(readers) == 6 and all(isinstance(r, FileValues) for r in readers)
    cached.close()


def test_treadle_writes_images_uncompressed_so_they_are_read_directly(root, monkeypatch):
    monkeypatch.setattr(fastpaths, "_OFF", {})
    branch = td.Client(root, create=True).project("w").branch()
    values = []
    for e in range(3):
        frames = _pngs(4, e)
        branch.table("cams").append_episode({"cam": frames}, episode=f"e{e}")
        values += frames
    table = branch.table("cams").pin()
    assert table.dataset.schema.field("cam").metadata == UNCOMPRESSED
    rows = np.arange(len(values))[::-1].copy()
    windows, _ = image_windows(table, _spec(table), rows, cached := CachedValues())
    assert [w.values[0] for w in windows] == [values[r] for r in rows]
    assert _readers(cached) and all(isinstance(r, FileValues) for r in _readers(cached))
    # the same PNGs written by Lance with no hint are zstd-compressed: a Lance take instead
    plain = _lance_table(root, values, "2.2", 100, "plain")
    other = CachedValues()
    assert other.take(plain, rows, "cam") == [values[r] for r in rows]
    assert _readers(other) == [_TAKE]
    assert "plain full-zip" in fastpaths.reasons()["image reads"]


def _spec(table):
    from treadle.plan.image_columns import image_column
    from treadle.read.columns import ColumnSpec

    spec = td.Video([0])
    return ColumnSpec("cam", spec, True, image=image_column(table, "cam", spec, "test"))


def test_deletions_nulls_and_small_values_fall_back_to_the_take(root, monkeypatch):
    monkeypatch.setattr(fastpaths, "_OFF", {})
    values = _jpegs(20, 2)
    table = _lance_table(root, values, "2.2", 100, "del")
    lance.dataset(table.uri).delete("_rowid % 3 = 0")
    pinned = table.project.table_at("del", lance.dataset(table.uri).version)
    assert CachedValues().take(pinned, np.array([0, 1]), "cam") is None
    assert "deleted rows" in fastpaths.reasons()["image reads"]
    # before: "(compressed, or nulls)" for tiny images too (a 109-byte 8x8 depth PNG), whose
    # fix (compact(), no compression) the warning then suggested in vain
    for name, vals, why in (
        ("nulls", [*values[:5], None, *values[5:]], "not in Lance's plain full-zip layout"),
        (
            "small",
            [bytes([i]) * 9 for i in range(20)],
            "mini-block layout, which Lance gives small",
        ),
    ):
        monkeypatch.setattr(fastpaths, "_OFF", {})
        t = _lance_table(root, vals, "2.2", 100, name)
        cached = CachedValues()
        assert cached.take(t, np.array([0, 5]), "cam") == [vals[0], vals[5]]
        assert _readers(cached) == [_TAKE]
        assert why in fastpaths.reasons()["image reads"]


def test_a_value_that_disagrees_with_its_page_index_raises(root, tmp_path):
    values = _jpegs(5, 3)
    table = _lance_table(root, values, "2.2", 100, "bad")
    [frag] = table.dataset.get_fragments()
    df = frag.metadata.files[0]
    copy = str(tmp_path / "copy.lance")
    shutil.copy(os.path.join(table.dataset.uri, "data", df.path), copy)
    good = open_values(copy, df, 0, 5)
    assert isinstance(good, FileValues) and good.take(np.array([2])) == [values[2]]
    with open(copy, "r+b") as fh:  # row 0's length prefix is the data buffer's first bytes
        fh.write((1).to_bytes(4, "little"))
    bad = open_values(copy, df, 0, 5)
    assert isinstance(bad, FileValues)
    assert bad.take(np.array([1])) == [values[1]]
    with pytest.raises(CorruptData, match="row 0"):
        bad.take(np.array([0]))


def test_rows_of_a_purged_episode_raise_purged(root):
    project = td.Client(root, create=True).project("purge")
    branch = project.branch()
    for e in range(2):
        branch.table("t").append_episode({"cam": _jpegs(3, e)}, episode=f"e{e}")
    old = branch.table("t").pin()
    cached = CachedValues()
    assert len(cached.take(old, np.array([0, 4]), "cam")) == 2
    project.purge("t", ["e1"], reason="consent withdrawn")
    with pytest.raises(Purged):
        cached.take(old, np.array([4]), "cam")


def test_decode_tasks_of_several_windows_keep_order_and_the_first_error(monkeypatch):
    """Windows are decoded WINDOWS_PER_TASK at a time: outputs in order, every window
    decoded even after one fails, the first failing window (in order) raised."""
    from treadle.read import image_requests as ir

    done = []

    def fake(w):
        done.append(w)
        if w in (11, 3):
            raise CorruptData(f"window {w}")
        return w * 10

    monkeypatch.setattr(ir, "decode_window", fake)
    decoder = ir.ImageDecoder(threads=2)
    try:
        ok = [w for w in range(20) if w not in (3, 11)]
        assert decoder.submit(ok)() == [w * 10 for w in ok]
        done.clear()
        wait = decoder.submit([w for w in range(20) if w != 3] + [3])
        with pytest.raises(CorruptData, match="window 11"):
            wait()
        assert sorted(done) == list(range(20))
    finally:
        decoder.close()


def test_schemas_staged_apart_compare_without_the_image_hint():
    """Rows staged by two writers (a Ray import's tasks) compare equal whether or not one
    of them recorded the column as images (and so gave it Lance's compression hint)."""
    from treadle.table.image_sizes import with_image_sizes, without_images

    rows = pa.table({"cam": pa.array(_jpegs(2, 5), pa.binary())})
    hinted = with_image_sizes(rows.schema, rows, "test")
    assert hinted.field("cam").metadata == UNCOMPRESSED
    plain = pa.schema([pa.field("cam", pa.binary())])
    assert without_images(hinted).equals(without_images(plain), check_metadata=True)

"""treadle.read.fixed: fixed-width columns at row positions equal what Table.take gives."""

from __future__ import annotations

import shutil
import tempfile

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treadle as td
from treadle.errors import CorruptData
from treadle.read.fixed import FixedReader
from treadle.table.tensors import to_numpy

COLUMNS = ["img", "wide", "act", "f32", "f64", "i64", "ok"]


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    """Every fixed-width kind: uint8 image and float64[32] rows of 256 bytes (Lance's
    full-zip layout), float32[7], scalars and bools (mini-blocks)."""
    rng = np.random.default_rng(seed)
    return {
        "img": rng.integers(0, 256, (n, 4, 4, 16), dtype=np.uint8),
        "wide": rng.standard_normal((n, 32)),
        "act": rng.standard_normal((n, 7), dtype=np.float32),
        "f32": rng.standard_normal(n, dtype=np.float32),
        "f64": rng.standard_normal(n),
        "i64": rng.integers(-(2**40), 2**40, n),
        "ok": rng.random(n) < 0.5,
    }


def _appended(root: str, sizes: list[int]) -> tuple[td.Table, dict[str, np.ndarray]]:
    ref = td.Client(root, create=True).project("p").branch().table("t")
    parts = [_columns(n, seed) for seed, n in enumerate(sizes)]
    for cols in parts:
        ref.append(cols)
    truth = {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
    return ref.pin(), truth


def _via_take(table: td.Table, rows: np.ndarray, column: str) -> np.ndarray:
    got = table.take(np.unique(rows), [column])
    _, inverse = np.unique(rows, return_inverse=True)
    return to_numpy(got.column(column), got.schema.field(column))[inverse.reshape(-1)]


def _check(reader: FixedReader, table: td.Table, truth: dict, rows: np.ndarray) -> None:
    got = reader.read(table, rows, COLUMNS)
    assert list(got) == COLUMNS
    for c in COLUMNS:
        want = _via_take(table, rows, c)
        assert got[c].dtype == want.dtype == truth[c].dtype, c
        assert got[c].shape == want.shape == truth[c][rows].shape, c
        np.testing.assert_array_equal(got[c], want, err_msg=c)
        np.testing.assert_array_equal(got[c], truth[c][rows], err_msg=c)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    picks=st.lists(st.floats(0, 1, exclude_max=True), min_size=0, max_size=80),
    budget=st.sampled_from([0, 1 << 20]),
)
def test_matches_take_after_appends_and_compaction(sizes, picks, budget):
    root = tempfile.mkdtemp(prefix="treadle-fixed-")
    try:
        table, truth = _appended(root, sizes)
        n = table.num_moments
        rows = np.asarray([int(p * n) for p in picks], np.int64)  # any order, duplicates
        reader = FixedReader(resident_bytes=budget)
        _check(reader, table, truth, rows)
        assert reader.path(table, "img") == "mapped"
        assert reader.path(table, "act") == ("resident" if budget else "take")
        reader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_several_fragments_map_each_file(local_root):
    table, truth = _appended(local_root, [20, 5, 1])  # 20 > 5 > 1: nothing compacts
    assert len(table.dataset.get_fragments()) == 3
    reader = FixedReader()
    rows = np.array([25, 0, 19, 20, 24, 25, 3, 0, 21], np.int64)
    _check(reader, table, truth, rows)
    assert reader.path(table, "wide") == "mapped"


def test_compacted_version_keeps_positions(local_root):
    ref = td.Client(local_root, create=True).project("p").branch().table("t")
    for seed in range(4):
        ref.append(_columns(8, seed))  # equal sizes: the tail merges into one fragment
    table = ref.pin()
    truth = {c: np.concatenate([_columns(8, s)[c] for s in range(4)]) for c in COLUMNS}
    assert len(table.dataset.get_fragments()) == 1
    _check(FixedReader(), table, truth, np.arange(31, -1, -1))


def test_deletions_are_not_mapped(local_root):
    table, truth = _appended(local_root, [30])
    ds = lance.dataset(table.uri)
    ds.delete("i64 % 3 = 0")
    pinned = table.project.table_at("t", lance.dataset(table.uri).version)
    keep = truth["i64"] % 3 != 0
    assert 0 < keep.sum() < 30
    truth = {c: v[keep] for c, v in truth.items()}
    rows = np.arange(pinned.num_moments)[::-1]
    for budget, path in ((1 << 20, "resident"), (0, "take")):
        reader = FixedReader(resident_bytes=budget)
        _check(reader, pinned, truth, rows)
        assert reader.path(pinned, "img") == path


@pytest.mark.parametrize(
    "version, where", [("2.0", "local"), ("2.1", "local"), ("2.2", "local"), ("2.0", "s3"),
                       ("2.2", "s3")],
)  # fmt: skip
def test_tables_lance_wrote(local_root, request, tmp_path, monkeypatch, version, where):
    """Tables written by Lance's own writer, one file per 7 rows, in each file version; on
    S3, files of a version whose layout is not known are not copied at all."""
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    url, opts = (local_root, None) if where == "local" else request.getfixturevalue("s3_root")
    project = td.Client(url, create=True, storage_options=opts).project("p")
    project.branch().table("t").append(_columns(2, 9))  # the project exists
    data = _columns(40, 3)
    fields = {c: pa.array(data[c]) for c in ("f32", "f64", "i64", "ok")}
    for c in ("img", "wide", "act"):
        flat = data[c].reshape(40, -1)
        fields[c] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
    data["img"] = data["img"].reshape(40, -1)  # a plain fixed-size list: a flat tensor
    lance.write_dataset(
        pa.table(fields), project.table_uri("x"), data_storage_version=version,
        max_rows_per_file=7, storage_options=project.store.lance_options,
    )  # fmt: skip
    table = project.table_at("x", 1)
    reader = FixedReader()
    _check(reader, table, data, np.array([39, 0, 7, 6, 13, 14, 39, 20], np.int64))
    assert reader.path(table, "img") == ("resident" if version == "2.0" else "mapped")
    assert reader.path(table, "act") == "resident"
    copies = list((tmp_path / "cache").glob("*")) if (tmp_path / "cache").exists() else []
    assert len([p for p in copies if "." not in p.name]) == (
        6 if where == "s3" and version != "2.0" else 0  # 40 rows: 6 files of 7
    )


def test_object_store_tables_map_their_cached_copies(s3_root, tmp_path, monkeypatch):
    """On an object store, wide columns are mapped from the data files' copies in the object
    cache (treadle.storage.filecache); narrow ones stay resident (no copy is made for
    them); with the cache off, the paths are the ones before it."""
    url, opts = s3_root
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    ref = td.Client(url, create=True, storage_options=opts).project("p").branch().table("t")
    parts = [_columns(9, seed) for seed in (1, 2)]
    for cols in parts:
        ref.append(cols)
    truth = {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
    table = ref.pin()
    rows = np.array([17, 0, 9, 8, 9, 3], np.int64)
    narrow = FixedReader()
    assert narrow.path(table, "act") == "resident"
    assert not (tmp_path / "cache").exists()  # a narrow column copies nothing
    for budget in (1 << 20, 0):
        reader = FixedReader(resident_bytes=budget)
        _check(reader, table, truth, rows)
        assert reader.path(table, "img") == reader.path(table, "wide") == "mapped"
    files = len(table.dataset.get_fragments())
    assert len([p for p in (tmp_path / "cache").iterdir() if "." not in p.name]) == files
    monkeypatch.setenv("TREADLE_CACHE_BYTES", "0")
    for budget, path in ((1 << 20, "resident"), (0, "take")):
        reader = FixedReader(resident_bytes=budget)
        _check(reader, table, truth, rows)
        assert reader.path(table, "img") == path


def test_files_that_do_not_fit_the_cache_together_are_not_copied(s3_root, tmp_path, monkeypatch):
    """Each data file fits the object cache's bound but not all of them: none is copied (a
    column is mapped from all of its files or none), and the fast path says why."""
    from treadle import fastpaths

    url, opts = s3_root
    monkeypatch.setenv("TREADLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fastpaths, "_OFF", {})
    ref = td.Client(url, create=True, storage_options=opts).project("p").branch().table("t")
    parts = [_columns(n, seed) for seed, n in enumerate([20, 5, 1])]  # nothing compacts
    for cols in parts:
        ref.append(cols)
    truth = {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
    table = ref.pin()
    sizes = [df.file_size_bytes for f in table.dataset.get_fragments() for df in f.metadata.files]
    assert len(sizes) == 3
    monkeypatch.setenv("TREADLE_CACHE_BYTES", str(sum(sizes) - 1))
    reader = FixedReader(resident_bytes=0)
    _check(reader, table, truth, np.array([25, 0, 19, 20, 24, 3], np.int64))
    assert reader.path(table, "img") == "take"
    assert "larger than the object cache's bound" in fastpaths.reasons()["cached reads"]
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    monkeypatch.setenv("TREADLE_CACHE_BYTES", str(sum(sizes)))
    reader = FixedReader(resident_bytes=0)
    _check(reader, table, truth, np.array([25, 0, 19, 20, 24, 3], np.int64))
    assert reader.path(table, "img") == "mapped"


def test_pinned_version_only(local_root):
    table, truth = _appended(local_root, [6])
    reader = FixedReader()
    rows = np.arange(6)
    _check(reader, table, truth, rows)
    ref = table.project.branch().table("t")
    for seed in (5, 6, 7):
        ref.append(_columns(6, seed))  # compaction rewrites the first file into a new one
    later = ref.pin()
    assert later.num_moments == 24
    _check(reader, table, truth, rows)  # the reader already mapped v1: still v1
    _check(FixedReader(), table, truth, rows)  # a fresh reader of v1: v1's files
    got = reader.read(later, np.array([23, 0]), ["i64"])["i64"]
    np.testing.assert_array_equal(got, [_columns(6, 7)["i64"][5], truth["i64"][0]])


def test_nulls_refused_as_take_refuses_them(local_root):
    ref = td.Client(local_root, create=True).project("p").branch().table("t")
    ref.append({"v": pa.array([1.0, 2.0, None, 4.0]), "w": np.arange(4)})
    table = ref.pin()
    reader = FixedReader()
    np.testing.assert_array_equal(reader.read(table, [3, 0, 1], ["v"])["v"], [4.0, 1.0, 2.0])
    assert reader.path(table, "v") == "take"
    with pytest.raises(CorruptData, match="'v' holds null values"):
        reader.read(table, [1, 2], ["v", "w"])


def test_mapping_that_disagrees_with_lance_is_not_used(local_root, monkeypatch):
    """A page viewed one row off (a wrong layout assumption) is caught by the row check."""
    from treadle.read import fixed

    table, truth = _appended(local_root, [12])
    right = fixed._page_values

    def shifted(page, buf, dtype, size):
        arr = right(page, buf, dtype, size)
        return None if arr is None else np.roll(arr, 1, axis=0)

    monkeypatch.setattr(fixed, "_page_values", shifted)
    reader = FixedReader()
    _check(reader, table, truth, np.arange(12))
    assert reader.path(table, "img") == "resident"


def test_bad_requests(local_root):
    ref = td.Client(local_root, create=True).project("p").branch().table("t")
    ref.append({"v": np.arange(4.0), "s": ["a", "b", "c", "d"]})
    table = ref.pin()
    reader = FixedReader()
    with pytest.raises(IndexError, match="out of range for table 't' with 4 moments"):
        reader.read(table, [4], ["v"])
    with pytest.raises(IndexError):
        reader.read(table, [-1], ["v"])
    with pytest.raises(TypeError, match="column 's' of table 't' is string"):
        reader.read(table, [0], ["s"])
    assert reader.read(table, np.zeros(0, np.int64), ["v"])["v"].shape == (0,)

"""Hugging Face import: save_to_disk folders, DatasetDicts, parquet; round trip vs ``datasets``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from importer_fixtures import make_hf, nothing_committed, run_memory_capped
from treadle.catalog import Client
from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput
from treadle.importers import hf as import_hf
from treadle.table.tensors import to_numpy

datasets = pytest.importorskip("datasets")


@pytest.fixture
def client(local_root):
    return Client(local_root)


def _check_rows(t, ref, *, decoded: bool):
    rows = t.to_arrow(["label", "text", "score"]).to_pylist()
    action = to_numpy(t.to_arrow(["action"]).column("action"), t.schema.field("action"))
    assert len(rows) == len(ref)
    raw = ref.cast_column("image", datasets.Image(decode=False))
    if decoded:
        images = to_numpy(t.to_arrow(["image"]).column("image"), t.schema.field("image"))
    else:
        images = t.to_arrow(["image"]).column("image").to_pylist()
    for i, g in enumerate(rows):
        r = ref[i]
        assert g["label"] == r["label"] and g["text"] == r["text"] and g["score"] == r["score"]
        np.testing.assert_array_equal(action[i], np.asarray(r["action"], np.float32))
        if decoded:
            np.testing.assert_array_equal(images[i], np.asarray(r["image"]))
        else:
            assert images[i] == raw[i]["image"]["bytes"]


@pytest.mark.parametrize("images", ["encoded", "decoded"])
def test_save_to_disk_round_trip(tmp_path, client, images):
    folder = make_hf(tmp_path / "ds", n=40)
    assert len(list(Path(folder).glob("*.arrow"))) > 1  # several shards
    res = import_hf(folder, client.project("p"), "t", images=images, progress=False)
    assert res.rows == 40
    t = client.project("p").branch("main").table("t").pin()
    _check_rows(t, datasets.load_from_disk(folder), decoded=images == "decoded")


def test_zero_copy_batches_from_memory_map(tmp_path):
    import pyarrow as pa

    from treadle.importers.hf import iter_batches, resolve_files

    n = 200_000
    ds = datasets.Dataset.from_dict(
        {"a": np.arange(n, dtype=np.float64), "b": np.arange(n, dtype=np.int64)}
    )
    ds.save_to_disk(str(tmp_path / "plain"))
    files = resolve_files(str(tmp_path / "plain"))
    before = pa.total_allocated_bytes()
    tables = list(iter_batches(files))
    grown = pa.total_allocated_bytes() - before
    assert sum(t.num_rows for t in tables) == n
    assert sum(t.nbytes for t in tables) >= 16 * n
    # Batches point into the memory-mapped file: the Arrow pool barely grows.
    assert grown < 16 * n // 20, grown


def test_dataset_dict_split_and_parquet(tmp_path, client):
    folder = make_hf(tmp_path / "single", n=20)
    ds = datasets.load_from_disk(folder)
    dd = datasets.DatasetDict({"train": ds, "test": ds.select(range(5))})
    dd.save_to_disk(str(tmp_path / "dd"))
    import_hf(str(tmp_path / "dd"), client.project("p"), "test", split="test", progress=False)
    assert client.project("p").branch("main").table("test").num_moments == 5
    with pytest.raises(NotFound, match="nope"):
        import_hf(str(tmp_path / "dd"), client.project("p"), "x", split="nope", progress=False)

    ds.to_parquet(str(tmp_path / "data.parquet"))
    import_hf(str(tmp_path / "data.parquet"), client.project("p"), "pq", progress=False)
    t = client.project("p").branch("main").table("pq").pin()
    _check_rows(t, ds, decoded=False)


def test_truncated_arrow_file_nothing_committed(tmp_path, client):
    folder = make_hf(tmp_path / "ds", n=40)
    f = sorted(Path(folder).glob("*.arrow"))[1]
    f.write_bytes(f.read_bytes()[:-200])
    with pytest.raises(CorruptData, match=f.name):
        import_hf(folder, client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([51, 56, 61, 64, 1 << 20], "offset for slot 16 out of bounds: 1048576 > 68"),
        ([51, 56, 1 << 30, 64, 68], "offset for slot 14 out of bounds: 1073741824 > 68"),
    ],
)
def test_an_arrow_batch_whose_offsets_leave_its_data_is_named(tmp_path, client, offsets, match):
    """A string offset past the column's data (a memory-mapped file's buffers are taken as
    they are) was a bare ArrowInvalid or a Lance StorageError naming no file."""
    import json

    src = tmp_path / "hf"
    text = ["hello", "world", "abc", "defg"] * 4
    datasets.Dataset.from_dict({"text": text, "x": list(range(16))}).save_to_disk(str(src))
    name = json.loads((src / "state.json").read_text())["_data_files"][0]["filename"]
    raw = (src / name).read_bytes()
    good = np.array([51, 56, 61, 64, 68], np.int32).tobytes()
    assert raw.count(good) == 1
    (src / name).write_bytes(raw.replace(good, np.array(offsets, np.int32).tobytes()))
    with pytest.raises(CorruptData, match=rf"HF data file .*{name}, batch 0 is corrupt: .*{match}"):
        import_hf(str(src), client.project("p"), "t", progress=False)
    assert nothing_committed(client.project("p"))


def test_a_dictionary_value_repeated_on_many_rows_is_read_in_bounded_memory(tmp_path, local_root):
    """A parquet file of 600 rows, each the index of one 1 MB value (a few KB on disk), was
    read a 1,024-row batch at a time: 600 MB at once. It is now read as a dictionary and
    decoded 32 MB at a time; the values stored are the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, value = 600, b"\x01" * (1 << 20)
    blob = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))
    path = tmp_path / "bomb.parquet"
    table = pa.table({"blob": blob, "i": pa.array(range(rows), pa.int64())})
    pq.write_table(table, path, compression="zstd", store_schema=False)  # read back as binary
    assert path.stat().st_size < 64 << 10
    call = f"td.importers.hf({str(path)!r}, client.project('p'), 't', progress=False)"
    out = run_memory_capped(call, local_root, tmp_path, headroom=512 << 20)
    assert out["error"] is None, out
    assert out["rss_growth"] < 384 << 20
    t = Client(local_root).project("p").branch("main").table("t").pin()
    got = t.to_arrow(["blob", "i"])
    assert got.schema.field("blob").type == pa.binary()
    assert got.column("i").to_pylist() == list(range(rows))
    assert all(v == value for v in got.column("blob").to_pylist())


@pytest.mark.slow  # a memory-capped subprocess
def test_decoded_images_are_decoded_a_budget_at_a_time(tmp_path, local_root):
    """120 black 2000x2000 PNGs (a few KB each, 12 MB each decoded) in one parquet file were
    decoded in one batch (its encoded bytes are small) and stacked: 2.9 GB at once (an error
    under the cap). Batches are now cut by decoded bytes (read from each image's header) and
    at most ``IN_FLIGHT_BYTES`` of them decode at once; the pixels stored are the same."""
    from PIL import Image

    feats = datasets.Features({"img": datasets.Image(), "i": datasets.Value("int64")})
    black = Image.new("RGB", (2000, 2000))
    ds = datasets.Dataset.from_dict({"img": [black] * 120, "i": list(range(120))}, feats)
    path = tmp_path / "black.parquet"
    ds.to_parquet(str(path))
    assert path.stat().st_size < 4 << 20
    call = ("import treadle.importers.hf as h; h.IN_FLIGHT_BYTES = 48 << 20; "
            f"td.importers.hf({str(path)!r}, client.project('p'), 't', "
            "images='decoded', progress=False)")  # fmt: skip
    out = run_memory_capped(call, local_root, tmp_path, headroom=1 << 30)
    assert out["error"] is None, out
    assert out["rss_growth"] < 768 << 20, out
    t = Client(local_root).project("p").branch("main").table("t").pin()
    assert t.to_arrow(["i"]).column("i").to_pylist() == list(range(120))
    last = to_numpy(t.to_arrow(["img"]).column("img"), t.schema.field("img"))[-1]
    assert last.shape == (2000, 2000, 3) and not last.any()


@pytest.mark.slow  # a memory-capped subprocess
def test_a_list_row_repeating_a_dictionary_value_is_refused_before_it_is_read(tmp_path, local_root):
    """A parquet row whose list holds 4,096 indices of one 1 MiB dictionary value (a few KB
    on disk) was read as 4 GiB of binary values (a MemoryError under the cap). Its values
    are counted from the pages' repetition levels first: past ``max_row_bytes`` (default
    1 GiB) it is refused, naming the file, column and row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from treadle.importers.parquet_bounded import MAX_ROW_BYTES

    assert MAX_ROW_BYTES == 1 << 30  # as documented
    n = 1 << 12
    value = pa.array([b"\x01" * (1 << 20)])
    tags = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n + 2, np.int32)), value)
    lists = pa.ListArray.from_arrays(pa.array([0, n, n + 1, n + 2], pa.int32()), tags)
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"tags": lists, "i": [0, 1, 2]}), path, store_schema=False)
    assert path.stat().st_size < 64 << 10
    call = f"td.importers.hf({str(path)!r}, client.project('p'), 't', progress=False)"
    out = run_memory_capped(call, local_root, tmp_path, headroom=512 << 20)
    assert out["error"] == "UnsafeInput", out
    assert (
        "lists.parquet: column 'tags.list.element', row group 0: a row holds 4,096 values"
        in (out["message"])
    ), out
    assert "max_row_bytes=1,073,741,824" in out["message"], out
    assert out["rss_growth"] < 128 << 20, out
    # rows of 8 such values are under a lower bound: read a few rows a batch, values the same
    lists = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 8 * 65, 8), pa.int32()),
        tags[:1].take(pa.array(np.zeros(8 * 64, np.int32))),
    )
    pq.write_table(pa.table({"tags": lists}), path, store_schema=False)
    client = Client(local_root)
    import_hf(str(path), client.project("q"), "t", progress=False)
    got = client.project("q").branch("main").table("t").pin().to_arrow(["tags"]).column("tags")
    assert got.to_pylist() == [[value[0].as_py()] * 8] * 64


_COMPRESSED_ROWS = """
import sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# 512 distinct 1 MiB values, mostly zeros: zstd keeps a few hundred bytes of each, a page each
vals = [i.to_bytes(8, "little") + bytes((1 << 20) - 8) for i in range(512)]
table = pa.table({"blob": pa.array(vals, pa.binary()), "i": np.arange(512)})
pq.write_table(table, sys.argv[1], compression="zstd", use_dictionary=False,
               write_batch_size=1, data_page_size=1 << 16, store_schema=False)
"""


@pytest.mark.slow  # a memory-capped subprocess
def test_values_compressed_away_are_read_a_few_rows_a_batch(tmp_path, local_root):
    """512 distinct 1 MiB values that zstd stores in a few hundred bytes each (a 300 KB
    file) were read as a dictionary, which grew over the row group's batches: 512 MiB at
    once (a MemoryError under the cap). A column is read as a dictionary now only where its
    pages hold dictionary indices, and a batch holds no more pages than 32 MiB decompress to
    (each page's size, from its header); the values read are the same."""
    import subprocess
    import sys

    path = tmp_path / "zeros.parquet"
    subprocess.run([sys.executable, "-c", _COMPRESSED_ROWS, str(path)], check=True, timeout=300)
    assert path.stat().st_size < 1 << 20
    call = (
        "from treadle.importers.hf import iter_batches, resolve_files\n"
        "    i = 0\n"
        f"    for t in iter_batches(resolve_files({str(path)!r})):\n"
        "        for b in t.column('blob').to_pylist():\n"
        "            assert len(b) == 1 << 20 and b[:8] == i.to_bytes(8, 'little'), i\n"
        "            i += 1\n"
        "    assert i == 512, i"
    )
    out = run_memory_capped(call, local_root, tmp_path, headroom=384 << 20)
    assert out["error"] is None, out
    assert out["rss_growth"] < 192 << 20, out


def test_a_page_over_max_page_bytes_is_refused_from_its_header(tmp_path, client):
    """A parquet page states the size it decompresses to (up to 2 GiB, allocated whole by
    the reader; a few KB of zstd may say it): one over ``max_page_bytes`` (default 1 GiB)
    is refused from its header, naming the file, column and row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from treadle.importers.parquet_pages import MAX_PAGE_BYTES

    assert MAX_PAGE_BYTES == 1 << 30  # as documented
    path = tmp_path / "page.parquet"
    table = pa.table({"blob": [bytes(8 << 20)], "i": [1]})
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    assert path.stat().st_size < 64 << 10
    with pytest.raises(
        UnsafeInput,
        match=r"page.parquet: column 'blob', row group 0: a page of 8,388,6\d\d bytes "
        r"\(uncompressed\), more than max_page_bytes=4,194,304",
    ):
        import_hf(str(path), client.project("p"), "t", max_page_bytes=4 << 20, progress=False)
    assert nothing_committed(client.project("p"))
    import_hf(str(path), client.project("p"), "t", progress=False)  # under the default
    t = client.project("p").branch("main").table("t").pin()
    assert t.to_arrow(["blob"]).column("blob").to_pylist() == [bytes(8 << 20)]


def test_files_with_different_columns(tmp_path, client):
    a = datasets.Dataset.from_dict({"x": [1, 2]})
    b = datasets.Dataset.from_dict({"y": ["a"]})
    a.to_parquet(str(tmp_path / "a.parquet"))
    b.to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(SchemaMismatch, match="b.parquet"):
        import_hf(
            [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")],
            client.project("p"),
            "t",
            progress=False,
        )
    assert nothing_committed(client.project("p"))


def test_state_json_path_escaping_is_refused(tmp_path, client):
    import json

    folder = make_hf(tmp_path / "ds", n=10)
    state = Path(folder, "state.json")
    s = json.loads(state.read_text())
    s["_data_files"][0]["filename"] = "../../etc/passwd"
    state.write_text(json.dumps(s))
    with pytest.raises(Exception, match="escapes"):
        import_hf(folder, client.project("p"), "t", progress=False)


def test_import_id_covers_table_and_content(tmp_path, client):
    folder = make_hf(tmp_path / "ds", n=20)
    p = client.project("p")
    import_hf(folder, p, "a", progress=False)
    assert not import_hf(folder, p, "b", progress=False).skipped  # same files, another table
    f = next(f for f in sorted(Path(folder).glob("*.arrow")) if b"row 3" in f.read_bytes())
    f.write_bytes(f.read_bytes().replace(b"row 3", b"row X"))  # same size
    fixed = import_hf(folder, p, "a", progress=False)
    assert not fixed.skipped and fixed.rows == 20
    texts = p.branch("main").table("a").to_arrow(["text"]).column("text").to_pylist()
    assert texts.count("row X") == 1 and texts.count("row 3") == 1
    assert import_hf(folder, p, "a", progress=False).commit.id == fixed.commit.id


def test_a_nested_field_only_later_files_have_is_not_dropped(tmp_path, client):
    first = datasets.Dataset.from_dict({"meta": [{"a": 1}, {"a": 2}]})
    later = datasets.Dataset.from_dict({"meta": [{"a": 3, "extra": [{"deep": "x"}]}]})
    first.to_parquet(str(tmp_path / "a.parquet"))
    later.to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(SchemaMismatch, match=r"b\.parquet.*field meta\.extra.*dropped"):
        import_hf(
            [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")],
            client.project("p"),
            "t",
            progress=False,
        )
    assert nothing_committed(client.project("p"))


@pytest.mark.parametrize(
    "first, later, value",
    [
        ("float32", "float64", 0.1),  # was stored as 0.10000000149011612
        ("int64", "string", "007"),  # was stored as 7
        ("string", "int64", 7),  # was stored as "7"
        ("int64", "bool", True),  # was stored as 1
    ],
)
def test_a_later_file_whose_column_type_would_change_its_values_is_refused(
    tmp_path, client, first, later, value
):
    """Files of one dataset that disagree on a column's type: widen exactly or refuse."""
    v = datasets.Value
    a = datasets.Dataset.from_dict({"x": [1]}, features=datasets.Features({"x": v(first)}))
    b = datasets.Dataset.from_dict({"x": [value]}, features=datasets.Features({"x": v(later)}))
    a.to_parquet(str(tmp_path / "a.parquet"))
    b.to_parquet(str(tmp_path / "b.parquet"))
    names = rf"{v(later).pa_type}.*{v(first).pa_type}"
    with pytest.raises(
        SchemaMismatch, match=rf"b\.parquet.*field x has type {names}.*change its values"
    ):
        import_hf(
            [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")],
            client.project("p"),
            "t",
            progress=False,
        )
    assert nothing_committed(client.project("p"))


def test_a_later_file_may_widen_a_column_exactly(tmp_path, client):
    v = datasets.Value
    a = datasets.Dataset.from_dict({"x": [1.5]}, features=datasets.Features({"x": v("float64")}))
    b = datasets.Dataset.from_dict({"x": [3]}, features=datasets.Features({"x": v("int32")}))
    a.to_parquet(str(tmp_path / "a.parquet"))
    b.to_parquet(str(tmp_path / "b.parquet"))
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    import_hf(paths, client.project("p"), "t", progress=False)
    t = client.project("p").branch("main").table("t")
    assert t.to_arrow(["x"]).column("x").to_pylist() == [1.5, 3.0]


def test_files_whose_class_labels_differ_are_refused(tmp_path, client):
    """Label 0 is "cat" in one file and "dog" in the other: the ints alone would mix them."""
    for name, labels in (("a", ["cat", "dog"]), ("b", ["dog", "cat"])):
        feats = datasets.Features({"label": datasets.ClassLabel(names=labels)})
        ds = datasets.Dataset.from_dict({"label": [0, 1]}, features=feats)
        ds.to_parquet(str(tmp_path / f"{name}.parquet"))
    with pytest.raises(
        SchemaMismatch, match=r"b\.parquet.*field label.*'dog', 'cat'.*'cat', 'dog'"
    ):
        import_hf(
            [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")],
            client.project("p"),
            "t",
            progress=False,
        )  # was imported: label 0 meant "cat" in rows 0-1 and "dog" in rows 2-3
    assert nothing_committed(client.project("p"))


def make_hf_arrays(folder: Path, n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """``Array2D`` and ``Sequence(length=7)`` columns, saved to disk and as parquet by ``datasets``."""
    feats = datasets.Features(
        {
            "grid": datasets.Array2D((2, 3), "float32"),
            "state": datasets.Sequence(datasets.Value("float32"), length=7),
        }
    )
    grid = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 7
    state = np.arange(n * 7, dtype=np.float32).reshape(n, 7) / 3
    ds = datasets.Dataset.from_dict({"grid": list(grid), "state": state.tolist()}, features=feats)
    ds.save_to_disk(str(folder / "disk"))
    ds.to_parquet(str(folder / "data.parquet"))
    return grid, state


def test_array_and_fixed_length_sequence_columns_are_tensors(tmp_path, client, local_root):
    import subprocess
    import sys

    grid, state = make_hf_arrays(tmp_path)
    p = client.project("p")
    import_hf(str(tmp_path / "disk"), p, "disk", progress=False)  # datasets' types registered here
    cli = [sys.executable, "-m", "treadle.cli", "import", "hf", str(tmp_path / "data.parquet")]
    subprocess.run([*cli, "--root", local_root, "--project", "p", "--table", "pq"], check=True)
    for name in ("disk", "pq"):
        t = p.branch("main").table(name).pin()
        got = t.to_arrow(["grid", "state"])
        g = to_numpy(got.column("grid"), t.schema.field("grid"))
        s = to_numpy(got.column("state"), t.schema.field("state"))
        assert g.shape == grid.shape and s.shape == state.shape, name
        np.testing.assert_array_equal(g, grid)
        np.testing.assert_array_equal(s, state)


def test_a_dataset_dict_without_a_split_given(tmp_path, client, capsys):
    from treadle.cli import main

    ds = datasets.load_from_disk(make_hf(tmp_path / "single", n=6))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(tmp_path / "dd")
    # the default, as `--help` says: the only split, else train
    import_hf(str(tmp_path / "dd"), client.project("p"), "t", progress=False)
    assert client.project("p").branch("main").table("t").num_moments == 6
    datasets.DatasetDict({"a": ds, "b": ds}).save_to_disk(tmp_path / "ab")
    # before: "pick one with split=...", a Python argument, on the command line too
    argv = ["import", "hf", str(tmp_path / "ab"), "--project", "p", "--table", "u"]
    assert main([*argv, "--root", client.root]) == 1
    err = capsys.readouterr().err
    assert "splits ['a', 'b']" in err and "--split" in err

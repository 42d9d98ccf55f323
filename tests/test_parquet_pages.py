"""Parquet page headers and repetition levels, read without pyarrow's decoder, against it."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from treadle.errors import CorruptData, UnsafeInput
from treadle.importers.parquet_pages import check_pages, file_reader, pages, row_values


def _entries(v) -> int:
    """Level entries a value takes: an empty or null list takes one."""
    if not isinstance(v, list):
        return 1
    return max(1, sum(_entries(x) for x in v))


def _rows(rng: random.Random, nested: bool) -> list:
    rows: list = []
    for _ in range(rng.randint(1, 1500)):
        r = rng.random()
        if r < 0.05:
            rows.append(None)
        elif r < 0.1:
            rows.append([])
        else:
            n = rng.choice([1, 3, 50, 700]) if rng.random() < 0.99 else 20_000
            if nested:
                rows.append([[1] * rng.randint(0, 5) for _ in range(rng.randint(0, n // 10 + 1))])
            else:
                rows.append([rng.choice([None, 1, 2]) for _ in range(n)])
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_row_values_match_what_pyarrow_reads(seed):
    """Every codec, both page versions, small and large pages, lists of lists: the most
    values a row holds, counted from the levels, is what the rows pyarrow wrote hold."""
    rng = random.Random(seed)
    rows = _rows(rng, nested=seed % 3 == 0)
    buf = io.BytesIO()
    pq.write_table(
        pa.table({"x": pa.array(rows), "y": pa.array(range(len(rows)))}),
        buf,
        compression=["NONE", "snappy", "zstd", "gzip", "brotli", "lz4"][seed % 6],
        data_page_size=rng.choice([64, 1024, 1 << 20]),
        data_page_version=["1.0", "2.0"][seed % 2],
        row_group_size=rng.choice([100, 1 << 20]),
        use_dictionary=seed % 4 < 2,
    )
    raw = buf.getvalue()
    meta = pq.ParquetFile(pa.BufferReader(raw)).metadata
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        want = max(_entries(v) for v in rows[start : start + n])
        assert row_values(pa.BufferReader(raw), g, 0, "f") == want, g
        start += n
    check_pages(pa.BufferReader(raw), "f")  # every header parses


def test_a_page_header_past_its_chunk_or_cut_short_is_corrupt(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"x": [[1, 2]] * 100}), path, compression="NONE", use_dictionary=False)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    first = next(pages(file_reader(str(path)), chunk, "f"))
    raw = bytearray(path.read_bytes())
    body = first.body
    raw[chunk.data_page_offset : body] = b"\xff" * (body - chunk.data_page_offset)
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptData, match="page header at byte"):
        check_pages(str(path), "f")


def test_check_pages_names_the_column_and_the_option(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"a": [1], "b": [bytes(1 << 16)]}), path, use_dictionary=False)
    check_pages(str(path), "f", 1 << 20)
    check_pages(str(path), "f", 1 << 10, columns=["a"])  # b is not read
    with pytest.raises(UnsafeInput, match=r"f: column 'b', row group 0: .*more than lim=1,024"):
        check_pages(str(path), "f", 1 << 10, option="lim")

"""A parquet file's pages, read from their headers before pyarrow decodes them.

The footer says how many values a column chunk holds, not how large its pages are: a page
header states the size the page decompresses to (up to 2 GiB, allocated whole by the
reader), and a few KB of zstd may decompress to that. :func:`check_pages` walks every
column chunk's page headers (Thrift compact protocol, parsed here) and refuses a page
over ``max_page_bytes`` before the reader allocates it.

For a repeated (list) column, :func:`row_values` counts the values of each row from the
pages' repetition levels (decompressing a page at a time): run-length encoding lets a few
bytes put a billion values in one row, which the reader must hold at once.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from treadle.errors import CorruptData, UnsafeInput

#: default ``max_page_bytes``: the largest page (uncompressed) read; a page holds one value at
#: least, and the reader holds the page and the values it decodes to
MAX_PAGE_BYTES = 1 << 30
_MAX_HEADER = 16 << 20  # a page header with its statistics (binary min/max) is far smaller

_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3

#: ``bytes -> read(offset, n)``: up to ``n`` bytes of the file from ``offset``
Read = Callable[[int, int], bytes]


class _Thrift:
    """The fields of a Thrift compact-protocol struct: integers and nested structs kept,
    everything else skipped."""

    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def byte(self) -> int:
        b = self.buf[self.pos]  # IndexError past the end: the caller reads more
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        if depth > 8:
            raise ValueError("structs nested more than 8 deep")
        out: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            out[last] = self.value(kind, depth)

    def value(self, kind: int, depth: int) -> Any:
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.pos += 8
        elif kind == 8:
            n = self.varint()  # before the add: ``self.pos += self.varint()`` adds to the old pos
            self.pos += n
        elif kind in (9, 10):
            head = self.byte()
            n, elem = head >> 4, head & 0x0F
            n = self.varint() if n == 15 else n
            for _ in range(n):
                self.byte() if elem in (1, 2) else self.value(elem, depth)
        elif kind == 11:
            n = self.varint()
            kinds = self.byte() if n else 0
            for _ in range(n):
                self.value(kinds >> 4, depth)
                self.value(kinds & 0x0F, depth)
        elif kind == 12:
            return self.struct(depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {kind}")
        return None


@dataclass
class Page:
    """One page of a column chunk: its header's fields, where its body starts."""

    kind: int
    size: int  # uncompressed
    stored: int  # compressed, as stored
    body: int  # file offset of the body
    header: dict[int, Any]


def _header(read: Read, pos: int, left: int, where: str) -> tuple[dict[int, Any], int]:
    n = min(left, 4096)
    while True:
        t = _Thrift(read(pos, n))
        try:
            return t.struct(), t.pos
        except IndexError:
            if n >= min(left, _MAX_HEADER):
                raise CorruptData(f"{where}: a page header at byte {pos} is truncated") from None
            n = min(left, _MAX_HEADER, n * 8)
        except (ValueError, RecursionError) as e:
            raise CorruptData(f"{where}: a page header at byte {pos} is corrupt: {e}") from None


def pages(read: Read, chunk: Any, where: str) -> Iterator[Page]:
    """The pages of one column chunk (``ColumnChunkMetaData``), from their headers."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    pos, end = start, start + chunk.total_compressed_size
    while pos < end:
        h, n = _header(read, pos, end - pos, where)
        kind, size, stored = h.get(1), h.get(2), h.get(3)
        if not all(isinstance(v, int) and v >= 0 for v in (kind, size, stored)):
            raise CorruptData(f"{where}: the page header at byte {pos} has no type or sizes")
        if pos + n + stored > end:
            raise CorruptData(f"{where}: the page at byte {pos} runs past its column chunk")
        yield Page(kind, size, stored, pos + n, h)
        pos += n + stored


def file_reader(handle: Any) -> Read:
    """:data:`Read` over a path or a ``pa.BufferReader``/buffer."""
    if isinstance(handle, pa.BufferReader):
        handle = handle.read_buffer()  # zero-copy: the reader's own buffer
    if isinstance(handle, (pa.Buffer, bytes, bytearray, memoryview)):
        view = memoryview(handle)
        return lambda pos, n: bytes(view[pos : pos + n])
    f = open(handle, "rb")  # noqa: SIM115 - closed with the last reference

    def read(pos: int, n: int) -> bytes:
        f.seek(pos)
        return f.read(n)

    return read


def check_pages(
    handle: Any,
    where: str,
    max_page_bytes: int = MAX_PAGE_BYTES,
    option: str = "max_page_bytes",
    columns: Collection[str] | None = None,
) -> None:
    """Refuse (:class:`UnsafeInput` naming the column, row group and ``option``) a parquet
    file with a page that decompresses to more than ``max_page_bytes``, from the headers
    (of the top-level ``columns`` only, when given)."""
    meta = pq.ParquetFile(handle).metadata
    read = file_reader(handle)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if columns is not None and chunk.path_in_schema.split(".")[0] not in columns:
                continue
            at = f"{where}: column {chunk.path_in_schema!r}, row group {g}"
            for p in pages(read, chunk, at):
                if p.size > max_page_bytes:
                    raise UnsafeInput(
                        f"{at}: a page of {p.size:,} bytes (uncompressed), more than "
                        f"{option}={max_page_bytes:,}; raise {option} if you trust it"
                    )


_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd"}
_CODECS |= {"LZ4_RAW": "lz4_raw"}


def _levels(read: Read, chunk: Any, p: Page, where: str) -> bytes | None:
    """The repetition levels' bytes of a data page (RLE/bit-packed hybrid), or None for a
    dictionary page."""
    if p.kind == _DATA_PAGE_V2:
        v2 = p.header.get(8) or {}
        return read(p.body, int(v2.get(6) or 0))
    if p.kind != _DATA_PAGE:
        return None
    body: Any = read(p.body, p.stored)
    if chunk.compression != "UNCOMPRESSED":
        try:
            body = _decompress(body, chunk.compression, p.size, where)
        except (pa.ArrowException, OSError, struct.error) as e:
            raise CorruptData(f"{where}: a page does not decompress: {e}") from None
    if len(body) < 4:
        raise CorruptData(f"{where}: a data page is too short for its levels")
    (n,) = struct.unpack_from("<I", body)
    return bytes(memoryview(body)[4 : 4 + n])  # the levels only: the page goes


def _decompress(body: bytes, compression: str, size: int, where: str) -> Any:
    """The page body decompressed (a buffer)."""
    codec = _CODECS.get(compression)
    if codec is not None:
        return pa.Codec(codec).decompress(body, decompressed_size=size)
    if compression != "LZ4":
        raise UnsafeInput(f"{where}: pages compressed with {compression} cannot be counted")
    # Parquet's LZ4 is Hadoop's framing (blocks of: sizes big-endian, an LZ4 block), or
    # for older writers a bare LZ4 block
    out, pos = [], 0
    try:
        while pos + 8 <= len(body):
            n, stored = struct.unpack_from(">II", body, pos)
            if pos + 8 + stored > len(body) or n > size:
                break
            out.append(pa.Codec("lz4_raw").decompress(body[pos + 8 : pos + 8 + stored], n))
            pos += 8 + stored
    except pa.ArrowException:
        pos = -1  # not Hadoop's framing
    if pos == len(body) and sum(b.size for b in out) == size:
        return b"".join(b.to_pybytes() for b in out)
    return pa.Codec("lz4_raw").decompress(body, decompressed_size=size)


def _hybrid(buf: bytes, width: int, count: int) -> Iterator[tuple[int, int] | np.ndarray]:
    """The first ``count`` values of an RLE/bit-packed hybrid run: ``(value, repeats)`` for
    a run-length run, an array for a bit-packed one."""
    t = _Thrift(buf)
    nbytes = (width + 7) // 8
    try:
        while count > 0:
            head = t.varint()
            if head & 1:
                n = (head >> 1) * 8
                raw = np.frombuffer(buf, np.uint8, (n * width) // 8, t.pos)
                t.pos += (n * width) // 8
                bits = np.unpackbits(raw, bitorder="little").reshape(-1, width)
                vals = bits @ (1 << np.arange(width))
                yield vals[:count]
                count -= len(vals)
            else:
                value = int.from_bytes(buf[t.pos : t.pos + nbytes], "little")
                t.pos += nbytes
                n = min(head >> 1, count)
                yield value, n
                count -= n
    except (IndexError, ValueError):
        raise CorruptData("repetition levels are truncated") from None


def row_values(handle: Any, row_group: int, column: int, where: str) -> int:
    """The most values (leaf entries) one row of a repeated column holds in a row group,
    counted from its pages' repetition levels (a row starts at level 0)."""
    meta = pq.ParquetFile(handle).metadata
    chunk = meta.row_group(row_group).column(column)
    width = meta.schema.column(column).max_repetition_level.bit_length()
    read, most, cur = file_reader(handle), 0, 0
    for p in pages(read, chunk, where):
        levels = _levels(read, chunk, p, where)
        if levels is None:
            continue
        count = int((p.header.get(8) or p.header.get(5) or {}).get(1) or 0)
        for run in _hybrid(levels, width, count):
            if isinstance(run, tuple):
                value, n = run
                if value:
                    cur += n
                else:  # n rows start: the open one ends, n - 1 of one value each
                    most, cur = max(most, cur, 1 if n > 1 else 0), 1
                continue
            starts = np.flatnonzero(run == 0)
            if not len(starts):
                cur += len(run)
                continue
            most = max(most, cur + int(starts[0]))
            if len(starts) > 1:
                most = max(most, int(np.diff(starts).max()))
            cur = len(run) - int(starts[-1])
    return max(most, cur)


_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY


def page_spans(read: Read, chunk: Any, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each data page of a column chunk: its values (rows, in a column that is not
    repeated), the bytes it decompresses to, and whether it holds dictionary indices."""
    counts, sizes, indexed = [], [], []
    for p in pages(read, chunk, where):
        head = p.header.get(5) if p.kind == _DATA_PAGE else p.header.get(8)
        if p.kind not in (_DATA_PAGE, _DATA_PAGE_V2) or not isinstance(head, dict):
            continue
        count, enc = head.get(1), head.get(2 if p.kind == _DATA_PAGE else 4)
        if not isinstance(count, int) or count < 0:
            raise CorruptData(f"{where}: a data page has no value count")
        counts.append(count)
        sizes.append(p.size)
        indexed.append(enc in _DICTIONARY_ENCODINGS)
    return np.array(counts, np.int64), np.array(sizes, np.int64), np.array(indexed, bool)

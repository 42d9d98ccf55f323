"""Binary values (encoded images) read straight from a Lance data file's pages, without a
Lance take per batch.

A Lance take of a batch's image rows costs ~1 GB/s of bytes in Lance's decoder (issue 44's
image bench: ~4 ms of CPU for 13 PNGs of 500 kB, ~14 ms when Lance compressed them with
zstd), a copy from the page cache ~10x less. Lance 2.1+ stores values of 256 bytes and more
in its full-zip layout: with no repetition/definition levels and no compression, a page's
data buffer holds each value as a little-endian length then its bytes, and its repetition
index buffer the byte position of each value (and of the end). :class:`FileValues` reads
each page's index once, then each value with a ``pread`` (the GIL released while the
bytes are copied from the page cache); a page in any other encoding (nulls, zstd, another
layout) does not match and the caller takes rows with Lance. Every value read is checked
against its page's structure (its length prefix equals the span its repetition index
gives), so a layout this reader misreads raises instead of returning bytes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import CorruptData

__all__ = ["FileValues", "open_values"]

# One page of variable-width values (binary, strings) in Lance's full-zip layout, all rows
# valid, no compression (2.1, 2.2). Anything else does not match.
_FULL_ZIP = re.compile(
    r"PageLayout \{ layout: Some\( FullZipLayout\( FullZipLayout \{ bits_rep: 0, bits_def: 0, "
    r"num_items: (\d+), num_visible_items: (\d+), value_compression: Some\( CompressiveEncoding"
    r" \{ compression: Some\( Variable\( Variable \{ offsets: Some\( CompressiveEncoding \{ "
    r"compression: Some\( Flat\( Flat \{ bits_per_value: (32|64), data: None, \}, \), \), \}, "
    r"\), values: None, \}, \), \), \}, \), layers: \[ RepdefAllValidItem, \], details: Some\( "
    r"BitsPerOffset\( (32|64), \), \), \}, \), \), \}"
)
_FILE_VERSIONS = {(2, 1), (2, 2)}  # the Lance file versions whose full-zip layout is known


@dataclass(frozen=True)
class _Page:
    data: int  # byte position of the page's data buffer in the file
    ends: np.ndarray  # rows + 1 byte positions (in the data buffer) of each value's start (the
    # repetition index: 1, 2, 4 or 8 bytes each, as wide as the page needs)
    prefix: int  # bytes of each value's length prefix


class FileValues:
    """The values of one column of one data file (safe to share between threads; the file
    is opened per :meth:`take`, so a table of many files holds no descriptor)."""

    def __init__(self, path: str, pages: list[_Page]):
        self.path = path
        self._pages = pages
        self._starts = np.cumsum([0] + [len(p.ends) - 1 for p in pages])
        self.num_rows = int(self._starts[-1])

    def take(self, rows: np.ndarray) -> list[bytes]:
        """The values at ``rows`` (row positions of this file, in range), in that order."""
        page = np.searchsorted(self._starts, rows, side="right") - 1
        out = []
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for r, p in zip(rows.tolist(), page.tolist()):
                out.append(self._value(fd, r, p))
        finally:
            os.close(fd)
        return out

    def _value(self, fd: int, r: int, p: int) -> bytes:
        pg = self._pages[p]
        i = r - int(self._starts[p])
        a, b = pg.data + int(pg.ends[i]), pg.data + int(pg.ends[i + 1])
        n = int.from_bytes(os.pread(fd, pg.prefix, a), "little")
        value = os.pread(fd, b - a - pg.prefix, a + pg.prefix)
        if n != b - a - pg.prefix or len(value) != n:
            raise CorruptData(
                f"data file {self.path}: row {r}'s value says {n} bytes, its page's index "
                f"{b - a - pg.prefix} (a Lance layout this reader does not know)"
            )
        return value


def open_values(path: str, df: Any, field_id: int, rows: int) -> FileValues | str:
    """The values of field ``field_id`` in data file ``df`` (its fragment has ``rows``
    rows) at local ``path``, or why not (a page not in the plain layout above)."""
    from lance.file import LanceFileReader

    if (df.file_major_version, df.file_minor_version) not in _FILE_VERSIONS:
        return f"Lance file version {df.file_major_version}.{df.file_minor_version}"
    column = list(df.column_indices)[list(df.fields).index(field_id)]
    try:
        meta = LanceFileReader(path).metadata()
    except (OSError, ValueError, RuntimeError) as e:  # Lance's errors: IOError, ValueError
        return f"a data file's metadata could not be read ({type(e).__name__}: {e})"
    if meta.num_rows != rows or column >= len(meta.columns):
        return "a data file's metadata does not match its fragment"
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pages = [_page(page, fd, size) for page in meta.columns[column].pages]
    finally:
        os.close(fd)
    if any(p is None for p in pages) or sum(len(p.ends) - 1 for p in pages) != rows:  # type: ignore[union-attr]
        if any("MiniBlockLayout" in page.encoding for page in meta.columns[column].pages):
            return (
                "a page is in Lance's mini-block layout, which Lance gives small values "
                "(images of a few hundred bytes or less)"
            )
        return "a page is not in Lance's plain full-zip layout (compressed, or nulls)"
    return FileValues(path, pages)  # type: ignore[arg-type]


def _page(page: Any, fd: int, file_size: int) -> _Page | None:
    """Where a page's values are, if it is plain full-zip (its index consistent)."""
    m = _FULL_ZIP.fullmatch(" ".join(page.encoding.split()))
    if m is None or len(page.buffers) != 2:
        return None
    items, visible, bits, offset_bits = (int(g) for g in m.groups())
    (data, size), (at, nbytes) = ((int(b.position), int(b.size)) for b in page.buffers)
    if items != visible or bits != offset_bits or nbytes % (items + 1):
        return None
    width = nbytes // (items + 1)
    if width not in (1, 2, 4, 8) or data + size > file_size or at + nbytes > file_size:
        return None
    ends = np.frombuffer(os.pread(fd, nbytes, at), f"<u{width}").astype(np.int64)
    if ends[0] != 0 or ends[-1] != size or np.any(np.diff(ends) < bits // 8):
        return None
    return _Page(data, ends, bits // 8)

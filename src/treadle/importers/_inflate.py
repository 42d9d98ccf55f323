"""Bounded decompression: never inflate past a stated number of bytes.

A few megabytes of gzip can inflate to gigabytes (zeros compress about 1000:1), so a
compressed source is inflated with a cap and refused, naming the file, once it would
exceed it: :func:`open_capped` for streams (WebDataset ``.tar.gz``/``.tar.bz2``/
``.tar.xz``), :func:`inflate` for whole buffers (MDS shards, whose inflated size
``index.json`` states). Memory then stays bounded by the cap, whatever the input.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from typing import Any, BinaryIO

import pyarrow as pa

from treadle.errors import CorruptData, UnsafeInput

#: the errors a corrupt compressed stream raises (besides OSError and EOFError)
DECOMPRESS_ERRORS = (zlib.error, lzma.LZMAError)

_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def sniff(head: bytes) -> str | None:
    """The compression a stream starting with ``head`` uses (``gzip``, ``bzip2``, ``xz``)."""
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


class _Capped(io.RawIOBase):
    """Reads ``inner`` and raises once more than ``limit`` bytes came out of it."""

    def __init__(self, inner: Any, limit: int, too_big: str):
        self._inner, self._limit, self._too_big, self._n = inner, limit, too_big, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._inner.read(min(len(b), self._limit + 1 - self._n))
        self._n += len(data)
        if self._n > self._limit:
            raise UnsafeInput(self._too_big)
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def cap_stream(inner: Any, limit: int, too_big: str) -> BinaryIO:
    """``inner`` (a readable binary stream) read through a buffer, raising
    :class:`UnsafeInput` (``too_big``) once more than ``limit`` bytes came out of it;
    closing it closes ``inner``."""
    return io.BufferedReader(_Capped(inner, limit, too_big), 1 << 20)


def open_capped(f: io.BufferedReader, limit: int, where: str, option: str) -> BinaryIO:
    """``f``, decompressed if it starts with a gzip/bzip2/xz header, capped at ``limit`` bytes.

    Reading more than ``limit`` inflated bytes raises :class:`UnsafeInput` naming
    ``where`` and the ``option`` that sets the cap. An uncompressed ``f`` is returned
    as it is (its size is its size: nothing to cap).
    """
    kind = sniff(f.peek(6)[:6])
    if kind is None:
        return f
    opener = {"gzip": lambda: gzip.GzipFile(fileobj=f), "bzip2": lambda: bz2.BZ2File(f)}
    inner: Any = opener.get(kind, lambda: lzma.LZMAFile(f))()
    msg = (
        f"{where} ({kind}) inflates to more than {limit:,} bytes ({option}); refused as a "
        f"possible decompression bomb (raise {option} if you trust it)"
    )
    return cap_stream(inner, limit, msg)


def inflate(algo: str, data: bytes, raw_size: int, where: str) -> bytes:
    """Decompress a whole buffer (``algo`` as MDS names it) that should hold ``raw_size`` bytes.

    Never produces (or allocates) more than ``raw_size + 1`` bytes: a buffer that
    inflates to more, or to less, is :class:`CorruptData` naming ``where``.
    """
    name = algo.split(":")[0]
    try:
        if name == "gz":
            out = inflate_streams(lambda: zlib.decompressobj(32 + zlib.MAX_WBITS), data, raw_size)
        elif name == "bz2":
            out = inflate_streams(bz2.BZ2Decompressor, data, raw_size)
        else:
            out = _inflate_arrow(name, data, raw_size, where)
    except CorruptData:
        raise
    except Exception as e:
        raise CorruptData(f"{where}: cannot decompress ({algo}): {type(e).__name__}: {e}") from None
    if len(out) != raw_size:
        raise CorruptData(_wrong_size(where, len(out) > raw_size, raw_size))
    return out


def inflate_streams(new: Any, data: bytes, raw_size: int) -> bytes:
    """Concatenated gzip/bzip2 streams, at most ``raw_size + 1`` bytes of output."""
    parts, n, rest = [], 0, data
    while rest and n <= raw_size:
        d = new()
        parts.append(d.decompress(rest, raw_size + 1 - n))  # > 0: zlib reads 0 as "no limit"
        n += len(parts[-1])
        if not d.eof:
            if n <= raw_size:
                raise EOFError("compressed data ended before the end-of-stream marker")
            break
        rest = d.unused_data
    return b"".join(parts)


def _inflate_arrow(name: str, data: bytes, raw_size: int, where: str) -> bytes:
    """zstd / brotli / snappy through Arrow, which allocates exactly ``raw_size`` bytes.

    Arrow returns that many bytes even when brotli or snappy data inflates to fewer (the
    rest is padding), so their real size is checked: snappy states it in its header;
    brotli data must not fit in one byte less.
    """
    codec = {"zstd": "zstd", "br": "brotli", "snappy": "snappy"}[name]
    if codec == "snappy":
        stated = _varint(data)
        if stated is not None and stated != raw_size:
            raise CorruptData(_wrong_size(where, stated > raw_size, raw_size))
    out = pa.decompress(data, decompressed_size=raw_size, codec=codec, asbytes=True)
    if codec == "brotli" and raw_size > 0:
        try:
            pa.decompress(data, decompressed_size=raw_size - 1, codec=codec)
        except (OSError, pa.ArrowInvalid):
            return out  # needs all raw_size bytes
        raise CorruptData(_wrong_size(where, False, raw_size))
    return out


def _varint(data: bytes) -> int | None:
    """The little-endian base-128 length that starts a raw snappy buffer."""
    value = 0
    for i, byte in enumerate(data[:10]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    return None


def _wrong_size(where: str, more: bool, raw_size: int) -> str:
    return (
        f"{where} inflates to {'more' if more else 'fewer'} than the {raw_size:,} bytes "
        "index.json says (truncated, replaced, or a decompression bomb)"
    )

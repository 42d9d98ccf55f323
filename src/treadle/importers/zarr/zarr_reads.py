"""Reading rows of a Zarr array with the memory it takes known first, and errors named.

Zarr inflates a whole chunk to read any value of it, and nothing ties a chunk's shape to the
array's: a 4-row array may sit in one chunk of a billion rows, a few kilobytes of zeros
once compressed. :func:`read_cost` is what reading rows ``start..end`` holds at once (the
rows, or the chunks they overlap when those are larger, and a sharded array's shard index);
the importer checks it against ``max_episode_bytes`` before reading. :func:`read_rows`
names the array when a chunk cannot be decoded (a corrupt chunk raises the codec's own
error: ``RuntimeError`` from Blosc or Zstd, ``zlib.error``, ...). :func:`check_zip_members`
bounds what a zip store's deflate may inflate a member to.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

from treadle.errors import CorruptData, TreadleError, UnsafeInput

#: bytes of one entry of a shard's index (offset and length, two uint64)
_INDEX_ENTRY = 16


def _overlapped(start: int, end: int, step: int) -> int:
    """The number of blocks of ``step`` rows that rows ``start..end`` touch."""
    return 0 if end <= start else (end - 1) // step - start // step + 1


def read_cost(arr: Any, start: int, end: int) -> int:
    """The most bytes reading rows ``start..end`` of ``arr`` (a zarr array) holds at once."""
    shape, chunks, item = tuple(arr.shape), tuple(arr.chunks), arr.dtype.itemsize
    rows = (end - start) * math.prod(shape[1:]) * item
    if not shape:
        return item
    across = math.prod(-(-s // c) for s, c in zip(shape[1:], chunks[1:]))
    inflated = _overlapped(start, end, chunks[0]) * across * math.prod(chunks) * item
    shards = getattr(arr, "shards", None)
    index = 0
    if shards:
        per_shard = math.prod(-(-s // c) for s, c in zip(shards, chunks))
        touched = _overlapped(start, end, shards[0]) * math.prod(
            -(-s // c) for s, c in zip(shape[1:], shards[1:])
        )
        index = touched * per_shard * _INDEX_ENTRY
    return max(rows, inflated) + index


def describe_chunks(arr: Any) -> str:
    """``(shape) dtype in chunks of (chunks)`` for an error message."""
    return f"{tuple(arr.shape)} {arr.dtype} in chunks of {tuple(arr.chunks)}"


def read_rows(arr: Any, start: int, end: int, at: str) -> Any:
    """``arr[start:end]``; a chunk that cannot be decoded is :class:`CorruptData` naming
    ``at`` (the store and the array)."""
    try:
        return arr[start:end]
    except (TreadleError, MemoryError):
        raise
    except Exception as e:  # each codec raises its own (RuntimeError, zlib.error, ...)
        raise CorruptData(f"{at} cannot be read: {type(e).__name__}: {e}") from None


def check_zip_members(path: str, arrays: list[Any], where: str, slack: int = 16 << 20) -> None:
    """Refuse a zip store whose member inflates to more than any chunk (or shard) of its
    ``arrays`` could hold, twice over plus ``slack`` bytes (a codec never doubles a chunk;
    metadata is small): zarr reads a member whole, and deflate turns a few MB of zeros into
    gigabytes before any codec sees them."""
    largest = max(
        math.prod(getattr(a, "shards", None) or a.chunks) * a.dtype.itemsize for a in arrays
    )
    limit = 2 * largest + slack
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if info.file_size > limit:
                raise UnsafeInput(
                    f"{where}: zip member {info.filename!r} inflates to {info.file_size:,} "
                    f"bytes, more than any chunk of the store needs ({largest:,} bytes the "
                    "largest): refused as a possible zip bomb"
                )

"""TFRecord framing: records read one at a time, both checksums checked, lengths bounded.

A TFRecord file is a sequence of records, each::

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

where ``masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32) of the
CRC-32C (Castagnoli) of ``x``. The CRC is computed by ``google-crc32c`` (Google's C
library, the one ``google-cloud-storage`` uses), part of the ``treadle[rlds]`` extra.

Every error names the file, the record's index and its byte offset: a checksum that does
not match, a file that ends inside a record (:class:`~treadle.errors.CorruptData`), and a
length field larger than the file or than ``max_record_bytes``
(:class:`~treadle.errors.UnsafeInput`, checked before anything is allocated: a record is
held whole, one at a time).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

from treadle.errors import CorruptData, MissingDependency, UnsafeInput

#: the largest record read (an RLDS record is one whole episode, JPEGs included)
MAX_RECORD_BYTES = 1 << 30

RLDS_INSTALL = "pip install 'treadle[rlds]'"
_MASK_DELTA = 0xA282EAD8


def crc32c_module() -> Any:
    """``google_crc32c``, or :class:`MissingDependency` saying how to install it."""
    try:
        import google_crc32c
    except ImportError as e:
        raise MissingDependency(
            f"reading RLDS (TFRecord) needs the 'google-crc32c' package, which is not "
            f"installed ({e}); install it with: {RLDS_INSTALL}"
        ) from None
    return google_crc32c


def masked_crc32c(data: bytes | memoryview) -> int:
    """The TFRecord checksum of ``data``: its CRC-32C, rotated right by 15 bits, plus a delta."""
    return _masked(crc32c_module().value(bytes(data)))


def _read_exact(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes (fewer only at the end of the file)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        chunk = f.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def iter_records(
    f: BinaryIO, size: int, where: str, max_record_bytes: int = MAX_RECORD_BYTES
) -> Iterator[bytes]:
    """The records of one TFRecord file of ``size`` bytes, in order, each checked.

    ``where`` names the file in errors. Raises :class:`CorruptData` on a checksum mismatch
    or a truncated record, :class:`UnsafeInput` on a length above ``max_record_bytes``.
    """
    crc = crc32c_module()
    offset = index = 0
    while True:
        at = f"{where}, record {index} at byte {offset}"
        header = _read_exact(f, 12)
        if not header:
            return
        if len(header) < 12:
            raise CorruptData(f"{at}: the file ends inside the record's header (truncated)")
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:])
        if _masked(crc.value(header[:8])) != length_crc:
            raise CorruptData(f"{at}: the length's checksum does not match (corrupt)")
        if length > max_record_bytes:
            raise UnsafeInput(
                f"{at}: record of {length} bytes is larger than max_record_bytes "
                f"({max_record_bytes}); raise it if this record is real"
            )
        if offset + 16 + length > size:
            raise CorruptData(
                f"{at}: record of {length} bytes runs past the end of the file "
                f"({size} bytes; truncated)"
            )
        data = _read_exact(f, length)
        footer = _read_exact(f, 4)
        if len(data) < length or len(footer) < 4:
            raise CorruptData(f"{at}: the file ends inside the record (truncated)")
        if _masked(crc.value(data)) != struct.unpack("<I", footer)[0]:
            raise CorruptData(f"{at}: the data's checksum does not match (corrupt)")
        yield data
        offset += 16 + length
        index += 1


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record (tests write corrupt shards with it)."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )

"""The MDS layout: ``index.json`` parsed and checked, shards loaded, samples located.

``index.json`` (version 2) lists shards, each with ``column_names``,
``column_encodings``, ``column_sizes`` (``null`` for variable-size columns),
``samples``, ``raw_data`` and, for compressed shards, ``zip_data`` + ``compression``.
A raw shard is ``uint32 num_samples``, ``uint32 offsets[num_samples + 1]``
(absolute), then the samples. Everything read from the index is checked before use:
a malformed one is :class:`CorruptData` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput, UnsupportedFormat
from treadle.importers._inflate import inflate
from treadle.importers.sources import Source, parse_manifest

#: MDS scalar encodings -> numpy dtype
SCALARS = {
    "int": "int64",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
}
#: the dtype byte of an ``ndarray`` value without a dtype in its encoding
ND_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_SIMPLE = {
    "bytes",
    "str",
    "str_int",
    "str_float",
    "str_decimal",
    "pil",
    "jpeg",
    "png",
    "jpeg_array",
    "jpegarray",
    "list[pil]",
    "list[jpeg]",
    "list[png]",
    "json",
    "pkl",
}
_COMPRESSIONS = {"zstd", "gz", "bz2", "br", "snappy"}
#: default ``max_shard_bytes``: the largest raw (uncompressed) shard read; a shard is held
#: in memory whole, and MDS writes shards of 64 MiB by default
MAX_SHARD_BYTES = 1 << 30


@dataclass(frozen=True)
class MdsShard:
    """One shard entry of ``index.json``."""

    index: int
    columns: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]
    samples: int
    raw_name: str
    raw_bytes: int
    zip_name: str | None
    zip_bytes: int | None
    compression: str | None


def check_encoding(enc: str, column: str, where: str, allow_pickle: bool) -> None:
    """Raise for an encoding this importer cannot map (or a pickle without opt-in)."""
    name, _, args = enc.partition(":")
    if name == "pkl" and not allow_pickle:
        raise UnsafeInput(
            f"{where}: column {column!r} has encoding 'pkl'; unpickling runs arbitrary code, "
            "so it is refused (pass allow_pickle=True / --allow-pickle if you trust this data)"
        )
    if name == "ndarray":
        parts = args.split(":") if args else []
        if len(parts) > 2 or (parts and parts[0] not in ND_DTYPES.values()):
            raise UnsupportedFormat(f"{where}: column {column!r}: unknown encoding {enc!r}")
        return
    if args or (name not in _SIMPLE and name not in SCALARS):
        raise UnsupportedFormat(f"{where}: column {column!r}: unknown MDS encoding {enc!r}")


def read_index(source: Source, allow_pickle: bool = False) -> list[MdsShard]:
    """Parse and check ``index.json`` (:class:`NotFound` if missing).

    A malformed index (wrong types, missing keys) is :class:`CorruptData` naming the file.
    """
    return parse_manifest(
        lambda: _read_index(source, allow_pickle), source.describe("index.json"), "MDS index"
    )


def _read_index(source: Source, allow_pickle: bool) -> list[MdsShard]:
    where = source.describe("index.json")
    try:
        raw = source.read("index.json")
    except NotFound:
        raise NotFound(f"no MDS index: {where} does not exist") from None
    try:
        index = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptData(f"{where} is not valid JSON: {e}") from None
    if not isinstance(index, dict) or index.get("version") != 2 or "shards" not in index:
        raise UnsupportedFormat(
            f"{where}: expected an MDS index of version 2, got version {index.get('version')!r}"
            if isinstance(index, dict)
            else f"{where}: not an MDS index"
        )
    out = [
        _shard_entry(i, s, f"{where} shard {i}", allow_pickle)
        for i, s in enumerate(index["shards"])
    ]
    for s in out[1:]:
        first = out[0]
        if s.columns != first.columns or s.encodings != first.encodings:
            raise SchemaMismatch(
                f"{where}: shard {s.index} ({s.raw_name}) has columns "
                f"{list(zip(s.columns, s.encodings))}, shard 0 has "
                f"{list(zip(first.columns, first.encodings))}"
            )
    return out


def _shard_entry(i: int, s: Any, sw: str, allow_pickle: bool) -> MdsShard:
    """One entry of ``index.json``'s ``shards``, checked (``sw`` names it)."""
    try:
        if s.get("format") != "mds":
            raise UnsupportedFormat(f"{sw}: format {s.get('format')!r} is not 'mds'")
        if s.get("version", 2) != 2:
            raise UnsupportedFormat(f"{sw}: shard version {s.get('version')!r} is not 2")
        cols = tuple(s["column_names"])
        encs = tuple(s["column_encodings"])
        sizes = tuple(s["column_sizes"])
        comp = s.get("compression")
        zip_data = s.get("zip_data")
        raw_data = s["raw_data"]
    except (KeyError, TypeError, AttributeError) as e:
        raise CorruptData(f"{sw}: malformed entry ({e})") from None
    if not (len(cols) == len(encs) == len(sizes)):
        raise CorruptData(f"{sw}: column_names/encodings/sizes differ in length")
    bad = [x for x in sizes if x is not None and (type(x) is not int or x < 0)]
    if bad or not all(isinstance(c, str) and isinstance(e, str) for c, e in zip(cols, encs)):
        raise CorruptData(f"{sw}: column names/encodings must be strings, sizes ints >= 0")
    for c, e in zip(cols, encs):
        check_encoding(e, c, sw, allow_pickle)
    if comp is not None and comp.split(":")[0] not in _COMPRESSIONS:
        raise UnsupportedFormat(f"{sw}: unknown compression {comp!r}")
    samples = _count(s["samples"], sw, "samples")
    raw_bytes = _count(raw_data["bytes"], sw, "raw_data.bytes")
    if 4 * (samples + 2) > raw_bytes:
        raise CorruptData(
            f"{sw}: declares {samples:,} samples, but its raw_data of {raw_bytes:,} bytes "
            f"holds at most {max(raw_bytes // 4 - 2, 0):,} (4 bytes of offset each)"
        )
    raw_name = str(raw_data["basename"])
    zip_name = str(zip_data["basename"]) if zip_data else None
    zip_bytes = _count(zip_data["bytes"], sw, "zip_data.bytes") if zip_data else None
    return MdsShard(
        i,
        cols,
        encs,
        sizes,
        samples,
        raw_name,
        raw_bytes,
        zip_name,
        zip_bytes,
        comp if zip_data else None,
    )


def _count(value: Any, where: str, key: str) -> int:
    if type(value) is not int or value < 0:
        raise CorruptData(f"{where}: {key} must be an integer >= 0, got {value!r}")
    return value


def shard_file(source: Source, shard: MdsShard) -> tuple[str, tuple[int, str]]:
    """The file holding ``shard`` (its raw file if present, else its compressed one) and
    its :meth:`Source.identity` (size first)."""
    candidates = [shard.raw_name] + ([shard.zip_name] if shard.zip_name else [])
    for name in candidates:
        ident = source.identity(name)
        if ident is not None:
            return name, ident
    files = " nor ".join(source.describe(n) for n in candidates)
    raise NotFound(f"MDS shard {shard.index} listed in index.json is missing: no {files}")


def load_shard(source: Source, shard: MdsShard, max_shard_bytes: int = MAX_SHARD_BYTES) -> bytes:
    """The raw (decompressed) bytes of a shard, checked against the index.

    The whole shard is held in memory, so one whose raw size is over ``max_shard_bytes``
    is refused (:class:`UnsafeInput`) before anything is read, and a compressed shard is
    never inflated past the raw size ``index.json`` states.
    """
    name, (size, _) = shard_file(source, shard)
    where = source.describe(name)
    if shard.raw_bytes > max_shard_bytes:
        raise UnsafeInput(
            f"MDS shard {where} holds {shard.raw_bytes:,} bytes uncompressed (index.json), more "
            f"than max_shard_bytes={max_shard_bytes:,}; raise max_shard_bytes if you trust it"
        )
    want = shard.raw_bytes if name == shard.raw_name else shard.zip_bytes
    if want is not None and size != want:
        raise CorruptData(
            f"MDS shard {where} has {size} bytes, index.json says {want} (truncated or replaced)"
        )
    if size > max_shard_bytes:
        raise UnsafeInput(
            f"MDS shard {where} has {size:,} bytes, more than max_shard_bytes="
            f"{max_shard_bytes:,}; raise max_shard_bytes if you trust it"
        )
    data = source.read(name)
    if name != shard.raw_name:
        if shard.zip_bytes is not None and len(data) != shard.zip_bytes:
            raise CorruptData(
                f"MDS shard {where} has {len(data)} bytes, index.json says {shard.zip_bytes}"
            )
        data = inflate(shard.compression or "", data, shard.raw_bytes, where)
    if len(data) != shard.raw_bytes:
        raise CorruptData(
            f"MDS shard {where} has {len(data)} bytes, index.json says {shard.raw_bytes} "
            "(truncated or replaced)"
        )
    return data


def shard_samples(
    data: bytes, shard: MdsShard, where: str, lo: int = 0, hi: int | None = None
) -> Iterator[tuple[int, memoryview]]:
    """``(i, sample bytes)`` for samples ``lo..hi`` of a raw shard, offsets checked."""
    if len(data) < 4:
        raise CorruptData(f"MDS shard {where} is too short for a header")
    n = int(np.frombuffer(data, np.uint32, 1)[0])
    if n != shard.samples:
        raise CorruptData(f"MDS shard {where} holds {n} samples, index.json says {shard.samples}")
    if len(data) < 4 * (n + 2):
        raise CorruptData(f"MDS shard {where} is too short for {n} sample offsets")
    offsets = np.frombuffer(data, np.uint32, n + 1, 4).astype(np.int64)
    view = memoryview(data)
    for i in range(lo, n if hi is None else min(hi, n)):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if a < 4 * (n + 2) or b < a or b > len(data):
            raise CorruptData(
                f"MDS shard {where}, sample {i}: offsets [{a}, {b}) point past the shard's "
                f"end ({len(data)} bytes)"
            )
        yield i, view[a:b]

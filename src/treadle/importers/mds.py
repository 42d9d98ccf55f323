"""Import a MosaicML Streaming (MDS) dataset: ``index.json`` plus shards, compressed or not.

The MDS format is parsed here, without ``streaming``: ``index.json`` (version 2) lists
shards, each with ``column_names``, ``column_encodings``, ``column_sizes`` (``null`` for
variable-size columns), ``samples``, ``raw_data`` and, for compressed shards,
``zip_data`` + ``compression`` (``zstd``, ``gz``, ``bz2``, ``br``, ``snappy``, with an
optional ``:level``). A raw shard is ``uint32 num_samples``, ``uint32
offsets[num_samples + 1]`` (absolute), then the samples; a sample is ``uint32`` sizes of
its variable-size columns, then every column's bytes in column order.

Column encodings -> Arrow:

====================================  =============================================
``bytes``                             ``large_binary``
``str``                               ``string``
``int``, ``int8..int64``,             the same integer / float type
``uint8..uint64``, ``float16..64``
``str_int`` / ``str_float``           ``int64`` / ``float64``
``str_decimal``                       ``string`` (exact digits)
``ndarray[:dtype[:shape]]``           fixed-shape tensor (every sample one shape)
``pil``                               ``uint8 [H, W, C]`` tensor (``[H, W]`` for ``L``)
``jpeg``, ``png``                     encoded bytes, or ``uint8 [H, W, 3]`` with
                                      ``images="decoded"``
``jpeg_array``, ``list[jpeg|png]``    ``list<large_binary>`` (encoded images)
``json``                              the JSON value, typed by Arrow (or its text,
                                      ``json_as="text"``)
``pkl``                               refused unless ``allow_pickle=True``
====================================  =============================================
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, NotFound, SchemaMismatch
from treadle.importers._common import (
    DEFAULT_CHUNK_ROWS,
    JSON_HINT,
    ImportResult,
    Progress,
    Source,
    SourceFile,
    UnsafeInput,
    UnsupportedFormat,
    append_tables,
    check_images,
    check_json_as,
    column_name,
    decode_image,
    identities,
    import_id,
    ordered_map,
    parse_manifest,
    resolve_branch,
    rows_to_table,
    run_import,
)
from treadle.importers._inflate import inflate
from treadle.importers.executor import Executor, pick

_SCALARS = {
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
_ND_DTYPES = {
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
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
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
        if len(parts) > 2 or (parts and parts[0] not in _ND_DTYPES.values()):
            raise UnsupportedFormat(f"{where}: column {column!r}: unknown encoding {enc!r}")
        return
    if args or (name not in _SIMPLE and name not in _SCALARS):
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
    out: list[MdsShard] = []
    for i, s in enumerate(index["shards"]):
        sw = f"{where} shard {i}"
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
        out.append(
            MdsShard(
                i,
                cols,
                encs,
                sizes,
                samples,
                str(raw_data["basename"]),
                raw_bytes,
                str(zip_data["basename"]) if zip_data else None,
                _count(zip_data["bytes"], sw, "zip_data.bytes") if zip_data else None,
                comp if zip_data else None,
            )
        )
    if out:
        first = out[0]
        for s in out[1:]:
            if s.columns != first.columns or s.encodings != first.encodings:
                raise SchemaMismatch(
                    f"{where}: shard {s.index} ({s.raw_name}) has columns "
                    f"{list(zip(s.columns, s.encodings))}, shard 0 has "
                    f"{list(zip(first.columns, first.encodings))}"
                )
    return out


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


def decode_value(enc: str, b: memoryview, where: str, images: str, json_as: str = "typed") -> Any:
    """One column value of one sample."""
    name, _, args = enc.partition(":")
    if name in _SCALARS:
        dt = np.dtype(_SCALARS[name])
        if len(b) != dt.itemsize:
            raise CorruptData(f"{where}: {len(b)} bytes for a {name}")
        return np.frombuffer(b, dt, 1).reshape(())
    if name == "bytes":
        return bytes(b)
    if name == "str":
        return bytes(b).decode("utf-8")
    if name == "str_int":
        return int(bytes(b).decode("utf-8"))
    if name == "str_float":
        return float(bytes(b).decode("utf-8"))
    if name == "str_decimal":
        return bytes(b).decode("utf-8")
    if name == "json":
        text = bytes(b).decode("utf-8")
        value = json.loads(text)  # checked even when kept as text
        return text if json_as == "text" else value
    if name == "ndarray":
        return _ndarray(args, b)
    if name == "pil":
        w, h, m = (int(x) for x in np.frombuffer(b, np.uint32, 3))
        mode = bytes(b[12 : 12 + m]).decode("utf-8")
        chans = {"L": 1, "RGB": 3, "RGBA": 4}.get(mode)
        if chans is None:
            raise UnsupportedFormat(f"{where}: PIL mode {mode!r} is not supported")
        arr = np.frombuffer(b, np.uint8, offset=12 + m).reshape(h, w, chans)
        return arr[..., 0] if chans == 1 else arr
    if name in ("jpeg", "png"):
        return decode_image(b, name, where) if images == "decoded" else bytes(b)
    if name in ("jpeg_array", "jpegarray"):
        n = int(np.frombuffer(b, np.uint32, 1)[0])
        sizes = np.frombuffer(b, np.uint32, n, 4).astype(np.int64)
        return _split(b, 4 + 4 * n, sizes)
    if name.startswith("list["):
        n = int(np.frombuffer(b, np.uint32, 1, 4)[0])
        sizes = np.frombuffer(b, np.uint32, n, 8).astype(np.int64)
        return _split(b, 8 + 4 * n, sizes)
    if name == "pkl":
        return pickle.loads(bytes(b))  # noqa: S301 - only reached with allow_pickle=True
    raise UnsupportedFormat(f"{where}: unknown MDS encoding {enc!r}")


def _split(b: memoryview, start: int, sizes: np.ndarray) -> list[bytes]:
    out, pos = [], start
    for s in sizes:
        out.append(bytes(b[pos : pos + int(s)]))
        pos += int(s)
    return out


def _ndarray(args: str, b: memoryview) -> np.ndarray:
    parts = args.split(":") if args else []
    dtype = parts[0] if parts else None
    shape = tuple(int(x) for x in parts[1].split(",")) if len(parts) > 1 else None
    i = 0
    if dtype is None:
        dtype = _ND_DTYPES[b[0]]
        i = 1
    if shape is None:
        byte = b[i]
        i += 1
        ndim, sdt = byte >> 2, _SHAPE_DTYPES[byte & 3]
        nb = ndim * np.dtype(sdt).itemsize
        shape = tuple(int(x) for x in np.frombuffer(b[i : i + nb], sdt))
        i += nb
    return np.frombuffer(b[i:], dtype).reshape(shape)


def decode_sample(
    sample: memoryview, shard: MdsShard, where: str, images: str, json_as: str = "typed"
) -> dict[str, Any]:
    """One raw sample -> ``{column: value}``."""
    sizes: list[int] = []
    pos = 0
    for s in shard.sizes:
        if s:
            sizes.append(int(s))
        else:
            if pos + 4 > len(sample):
                raise CorruptData(f"{where}: sample header is truncated")
            sizes.append(int(np.frombuffer(sample[pos : pos + 4], np.uint32)[0]))
            pos += 4
    if pos + sum(sizes) != len(sample):
        raise CorruptData(
            f"{where}: column sizes add up to {pos + sum(sizes)} bytes, the sample has {len(sample)}"
        )
    out: dict[str, Any] = {}
    for col, enc, size in zip(shard.columns, shard.encodings, sizes):
        try:
            out[col] = decode_value(
                enc, sample[pos : pos + size], f"{where}, column {col!r}", images, json_as
            )
        except (CorruptData, UnsupportedFormat):
            raise
        except Exception as e:
            raise CorruptData(
                f"{where}, column {col!r} ({enc}): cannot decode: {type(e).__name__}: {e}"
            ) from None
        pos += size
    return out


def iter_batches(
    source: Source,
    shards: Sequence[MdsShard],
    *,
    images: str = "encoded",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    threads: int | None = None,
    rename: dict[str, str] | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    json_as: str = "typed",
) -> Iterator[pa.Table]:
    """Arrow tables of at most ``chunk_rows`` samples, shard by shard, decoded on a pool."""
    check_images(images)
    check_json_as(json_as)
    if not shards:
        return
    where = f"MDS dataset {source.root}"
    names = {c: column_name(c, where, rename) for c in shards[0].columns}
    tasks = (
        (shard, lo, min(lo + chunk_rows, shard.samples))
        for shard in shards
        for lo in range(0, max(shard.samples, 1), chunk_rows)
    )

    def run(task: tuple[MdsShard, int, int, bytes]) -> tuple[list[str], list[dict[str, Any]]]:
        shard, lo, hi, data = task
        where_shard = source.describe(shard.raw_name)
        wheres, rows = [], []
        for i, b in shard_samples(data, shard, where_shard, lo, hi):
            w = f"MDS shard {where_shard}, sample {i}"
            rows.append(decode_sample(b, shard, w, images, json_as))
            wheres.append(w)
        return wheres, rows

    # Shards load one at a time in the producer; chunks of a loaded shard decode in parallel.
    schema = None
    first = shards[0]
    hints = {
        c: JSON_HINT
        for c, e in zip(first.columns, first.encodings)
        if e == "json" and json_as == "typed"
    }
    for wheres, rows in ordered_map(run, _with_data(tasks, source, max_shard_bytes), threads):
        if not rows:
            continue
        t = rows_to_table(rows, list(names), lambda i, w=wheres: w[i], schema, hints)
        schema = schema or t.schema
        yield t.rename_columns([names[c] for c in t.column_names])


def _with_data(
    tasks: Iterator[tuple[MdsShard, int, int]], source: Source, max_shard_bytes: int
) -> Iterator[tuple[MdsShard, int, int, bytes]]:
    current, data = None, b""
    for shard, lo, hi in tasks:
        if shard.index != current:
            current, data = None, b""  # let the previous shard go before loading the next
            current, data = shard.index, load_shard(source, shard, max_shard_bytes)
        yield shard, lo, hi, data


def import_mds(
    src: str,
    project: Any,
    table: str,
    *,
    branch: str | None = None,
    images: str = "encoded",
    allow_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    rename: dict[str, str] | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    json_as: str = "typed",
    executor: Executor | None = None,
) -> ImportResult:
    """Import an MDS dataset (a folder or URL holding ``index.json``) into ``table``.

    One commit on ``branch``; see :func:`treadle.importers.webdataset.import_webdataset` for
    the common arguments. ``pkl`` columns are refused unless ``allow_pickle=True``.
    ``max_shard_bytes`` (default 1 GiB) is the largest uncompressed shard read (a shard
    is held in memory whole): a larger one, or a compressed shard inflating past the
    size ``index.json`` gives, stops the import with an error naming the file.
    ``json_as="text"`` stores ``json`` columns as their text (for JSON whose fields or
    types vary from sample to sample; ``"typed"``, the default, stores Arrow values).
    ``executor=td.RayExecutor()`` stages each shard as a Ray task and commits once here.
    """
    source = Source(str(src).rstrip("/"), source_options)
    shards = read_index(source, allow_pickle)
    br = resolve_branch(project, branch, client, root, storage_options)
    files = list(ordered_map(lambda s: shard_file(source, s), shards, threads=16))
    names = ["index.json"] + [name for name, _ in files]
    iid = import_id(
        "mds",
        [source.describe(n) for n in names],
        identities([SourceFile(source, "index.json")]) + [ident for _, ident in files],
        {"images": images, "allow_pickle": allow_pickle, "rename": rename, "json_as": json_as},
    )
    total = sum(s.samples for s in shards)

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        part = pick(shards, only)
        tables = iter_batches(
            source,
            part,
            images=images,
            chunk_rows=chunk_rows,
            rename=rename,
            max_shard_bytes=max_shard_bytes,
            json_as=json_as,
        )
        return append_tables(tw, bar, tables), 0, sum(s.zip_bytes or s.raw_bytes for s in part)

    return run_import(
        fmt="mds",
        branch=br,
        table=table,
        iid=iid,
        what=f"{len(shards)} shard(s) from {source.root}",
        write=write,
        total=total,
        unit="sample",
        progress=progress,
        sources=[source.describe(name) for name, _ in files],
        executor=executor,
    )

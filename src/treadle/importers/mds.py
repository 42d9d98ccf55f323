"""Import a MosaicML Streaming (MDS) dataset: ``index.json`` plus shards, compressed or not.

The MDS format is parsed here, without ``streaming``: :mod:`treadle.importers.mds_index`
reads ``index.json`` (version 2) and the shards, compressed (``zstd``, ``gz``, ``bz2``,
``br``, ``snappy``, with an optional ``:level``) or not; a sample is ``uint32`` sizes of
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

With ``images="decoded"``, samples decode in chunks of at most 32 MiB of pixels (an image
counted from its header: a small PNG of zeros may be 100 MB decoded; one sample at least)
and at most ``IN_FLIGHT_BYTES`` (512 MiB) of chunks decode at once; Pillow's own limit
(``PIL.Image.MAX_IMAGE_PIXELS``) bounds one image.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, UnsupportedFormat
from treadle.importers.arrow import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CHUNK_ROWS,
    IN_FLIGHT_BYTES,
    JSON_HINT,
    check_rename,
    column_name,
    rows_to_table,
)
from treadle.importers.executor import Executor, pick
from treadle.importers.images import decode_image, decoded_bytes
from treadle.importers.mds_index import (
    MAX_SHARD_BYTES,
    ND_DTYPES,
    SCALARS,
    MdsShard,
    load_shard,
    read_index,
    shard_file,
    shard_samples,
)
from treadle.importers.run import (
    ImportOptions,
    ImportResult,
    Progress,
    append_tables,
    import_id,
    run_import,
)
from treadle.importers.sources import Source, SourceFile, identities
from treadle.read.prefetch import ordered_map

if TYPE_CHECKING:
    from treadle.catalog.client import Project

_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


def decode_value(enc: str, b: memoryview, where: str, images: str, json_as: str = "typed") -> Any:
    """One column value of one sample."""
    name, _, args = enc.partition(":")
    if name in SCALARS:
        dt = np.dtype(SCALARS[name])
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
        dtype = ND_DTYPES[b[0]]
        i = 1
    if shape is None:
        byte = b[i]
        i += 1
        ndim, sdt = byte >> 2, _SHAPE_DTYPES[byte & 3]
        nb = ndim * np.dtype(sdt).itemsize
        shape = tuple(int(x) for x in np.frombuffer(b[i : i + nb], sdt))
        i += nb
    return np.frombuffer(b[i:], dtype).reshape(shape)


def _column_sizes(sample: memoryview, shard: MdsShard, where: str) -> tuple[int, list[int]]:
    """Where the first column's bytes start in a raw sample, and each column's size."""
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
    return pos, sizes


def decode_sample(
    sample: memoryview, shard: MdsShard, where: str, images: str, json_as: str = "typed"
) -> dict[str, Any]:
    """One raw sample -> ``{column: value}``."""
    pos, sizes = _column_sizes(sample, shard, where)
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
    opts: ImportOptions | None = None,
    *,
    threads: int | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[pa.Table]:
    """Arrow tables of at most ``opts.chunk_rows`` samples, shard by shard, decoded on a pool."""
    opts = opts or ImportOptions()
    if not shards:
        return
    where = f"MDS dataset {source.root}"
    names = {c: column_name(c, where, opts.rename) for c in shards[0].columns}
    step = opts.chunk_rows
    tasks = (
        (shard, lo, min(lo + step, shard.samples))
        for shard in shards
        for lo in range(0, max(shard.samples, 1), step)
    )

    def run(task: _Task) -> tuple[list[str], list[dict[str, Any]]]:
        shard, lo, hi, data, _ = task
        where_shard = source.describe(shard.raw_name)
        wheres, rows = [], []
        for i, b in shard_samples(data, shard, where_shard, lo, hi):
            w = f"MDS shard {where_shard}, sample {i}"
            rows.append(decode_sample(b, shard, w, opts.images, opts.json_as))
            wheres.append(w)
        return wheres, rows

    # Shards load one at a time in the producer; chunks of a loaded shard decode in parallel.
    schema = None
    first = shards[0]
    hints = {
        c: JSON_HINT
        for c, e in zip(first.columns, first.encodings)
        if e == "json" and opts.json_as == "typed"
    }
    loaded = _with_data(tasks, source, max_shard_bytes, opts.images == "decoded")
    weight, budget = (lambda t: t[4]), IN_FLIGHT_BYTES
    for wheres, rows in ordered_map(
        run, loaded, threads, weight=weight, budget=budget, leave_running=True
    ):
        if not rows:
            continue
        t = rows_to_table(rows, list(names), lambda i, w=wheres: w[i], schema, hints)
        schema = schema or t.schema
        yield t.rename_columns([names[c] for c in t.column_names])


#: ``(shard, first sample, end, the shard's raw bytes, the bytes its samples decode to)``
_Task = tuple[MdsShard, int, int, bytes, int]


def _with_data(
    tasks: Iterator[tuple[MdsShard, int, int]],
    source: Source,
    max_shard_bytes: int,
    decoded: bool,
) -> Iterator[_Task]:
    current, data = None, b""
    for shard, lo, hi in tasks:
        if shard.index != current:
            current, data = None, b""  # let the previous shard go before loading the next
            current, data = shard.index, load_shard(source, shard, max_shard_bytes)
        if decoded and any(e in _IMAGES for e in shard.encodings):
            yield from _cut(shard, lo, hi, data, source.describe(shard.raw_name))
        else:
            yield shard, lo, hi, data, 0


_IMAGES = ("jpeg", "png")


def _cut(shard: MdsShard, lo: int, hi: int, data: bytes, where: str) -> Iterator[_Task]:
    """Samples ``lo..hi`` in runs of at most ``DEFAULT_CHUNK_BYTES`` decoded (one sample at
    least), each with its decoded bytes: an image counts as its pixels, read from its header
    (a 10 KB PNG of zeros may be 100 MB of pixels)."""
    start, size = lo, 0
    for i, b in shard_samples(data, shard, where, lo, hi):
        pos, sizes = _column_sizes(b, shard, f"MDS shard {where}, sample {i}")
        for enc, n in zip(shard.encodings, sizes):
            size += decoded_bytes(b[pos : pos + n]) if enc in _IMAGES else n
            pos += n
        if size >= DEFAULT_CHUNK_BYTES:
            yield shard, start, i + 1, data, size
            start, size = i + 1, 0
    if start < hi:
        yield shard, start, hi, data, size


def import_mds(
    src: str,
    project: Project,
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
    return _import(src, project, table, ImportOptions.of(locals()), max_shard_bytes)


def _import(
    src: str, project: Project, table: str, opts: ImportOptions, max_shard_bytes: int
) -> ImportResult:
    source = Source(str(src).rstrip("/"), opts.source_options)
    shards = read_index(source, opts.allow_pickle)
    check_rename(opts.rename, (c for s in shards for c in s.columns), f"MDS dataset {source.root}")
    br = opts.open_branch(project)
    files = list(
        ordered_map(lambda s: shard_file(source, s), shards, threads=16, leave_running=True)
    )
    names = ["index.json"] + [name for name, _ in files]
    iid = import_id(
        "mds",
        [source.describe(n) for n in names],
        identities([SourceFile(source, "index.json")]) + [ident for _, ident in files],
        opts.id_options("images", "allow_pickle", "rename", "json_as"),
    )
    conv = opts.for_sources()

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        part = pick(shards, only)
        tables = iter_batches(source, part, conv, max_shard_bytes=max_shard_bytes)
        return append_tables(tw, bar, tables), 0, sum(s.zip_bytes or s.raw_bytes for s in part)

    return run_import(
        opts,
        br,
        table,
        fmt="mds",
        iid=iid,
        what=f"{len(shards)} shard(s) from {source.root}",
        write=write,
        total=sum(s.samples for s in shards),
        unit="sample",
        sources=[source.describe(name) for name, _ in files],
    )

"""Import WebDataset tar shards into a table (one row per sample).

The tar files are read with Python's :mod:`tarfile` in streaming mode
(:mod:`treadle.importers.webdataset_tar`) — never with WebDataset's own decoder, which
unpickles ``.pyd``/``.pickle`` members and ``torch.load``s ``.pth``.

Members are grouped into samples by key (the member path up to the first dot of its
base name, as WebDataset does), and each extension becomes a column:

=========================================  ==============================================
extension                                  column
=========================================  ==============================================
``cls``, ``cls2``, ``index``, ``inx``,      ``int64``
``id``
``txt``, ``text``, ``transcript``           ``string`` (UTF-8)
``json``, ``jsn``                           the JSON value, typed by Arrow (struct, list...),
                                            or its text (``json_as="text"``)
``npy``                                     fixed-shape tensor (``np.load(allow_pickle=False)``)
images (``jpg``, ``png``, ``webp``, ...)    encoded bytes (``images="encoded"``) or
                                            ``uint8 [H, W, 3]`` (``images="decoded"``)
``pyd``, ``pickle``, ``pkl``, ``pth``       refused unless ``allow_pickle=True``
anything else                               ``large_binary`` (the member's bytes)
=========================================  ==============================================

The sample key goes to a ``key`` column. Two members that map to one column
(``x.seg.png`` and ``x.seg_png`` both become ``seg_png``) are refused, naming both.
A JSON field's Arrow type is fixed by the first chunk (1,024 samples): a later value
it cannot hold exactly (a float in an integer field, a key it does not have) raises
:class:`SchemaMismatch` naming the sample and the field; integers in a float field
are stored as floats when exact. ``json_as="text"`` keeps JSON members as their text.

Bounded memory on any input: at most ``IN_FLIGHT_BYTES`` (512 MiB) of members are
decoded at once, beyond one chunk (with ``images="decoded"``, an image counts as its pixels,
read from its header); a member is read whole, so one larger than
``max_member_bytes`` (default 1 GiB) is refused from its tar header, before it is
read; a compressed shard (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``) is refused once it
inflates past ``max_shard_bytes`` (default 2 GiB). Both errors
(:class:`UnsafeInput`) name the shard. See :mod:`treadle.importers.run` for
resumability (one transaction, deterministic import id).
"""

from __future__ import annotations

import io
import json
import math
import pickle
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput
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
from treadle.importers.images import IMAGE_EXTS, decode_image, decoded_bytes
from treadle.importers.run import (
    ImportOptions,
    ImportResult,
    Progress,
    append_tables,
    import_id,
    run_import,
)
from treadle.importers.sources import identities, is_url
from treadle.importers.webdataset_tar import (
    MAX_MEMBER_BYTES,
    MAX_SHARD_BYTES,
    Shard,
    is_tar,
    iter_raw_samples,
    resolve_shards,
)
from treadle.read.prefetch import ordered_map

if TYPE_CHECKING:
    from treadle.catalog.client import Project

INT_EXTS = {"cls", "cls2", "index", "inx", "id"}
TEXT_EXTS = {"txt", "text", "transcript"}
JSON_EXTS = {"json", "jsn"}
PICKLE_EXTS = {"pyd", "pickle", "pkl"}
TORCH_EXTS = {"pth", "pt"}
KEY_COLUMN = "key"
#: member bytes being decoded at once (beyond one chunk): huge members do not pile up

_Chunk = list[tuple[str, dict[str, Any]]]


def decode_sample(
    raw: dict[str, Any],
    where: str,
    opts: ImportOptions,
) -> dict[str, Any]:
    """Raw member bytes -> typed values (see the module docstring)."""
    out: dict[str, Any] = {KEY_COLUMN: raw["__key__"]}
    member_of: dict[str, str] = {}
    for ext, data in raw.items():
        if ext == "__key__":
            continue
        last = ext.rsplit(".", 1)[-1].lower()
        col = column_name(ext, where, opts.rename)
        if col == KEY_COLUMN:
            raise SchemaMismatch(f"{where}: a member extension {ext!r} clashes with the key column")
        if col in member_of:
            key = raw["__key__"]
            raise SchemaMismatch(
                f"{where}: members {key}.{member_of[col]} and {key}.{ext} would both be "
                f"stored as column {col!r}; rename one (rename={{{ext!r}: ...}})"
            )
        member_of[col] = ext
        try:
            out[col] = _decode_member(last, data, where, ext, opts)
        except (UnsafeInput, CorruptData, SchemaMismatch):
            raise
        except Exception as e:
            raise CorruptData(
                f"{where}: cannot decode member .{ext}: {type(e).__name__}: {e}"
            ) from None
    return out


def _npy(data: bytes, where: str) -> np.ndarray:
    """A ``.npy`` member, its header checked against its bytes before anything is allocated
    (NumPy allocates the shape a header claims, and loops over zero-byte elements)."""
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    version = npy.read_magic(f)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read(f)
    if dtype.hasobject:
        raise UnsafeInput(f"{where} is an object array (a pickle) and is refused")
    need = math.prod(shape) * dtype.itemsize
    if dtype.itemsize == 0 or need != len(data) - f.tell():
        raise CorruptData(
            f"{where}: its header says {list(shape)} {dtype} ({need:,} bytes), it holds "
            f"{len(data) - f.tell():,} bytes"
        )
    return np.load(io.BytesIO(data), allow_pickle=False)


def _decode_member(last: str, data: bytes, where: str, ext: str, opts: ImportOptions) -> Any:
    if last in PICKLE_EXTS or last in TORCH_EXTS:
        if not opts.allow_pickle:
            raise UnsafeInput(
                f"{where}: member .{ext} is a pickle; unpickling runs arbitrary code, so it is "
                "refused (pass allow_pickle=True / --allow-pickle if you trust this data)"
            )
        if last in TORCH_EXTS:
            import torch

            value = torch.load(io.BytesIO(data), weights_only=False)
        else:
            value = pickle.loads(data)  # noqa: S301 - the user opted in
        if hasattr(value, "numpy") and callable(value.numpy):
            value = value.numpy()
        return value
    if last in INT_EXTS:
        return int(data.decode("utf-8").strip())
    if last in TEXT_EXTS:
        return data.decode("utf-8")
    if last in JSON_EXTS:
        text = data.decode("utf-8")
        value = json.loads(text)  # checked even when kept as text
        return text if opts.json_as == "text" else value
    if last == "npy":
        return _npy(data, f"{where}: member .{ext}")
    if last in IMAGE_EXTS and opts.images == "decoded":
        return decode_image(data, last, f"{where} .{ext}")
    return bytes(data)


def iter_batches(
    shards: Sequence[Shard],
    opts: ImportOptions | None = None,
    *,
    threads: int | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[pa.Table]:
    """Arrow tables of at most ``opts.chunk_rows`` samples (or 32 MiB), in shard order.

    Tar reading is sequential; decoding of each chunk runs on a thread pool, a couple of
    chunks ahead. Every sample must have the same members as the first one.
    """
    opts = opts or ImportOptions()
    members: list[list[str]] = []  # the first sample's members
    limits = (max_member_bytes, max_shard_bytes)
    weigh = partial(_bytes_of, decoded=opts.images == "decoded")
    raw = _raw_chunks(shards, opts.chunk_rows, limits, members, opts.rename, weigh)

    def decode_chunk(chunk: _Chunk) -> tuple[list[str], list[dict[str, Any]]]:
        return [w for w, _ in chunk], [decode_sample(r, w, opts) for w, r in chunk]

    schema: pa.Schema | None = None
    hints: dict[str, str] = {}
    chunks = ordered_map(
        decode_chunk, raw, threads, weight=weigh, budget=IN_FLIGHT_BYTES, leave_running=True
    )
    for wheres, rows in chunks:
        columns = [KEY_COLUMN] + [c for c in rows[0] if c != KEY_COLUMN]
        if schema is None and opts.json_as == "typed":
            json_exts = [e for e in members[0] if e.rsplit(".", 1)[-1].lower() in JSON_EXTS]
            hints = {column_name(e, "", opts.rename): JSON_HINT for e in json_exts}
        table = rows_to_table(rows, columns, lambda i, w=wheres: w[i], schema, hints)
        if schema is None:
            schema = table.schema
        yield table


def _raw_chunks(
    shards: Sequence[Shard],
    chunk_rows: int,
    limits: tuple[int, int],
    members: list[list[str]],
    rename: dict[str, str] | None = None,
    weigh: Any = None,
) -> Iterator[_Chunk]:
    """Raw samples ``(where, {ext: bytes})`` in chunks of ``chunk_rows`` (or 32 MiB); every
    sample's members checked against the first one's (kept in ``members``), and ``rename``
    against those (every sample has the same members)."""
    chunk: _Chunk = []
    size = 0
    for shard in shards:
        for raw in iter_raw_samples(shard, *limits):
            where = f"shard {shard.describe()}, sample {raw['__key__']!r}"
            have = sorted(k for k in raw if k != "__key__")
            if not members:
                members.append(have)
                check_rename(rename, have, where)
            elif have != members[0]:
                raise SchemaMismatch(
                    f"{where} has members {have}, earlier samples have {members[0]}"
                )
            chunk.append((where, raw))
            size += (weigh or _bytes_of)([(where, raw)])
            if len(chunk) >= chunk_rows or size >= DEFAULT_CHUNK_BYTES:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def _bytes_of(chunk: _Chunk, decoded: bool = False) -> int:
    """The members' bytes, images counted as decoded (from their headers) when ``decoded``:
    a 100 KB PNG of zeros may be 100 MB of pixels, and chunks and the decode budget are cut
    by these bytes."""
    return sum(
        decoded_bytes(v) if decoded and k.rsplit(".", 1)[-1].lower() in IMAGE_EXTS else len(v)
        for _, r in chunk
        for k, v in r.items()
        if k != "__key__"
    )


def import_webdataset(
    srcs: Sequence[str] | str,
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
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    json_as: str = "typed",
    executor: Executor | None = None,
) -> ImportResult:
    """Import WebDataset shards into ``table`` of ``project`` (one commit on ``branch``).

    Args:
        srcs: shard paths, folders, object-store URLs or brace patterns
            (``s3://b/shard-{000000..000099}.tar``); a URL ending in ``/`` is a prefix:
            every ``.tar`` under it, in name order.
        project: a :class:`treadle.catalog.Project` or a project name (opened through
            ``client``, or a new ``Client(root, storage_options)``).
        table: the table to append to (created by the first import).
        branch: branch to commit on (default ``main``; created from ``main`` if missing).
        images: ``"encoded"`` keeps image members as bytes, ``"decoded"`` stores
            ``uint8 [H, W, 3]`` tensors (all images of a column must share a shape).
        allow_pickle: unpickle ``.pyd/.pickle/.pkl`` and ``torch.load`` ``.pth`` members.
        source_options: ``storage_options`` for object-store shard URLs.
        progress: show a progress bar (default: when stderr is a terminal).
        rename: source column (member extension) -> table column, e.g. ``{"npy": "action"}``.
        max_member_bytes: the largest member read (default 1 GiB; each is held whole).
        max_shard_bytes: the most bytes a compressed shard may inflate to (default 2 GiB).
        json_as: ``"typed"`` (JSON members as Arrow values) or ``"text"`` (their text,
            for JSON whose fields or types vary from sample to sample).
        executor: where the sources are staged (default: this process);
            ``td.RayExecutor()`` runs one Ray task per shard and commits once here
            (see :mod:`treadle.importers.ray_executor`).

    Returns:
        :class:`ImportResult` with the commit, row count, bytes read and timing.
    """
    opts = ImportOptions.of(locals())
    return _import(srcs, project, table, opts, (max_member_bytes, max_shard_bytes))


def _import(
    srcs: Sequence[str] | str,
    project: Project,
    table: str,
    opts: ImportOptions,
    limits: tuple[int, int],
) -> ImportResult:
    shards = resolve_shards(srcs, opts.source_options)
    br = opts.open_branch(project)
    ids = identities(shards)
    missing = [s.describe() for s, i in zip(shards, ids) if i is None]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        hint = ""
        if is_url(missing[0]) and not is_tar(missing[0]):
            hint = f"; for every shard under that prefix, end it with '/': {missing[0]}/"
        raise NotFound(f"no WebDataset shard {missing[0]}{more}{hint}")
    sizes = [i[0] for i in ids if i is not None]
    names = [s.describe() for s in shards]
    options = opts.id_options("images", "allow_pickle", "rename", "json_as")
    conv = opts.for_sources()

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        tables = iter_batches(
            pick(shards, only), conv, max_member_bytes=limits[0], max_shard_bytes=limits[1]
        )
        return append_tables(tw, bar, tables), 0, sum(pick(sizes, only))

    what = f"{len(shards)} shard(s) from {shards[0].source.root}"
    return run_import(
        opts,
        br,
        table,
        fmt="webdataset",
        iid=import_id("webdataset", names, ids, options),
        what=what,
        write=write,
        total=None,
        unit="sample",
        sources=names,
    )

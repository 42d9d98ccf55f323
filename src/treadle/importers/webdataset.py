"""Import WebDataset tar shards into a table (one row per sample).

The tar files are read with Python's :mod:`tarfile` in streaming mode (``r|*``: plain
or compressed tar, forward-only, bounded memory) — never with WebDataset's own
decoder, which unpickles ``.pyd``/``.pickle`` members and ``torch.load``s ``.pth``.

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
decoded at once, beyond one chunk; a member is read whole, so one larger than
``max_member_bytes`` (default 1 GiB) is refused from its tar header, before it is
read; a compressed shard (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``) is refused once it
inflates past ``max_shard_bytes`` (default 2 GiB). Both errors
(:class:`UnsafeInput`) name the shard. See :mod:`treadle.importers._common` for
resumability (one transaction, deterministic import id).
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, InvalidName, NotFound, SchemaMismatch
from treadle.importers._common import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CHUNK_ROWS,
    IMAGE_EXTS,
    JSON_HINT,
    ImportResult,
    Progress,
    Source,
    SourceFile,
    UnsafeInput,
    append_tables,
    check_images,
    check_json_as,
    column_name,
    decode_image,
    expand_braces,
    identities,
    import_id,
    is_url,
    ordered_map,
    resolve_branch,
    rows_to_table,
    run_import,
    split_url,
)
from treadle.importers._inflate import DECOMPRESS_ERRORS, open_capped
from treadle.importers.executor import Executor, pick

INT_EXTS = {"cls", "cls2", "index", "inx", "id"}
TEXT_EXTS = {"txt", "text", "transcript"}
JSON_EXTS = {"json", "jsn"}
PICKLE_EXTS = {"pyd", "pickle", "pkl"}
TORCH_EXTS = {"pth", "pt"}
KEY_COLUMN = "key"
#: default ``max_member_bytes``: the largest tar member read (each is held whole)
MAX_MEMBER_BYTES = 1 << 30
#: default ``max_shard_bytes``: the most bytes a compressed shard may inflate to
MAX_SHARD_BYTES = 2 << 30
#: member bytes being decoded at once (beyond one chunk): huge members do not pile up
IN_FLIGHT_BYTES = 512 << 20


@dataclass(frozen=True)
class Shard(SourceFile):
    """One tar shard: the source it lives in and its name there."""


def resolve_shards(
    srcs: Sequence[str] | str, storage_options: dict[str, Any] | None = None
) -> list[Shard]:
    """Expand paths, folders (every ``*.tar`` in them), URLs and brace patterns to shards."""
    if isinstance(srcs, str):
        srcs = [srcs]
    out: list[Shard] = []
    sources: dict[str, Source] = {}
    for pattern in srcs:
        if str(pattern).startswith("pipe:"):
            raise InvalidName(f"{pattern!r}: 'pipe:' sources run shell commands and are refused")
        for path in expand_braces(str(pattern)):
            if not is_url(path):
                import os

                if os.path.isdir(path):
                    src = sources.setdefault(path, Source(path))
                    names = [n for n in src.list() if _is_tar(n)]
                    if not names:
                        raise NotFound(f"no .tar shards in folder {path!r}")
                    out.extend(Shard(src, n) for n in names)
                    continue
            root, name = split_url(path)
            src = sources.get(root) or sources.setdefault(root, Source(root, storage_options))
            out.append(Shard(src, name))
    if not out:
        raise NotFound("no WebDataset shards given")
    return out


def _is_tar(name: str) -> bool:
    return name.endswith((".tar", ".tar.gz", ".tgz"))


def split_key(path: str) -> tuple[str, str]:
    """``(key, ext)`` of a member path, as WebDataset splits it (first dot of the base name)."""
    d, _, base = path.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot:
        return path, ""
    return (f"{d}/{stem}" if d else stem), ext


def iter_raw_samples(
    shard: Shard,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[dict[str, Any]]:
    """Samples of one shard as ``{"__key__": str, ext: bytes, ...}``, in tar order.

    A truncated or corrupt tar raises :class:`CorruptData` naming the shard and the last
    sample read; a member over ``max_member_bytes``, or a compressed shard inflating past
    ``max_shard_bytes``, raises :class:`UnsafeInput` naming the shard.
    """
    where = shard.describe()
    current: dict[str, Any] | None = None
    last = "(start)"
    try:
        with shard.source.open(shard.name) as raw:
            f = _Tail(open_capped(raw, max_shard_bytes, f"shard {where}", "max_shard_bytes"))
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, ext = split_key(member.name)
                    if not ext or key.rsplit("/", 1)[-1].startswith("__"):
                        continue  # no extension or a WebDataset metadata member
                    if member.size > max_member_bytes:
                        raise UnsafeInput(
                            f"shard {where}: member {member.name!r} holds {member.size:,} bytes, "
                            f"more than max_member_bytes={max_member_bytes:,} (raise it if you "
                            "trust this shard)"
                        )
                    fobj = tar.extractfile(member)
                    data = fobj.read() if fobj is not None else b""
                    if len(data) != member.size:
                        raise CorruptData(
                            f"shard {where}: member {member.name!r} is truncated "
                            f"({len(data)} of {member.size} bytes)"
                        )
                    if current is not None and current["__key__"] != key:
                        last = current["__key__"]
                        yield current
                        current = None
                    if current is None:
                        current = {"__key__": key}
                    if ext in current:
                        raise CorruptData(f"shard {where}: sample {key!r} has two {ext!r} members")
                    current[ext] = data
                if f.block(tar.offset) != _ZERO_BLOCK:
                    last = current["__key__"] if current is not None else last
                    raise tarfile.ReadError(
                        f"no end-of-archive block at byte {tar.offset:,} (the shard was cut "
                        "there, or holds no tar header)"
                    )
    except (tarfile.TarError, EOFError, OSError, *DECOMPRESS_ERRORS) as e:
        after = f" after sample {last!r}" if last != "(start)" else ""
        raise CorruptData(
            f"shard {where} is truncated or not a tar file{after}: {type(e).__name__}: {e}"
        ) from None
    if current is not None:
        yield current


_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)


class _Tail(io.RawIOBase):
    """Reads ``inner``, keeping its last few chunks, so that the block where tarfile saw the
    archive end can be checked: tarfile ends quietly at the end of the data, at a cut
    header or at garbage where a header should be, not only at the end-of-archive block."""

    #: bytes kept: more than tarfile reads ahead of the header it is parsing (10 KiB)
    KEEP = 64 << 10

    def __init__(self, inner: Any):
        self._inner, self._pos, self._kept = inner, 0, 0
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._inner.read(len(b))
        n = len(data)
        b[:n] = data
        if n:
            self._chunks.append((self._pos, bytes(data)))
            self._pos += n
            self._kept += n
            while self._kept - len(self._chunks[0][1]) >= self.KEEP:
                self._kept -= len(self._chunks.popleft()[1])
        return n

    def block(self, offset: int) -> bytes | None:
        """The (up to) 512 bytes at ``offset``, if still kept; b"" past the end."""
        if offset >= self._pos:
            return b""
        kept = b"".join(c for _, c in self._chunks)
        start = offset - (self._chunks[0][0] if self._chunks else self._pos)
        return kept[start : start + tarfile.BLOCKSIZE] if start >= 0 else None


def decode_sample(
    raw: dict[str, Any],
    where: str,
    *,
    images: str,
    allow_pickle: bool,
    rename: dict[str, str] | None = None,
    json_as: str = "typed",
) -> dict[str, Any]:
    """Raw member bytes -> typed values (see the module docstring)."""
    out: dict[str, Any] = {KEY_COLUMN: raw["__key__"]}
    member_of: dict[str, str] = {}
    for ext, data in raw.items():
        if ext == "__key__":
            continue
        last = ext.rsplit(".", 1)[-1].lower()
        col = column_name(ext, where, rename)
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
            out[col] = _decode_member(last, data, where, images, allow_pickle, ext, json_as)
        except (UnsafeInput, CorruptData, SchemaMismatch):
            raise
        except Exception as e:
            raise CorruptData(
                f"{where}: cannot decode member .{ext}: {type(e).__name__}: {e}"
            ) from None
    return out


def _decode_member(
    last: str, data: bytes, where: str, images: str, allow_pickle: bool, ext: str, json_as: str
) -> Any:
    if last in PICKLE_EXTS or last in TORCH_EXTS:
        if not allow_pickle:
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
        return text if json_as == "text" else value
    if last == "npy":
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise UnsafeInput(
                    f"{where}: member .{ext} is an object array (a pickle) and is refused"
                ) from None
            raise
    if last in IMAGE_EXTS and images == "decoded":
        return decode_image(data, last, f"{where} .{ext}")
    return bytes(data)


def iter_batches(
    shards: Sequence[Shard],
    *,
    images: str = "encoded",
    allow_pickle: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int | None = None,
    stats: dict[str, int] | None = None,
    rename: dict[str, str] | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    json_as: str = "typed",
) -> Iterator[pa.Table]:
    """Arrow tables of at most ``chunk_rows`` samples (or ``chunk_bytes``), in shard order.

    Tar reading is sequential; decoding of each chunk runs on a thread pool, a couple of
    chunks ahead. Every sample must have the same members as the first one.
    """
    check_images(images)
    check_json_as(json_as)
    state: dict[str, Any] = {"members": None, "schema": None}
    stats = stats if stats is not None else {}

    def raw_chunks() -> Iterator[list[tuple[str, dict[str, Any]]]]:
        chunk: list[tuple[str, dict[str, Any]]] = []
        size = 0
        for shard in shards:
            for raw in iter_raw_samples(shard, max_member_bytes, max_shard_bytes):
                where = f"shard {shard.describe()}, sample {raw['__key__']!r}"
                members = sorted(k for k in raw if k != "__key__")
                if state["members"] is None:
                    state["members"] = members
                elif members != state["members"]:
                    raise SchemaMismatch(
                        f"{where} has members {members}, earlier samples have {state['members']}"
                    )
                n = sum(len(v) for k, v in raw.items() if k != "__key__")
                stats["bytes"] = stats.get("bytes", 0) + n
                chunk.append((where, raw))
                size += n
                if len(chunk) >= chunk_rows or size >= chunk_bytes:
                    yield chunk
                    chunk, size = [], 0
        if chunk:
            yield chunk

    def decode_chunk(chunk: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[dict]]:
        return [w for w, _ in chunk], [
            decode_sample(
                r, w, images=images, allow_pickle=allow_pickle, rename=rename, json_as=json_as
            )
            for w, r in chunk
        ]

    hints: dict[str, str] = {}

    def chunk_bytes_of(chunk: list[tuple[str, dict[str, Any]]]) -> int:
        return sum(len(v) for _, r in chunk for k, v in r.items() if k != "__key__")

    chunks = ordered_map(
        decode_chunk, raw_chunks(), threads, weight=chunk_bytes_of, budget=IN_FLIGHT_BYTES
    )
    for wheres, rows in chunks:
        columns = [KEY_COLUMN] + [c for c in rows[0] if c != KEY_COLUMN]
        if state["schema"] is None and json_as == "typed":
            json_exts = [e for e in state["members"] if e.rsplit(".", 1)[-1].lower() in JSON_EXTS]
            hints = {column_name(e, "", rename): JSON_HINT for e in json_exts}
        table = rows_to_table(rows, columns, lambda i, w=wheres: w[i], state["schema"], hints)
        if state["schema"] is None:
            state["schema"] = table.schema
        yield table


def import_webdataset(
    srcs: Sequence[str] | str,
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
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    json_as: str = "typed",
    executor: Executor | None = None,
) -> ImportResult:
    """Import WebDataset shards into ``table`` of ``project`` (one commit on ``branch``).

    Args:
        srcs: shard paths, folders, object-store URLs or brace patterns
            (``s3://b/shard-{000000..000099}.tar``).
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
    shards = resolve_shards(srcs, source_options)
    br = resolve_branch(project, branch, client, root, storage_options)
    ids = identities(shards)
    missing = [s.describe() for s, i in zip(shards, ids) if i is None]
    if missing:
        raise NotFound(
            f"no WebDataset shard {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    sizes = [i[0] for i in ids if i is not None]
    iid = import_id(
        "webdataset",
        [s.describe() for s in shards],
        ids,
        {"images": images, "allow_pickle": allow_pickle, "rename": rename, "json_as": json_as},
    )

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        stats: dict[str, int] = {}
        tables = iter_batches(
            pick(shards, only),
            images=images,
            allow_pickle=allow_pickle,
            chunk_rows=chunk_rows,
            stats=stats,
            rename=rename,
            max_member_bytes=max_member_bytes,
            max_shard_bytes=max_shard_bytes,
            json_as=json_as,
        )
        return append_tables(tw, bar, tables), 0, sum(pick(sizes, only))

    what = f"{len(shards)} shard(s) from {shards[0].source.root}"
    return run_import(
        fmt="webdataset",
        branch=br,
        table=table,
        iid=iid,
        what=what,
        write=write,
        total=None,
        unit="sample",
        progress=progress,
        sources=[s.describe() for s in shards],
        executor=executor,
    )

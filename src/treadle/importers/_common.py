"""Shared pieces of the importers: sources, safe paths, column building, the import driver.

Resumability (the choice every importer shares)
-----------------------------------------------
An import is **one transaction** (:meth:`Branch.transaction`). Rows are staged as
Lance data files that no version references (the transaction flushes every ~64 MB, so
memory stays bounded), and the branch moves once, by compare-and-swap, at the very
end. A crash at any point before that leaves the branch exactly where it was (the
orphaned files are removed by ``treadle gc``); re-running the same command starts
over and cannot duplicate rows, because nothing of the first attempt was ever
visible.

Each import also has a deterministic **import id**: a hash of the format, the
destination table, the options, and the source: each file's URL/path and the
identity of its content (:meth:`Source.identity`: the object store's ETag; for a
local file a SHA-256 of its bytes up to :data:`HASH_BELOW` bytes, else its size and
modification time in nanoseconds). It is written into the commit message
(``import-id=<id>``). Before doing any work, a re-run looks for that id in the
branch's log and, if the commit is there (the crash came after the commit but before
the process noticed), returns that commit instead of importing again. So "run it
again until it succeeds" is always safe, while the same files into another table, or
a corrected file (even one of the same size), import again.

Partial reuse of the data files staged by a crashed attempt was rejected: it would
need a second, non-atomic manifest next to the catalog, and re-reading a source is
cheap next to the risk of committing half-written fragments.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa

from treadle.errors import (  # noqa: F401  (UnsafeInput, UnsupportedFormat re-exported)
    CorruptData,
    InvalidName,
    NotFound,
    SchemaMismatch,
    TreadleError,
    UnsafeInput,
    UnsupportedFormat,
)
from treadle.importers._exact import exact_array
from treadle.read.prefetch import default_threads, ordered_map, prefetch

SHAPE_KEY = b"treadle:shape"
DTYPE_KEY = b"treadle:dtype"
IMPORT_ID_RE = re.compile(r"import-id=([0-9a-f]{16})")
_COLUMN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_T = TypeVar("_T")


#: local source files up to this many bytes are identified by a hash of their content
HASH_BELOW = 1 << 20
#: the end of an error about a JSON value that does not fit its column's type
JSON_HINT = "; import with json_as='text' (--json-as text) to store this JSON as its text"


def check_json_as(json_as: str) -> None:
    """Refuse a ``json_as`` option other than ``"typed"`` and ``"text"``."""
    if json_as not in ("typed", "text"):
        raise ValueError(f"json_as must be 'typed' or 'text', got {json_as!r}")


#: rows per appended chunk (each importer may pick smaller chunks for wide rows)
DEFAULT_CHUNK_ROWS = 1024
#: bytes per appended chunk, whichever limit comes first
DEFAULT_CHUNK_BYTES = 32 << 20


def workers() -> int:
    """Threads used for decoding (both cores on the 2-core machines, at most 8)."""
    return default_threads()


# -- names --------------------------------------------------------------------------------


def column_name(name: str, where: str, rename: dict[str, str] | None = None) -> str:
    """The table column for a source column ``name`` (``rename`` maps source names first).

    Lance refuses ``.`` in top-level field names, so dots become ``_``
    (``observation.images.top`` -> ``observation_images_top``, a WebDataset member
    ``seg.png`` -> ``seg_png``). Anything else unsafe raises :class:`InvalidName`.
    """
    if rename and name in rename:
        name = rename[name]
    out = name.replace(".", "_") if isinstance(name, str) else name
    if not isinstance(out, str) or not _COLUMN.fullmatch(out):
        raise InvalidName(
            f"{where}: column name {name!r} is not allowed (1-128 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)"
        )
    return out


# -- sources ------------------------------------------------------------------------------


def is_url(src: str) -> bool:
    """True for object-store URLs (``s3://``, ``gs://``, ``az://``, ...), False for paths."""
    scheme = urlparse(str(src)).scheme
    return len(scheme) > 1 and scheme != "file"


def expand_braces(pattern: str) -> list[str]:
    """Expand WebDataset brace patterns: ``shard-{000000..000009}.tar``, ``{a,b}``.

    Numeric ranges keep the zero padding of the first bound. Several groups expand as
    a cartesian product, left to right.
    """
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.group(1), rng.group(2)
        width = len(lo)
        a, b = int(lo), int(hi)
        step = 1 if b >= a else -1
        options = [str(i).zfill(width) for i in range(a, b + step, step)]
    else:
        options = body.split(",")
    out: list[str] = []
    for opt in options:
        out.extend(expand_braces(head + opt + tail))
    return out


class Source:
    """Read-only access to files under one source root: a local folder or an object-store URL.

    Every relative path is checked to stay under the root (no ``..``, no absolute paths,
    no symlink leaving a local root): a path from a manifest (``index.json``,
    ``state.json``, ``info.json``) can never read outside the source it came with.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None):
        self.root = str(root)
        self.url = is_url(self.root)
        if self.url:
            from treadle.storage import Store

            self._store = Store.open(self.root.rstrip("/"), storage_options)
            self._local: Path | None = None
        else:
            p = self.root[7:] if self.root.startswith("file://") else self.root
            self._local = Path(p).expanduser().resolve()
            self._store = None

    def __repr__(self) -> str:
        return f"Source({self.root!r})"

    def describe(self, rel: str = "") -> str:
        """A printable name of ``rel`` under the root (no credentials)."""
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def _check(self, rel: str) -> str:
        rel = str(rel).replace("\\", "/")
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if rel.startswith("/") or any(p == ".." for p in parts) or not parts:
            raise InvalidName(f"path {rel!r} escapes the source root {self.root!r}")
        return "/".join(parts)

    def local_path(self, rel: str) -> Path:
        """The local file for ``rel`` (only for local sources), checked to stay under the root."""
        assert self._local is not None
        rel = self._check(rel)
        p = (self._local / rel).resolve()
        if p != self._local and self._local not in p.parents:
            raise InvalidName(f"path {rel!r} escapes the source root {self.root!r}")
        return p

    def exists(self, rel: str) -> bool:
        if self._local is not None:
            return self.local_path(rel).is_file()
        return self._store.exists(self._check(rel))

    def size(self, rel: str) -> int:
        if self._local is not None:
            p = self.local_path(rel)
            if not p.is_file():
                raise NotFound(f"no file {self.describe(rel)}")
            return p.stat().st_size
        return self._store.size(self._check(rel))

    def identity(self, rel: str) -> tuple[int, str] | None:
        """``(size, token)`` of ``rel``'s current content, ``None`` when it does not exist.

        The token changes whenever the content does: the object store's ETag (its
        modification time where it gives none); for a local file, a SHA-256 of its bytes
        when it has at most :data:`HASH_BELOW` bytes, else its modification time in ns
        (a larger file rewritten with the same size and its old mtime restored is not
        seen as changed).
        """
        if self._local is None:
            try:
                return self._store.fingerprint(self._check(rel))
            except NotFound:
                return None
        p = self.local_path(rel)
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > HASH_BELOW:
            return st.st_size, f"mtime_ns:{st.st_mtime_ns}"
        return st.st_size, "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()

    def read(self, rel: str) -> bytes:
        """All bytes of ``rel`` (:class:`NotFound` if missing)."""
        if self._local is not None:
            p = self.local_path(rel)
            try:
                return p.read_bytes()
            except FileNotFoundError:
                raise NotFound(f"no file {self.describe(rel)}") from None
            except IsADirectoryError:
                raise NotFound(f"{self.describe(rel)} is a folder, not a file") from None
        return self._store.get(self._check(rel))

    def open(self, rel: str) -> io.RawIOBase | io.BufferedReader:
        """A sequential binary reader of ``rel`` (ranged GETs of 8 MiB for object stores)."""
        if self._local is not None:
            p = self.local_path(rel)
            try:
                return open(p, "rb")  # noqa: SIM115 - caller closes
            except FileNotFoundError:
                raise NotFound(f"no file {self.describe(rel)}") from None
        key = self._check(rel)
        return io.BufferedReader(_RangeReader(self._store, key, self._store.size(key)), 1 << 20)

    def list(self, rel: str = "") -> list[str]:
        """Files under ``rel`` (recursive), relative to the root, sorted."""
        if self._local is not None:
            base = self._local / self._check(rel) if rel else self._local
            if not base.exists():
                return []
            return sorted(
                str(p.relative_to(self._local)).replace(os.sep, "/")
                for p in base.rglob("*")
                if p.is_file()
            )
        prefix = self._check(rel) if rel else ""
        return self._store.list(prefix)


@dataclass(frozen=True)
class SourceFile:
    """One file under a :class:`Source`: the source and the file's name there."""

    source: Source
    name: str

    def describe(self) -> str:
        return self.source.describe(self.name)


class _RangeReader(io.RawIOBase):
    """A forward-only reader of one object through ranged GETs (bounded memory)."""

    CHUNK = 8 << 20

    def __init__(self, store: Any, key: str, size: int):
        self._store, self._key, self._size, self._pos = store, key, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._pos >= self._size:
            return 0
        n = min(len(b), self._size - self._pos, self.CHUNK)
        from treadle.storage import RangeRequest

        data = self._store.get_ranges([RangeRequest(self._key, self._pos, self._pos + n)])[0]
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def parse_manifest(parse: Callable[[], _T], where: str, what: str) -> _T:
    """``parse()``, with a malformed manifest (wrong types, missing keys) as :class:`CorruptData`.

    Treadle's own errors pass through; ``TypeError``, ``KeyError``, ``ValueError``,
    ``AttributeError`` and ``IndexError`` become ``CorruptData("{where}: malformed {what} ...")``.
    """
    try:
        return parse()
    except TreadleError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
        raise CorruptData(f"{where}: malformed {what} ({type(e).__name__}: {e})") from None


def split_url(path: str) -> tuple[str, str]:
    """``(root, name)`` of a file path or URL: its folder and its base name."""
    s = str(path).rstrip("/")
    if "/" not in s:
        return ".", s
    root, name = s.rsplit("/", 1)
    return root or "/", name


# -- values -> arrow -----------------------------------------------------------------------


def tensor_field(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> pa.Field:
    """A fixed-shape tensor field as the table layer stores it."""
    size = math.prod(shape)
    return pa.field(
        name,
        pa.list_(pa.from_numpy_dtype(dtype), size),
        metadata={
            SHAPE_KEY: json.dumps(list(shape)).encode(),
            DTYPE_KEY: np.dtype(dtype).name.encode(),
        },
    )


def tensor_array(stack: np.ndarray) -> pa.Array:
    """``[n, *shape]`` numpy -> flat fixed-size-list array (zero-copy for contiguous input)."""
    size = math.prod(stack.shape[1:]) if stack.ndim > 1 else 1
    flat = np.ascontiguousarray(stack).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), size)


def rows_to_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    where: Callable[[int], str],
    schema: pa.Schema | None = None,
    hints: dict[str, str] | None = None,
) -> pa.Table:
    """Python/numpy values per row -> one Arrow table.

    numpy arrays become tensor columns (every row must have the same dtype and
    shape), bytes become ``large_binary``, everything else is inferred by Arrow. With
    ``schema`` (fixed by the first chunk) the result is cast to it. A value that does
    not fit, or that the type would change (a float in an integer field, a struct key
    the type lacks, an integer beyond int64), raises :class:`SchemaMismatch` naming the
    sample (``where(row)``) and the field, ending with ``hints[column]`` if given;
    integers are widened to floats only when exact.
    """
    fields: list[pa.Field] = []
    arrays: list[pa.Array] = []
    for col in columns:
        values = [r.get(col) for r in rows]
        missing = [i for i, r in enumerate(rows) if col not in r]  # a JSON null is a value
        if missing:
            have = sorted(rows[missing[0]])
            raise SchemaMismatch(
                f"{where(missing[0])} has no {col!r} (it has {have}); every sample must have "
                "the same members"
            )
        want = schema.field(col) if schema is not None and col in schema.names else None
        if isinstance(values[0], np.ndarray):
            first = values[0]
            for i, v in enumerate(values):
                if (
                    not isinstance(v, np.ndarray)
                    or v.shape != first.shape
                    or v.dtype != first.dtype
                ):
                    got = f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else type(v)
                    raise SchemaMismatch(
                        f"{where(i)}: {col!r} is {got}, earlier samples have "
                        f"{first.dtype}{list(first.shape)}"
                    )
            stack = np.stack(values) if first.ndim else np.asarray(values)
            if first.ndim == 0:
                f, a = pa.field(col, pa.from_numpy_dtype(first.dtype)), pa.array(stack)
            else:
                f, a = tensor_field(col, first.dtype, first.shape), tensor_array(stack)
        elif isinstance(values[0], (bytes, bytearray, memoryview)):
            f, a = pa.field(col, pa.large_binary()), pa.array(values, pa.large_binary())
        else:
            typ = want.type if want is not None else None
            a = exact_array(values, col, where, typ, (hints or {}).get(col, ""))
            f = pa.field(col, a.type)
        if want is not None and (f.type != want.type or f.metadata != want.metadata):
            if isinstance(values[0], np.ndarray) and not values[0].ndim:
                # as within a chunk: a cast would round float64 to float32 without a word
                have = np.dtype(want.type.to_pandas_dtype())
                raise SchemaMismatch(
                    f"{where(0)}: {col!r} is {values[0].dtype}, earlier samples have {have}"
                )
            if f.metadata != want.metadata or SHAPE_KEY in (want.metadata or {}):
                raise SchemaMismatch(
                    f"{where(0)}: {col!r} is {_describe(f)}, earlier samples have {_describe(want)}"
                )
            try:
                a = a.cast(want.type)
                f = want
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise SchemaMismatch(
                    f"{where(0)}: {col!r} is {_describe(f)}, earlier samples have {_describe(want)}"
                ) from None
        fields.append(f)
        arrays.append(a)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _describe(f: pa.Field) -> str:
    meta = f.metadata or {}
    if SHAPE_KEY in meta:
        return f"{meta.get(DTYPE_KEY, b'?').decode()}{meta[SHAPE_KEY].decode()}"
    return str(f.type)


# -- images ----------------------------------------------------------------------------------

IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "tif", "tiff"}
_AV_CODEC = {"jpg": "mjpeg", "jpeg": "mjpeg", "png": "png", "webp": "webp", "bmp": "bmp"}


def decode_image(data: bytes, ext: str, where: str) -> np.ndarray:
    """Encoded image bytes -> ``uint8 [H, W, 3]`` RGB (``[H, W]`` kept for 8-bit grey).

    Pillow decodes when it is installed (the decoder WebDataset, MDS and ``datasets``
    use, so decoded pixels equal theirs exactly, JPEG included); otherwise FFmpeg
    (PyAV, a treadle dependency) decodes JPEG/PNG/WebP/BMP.
    """
    ext = ext.lower().rsplit(".", 1)[-1]
    try:
        from PIL import Image
    except ImportError:
        Image = None  # noqa: N806
    if Image is not None:
        try:
            img = Image.open(io.BytesIO(bytes(data)))
            img = img.convert("L" if img.mode in ("L", "1") else "RGB")
            return np.asarray(img)
        except Exception as e:
            raise CorruptData(f"{where}: cannot decode {ext or 'image'}: {e}") from None
    codec = _AV_CODEC.get(ext) or _sniff(data)
    if codec is None:
        raise SchemaMismatch(f"{where}: decoding .{ext} images needs Pillow")
    import av

    try:
        ctx = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(bytes(data)))
        if not frames:
            frames = ctx.decode(None)
        frame = frames[0]
        if frame.format.name in ("gray", "gray8"):
            return frame.to_ndarray()
        return frame.to_ndarray(format="rgb24")
    except Exception as e:  # FFmpeg errors are many types
        raise CorruptData(f"{where}: cannot decode {ext or 'image'}: {e}") from None


def _sniff(data: bytes) -> str | None:
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8"):
        return "mjpeg"
    if head.startswith(b"\x89PNG"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


# -- the import driver --------------------------------------------------------------------------


@dataclass
class ImportResult:
    """What an import did: the commit (None when the source was empty), rows, bytes, seconds."""

    commit: Any
    table: str
    rows: int
    episodes: int
    bytes_read: int
    seconds: float
    import_id: str
    skipped: bool = False

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds > 0 else float("inf")


def identities(files: Sequence[SourceFile]) -> list[tuple[int, str] | None]:
    """:meth:`Source.identity` of each file (``None`` for a missing one), looked up in parallel."""
    return list(ordered_map(lambda f: f.source.identity(f.name), files, threads=16))


def import_id(
    fmt: str, sources: Sequence[str], identities: Sequence[Any], options: dict[str, Any]
) -> str:
    """The deterministic id of an import's source: format, files, their content, options.

    ``identities`` name each file's content (:func:`identities`). :func:`run_import`
    adds the destination table to this id before it records or looks it up.
    """
    blob = json.dumps(
        {
            "format": fmt,
            "sources": list(sources),
            "identities": list(identities),
            "options": options,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def table_import_id(iid: str, table: str) -> str:
    """The id recorded for source id ``iid`` imported into ``table``."""
    return hashlib.sha256(json.dumps([iid, table]).encode()).hexdigest()[:16]


def find_import(branch: Any, iid: str, limit: int = 200) -> Any:
    """The commit of ``branch`` (within ``limit`` commits) that recorded import ``iid``."""
    try:
        log = branch.log(limit=limit)
    except TreadleError:
        return None
    for c in log:
        m = IMPORT_ID_RE.search(c.message or "")
        if m and m.group(1) == iid:
            return c
    return None


def resolve_branch(
    project: Any,
    branch: str | None,
    client: Any = None,
    root: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """A :class:`Branch` from a project name or object (created if missing)."""
    from treadle.errors import NotFound as _NF

    if isinstance(project, str):
        if client is None:
            from treadle.catalog import Client

            client = Client(root, storage_options)
        project = client.project(project)
    name = branch or "main"
    try:
        return project.branch(name)
    except _NF:
        if name == "main":
            raise
        return project.create_branch(name)


class Progress:
    """A tqdm bar (disabled when ``progress`` is False or stderr is not a terminal)."""

    def __init__(self, total: int | None, desc: str, unit: str, enabled: bool | None):
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, desc=desc, unit=unit, disable=(enabled is False) or None, leave=False
        )
        self._lock = threading.Lock()

    def update(self, n: int, nbytes: int = 0) -> None:
        with self._lock:
            self._bar.update(n)

    def close(self) -> None:
        self._bar.close()


def check_images(images: str) -> None:
    """Refuse an ``images`` option other than ``"encoded"`` and ``"decoded"``."""
    if images not in ("encoded", "decoded"):
        raise ValueError(f"images must be 'encoded' or 'decoded', got {images!r}")


def append_tables(tw: Any, bar: Progress, tables: Iterable[pa.Table]) -> int:
    """Append ``tables`` (read ahead on a background thread) to ``tw``; the rows appended."""
    rows = 0
    for t in prefetch(tables):
        tw.append(t)
        rows += t.num_rows
        bar.update(t.num_rows)
    return rows


def run_import(
    *,
    fmt: str,
    branch: Any,
    table: str,
    iid: str,
    what: str,
    write: Callable[[Any, Progress], tuple[int, int, int]],
    total: int | None,
    unit: str,
    progress: bool | None,
    sources: Sequence[str] = (),
    executor: Any = None,
) -> ImportResult:
    """Run ``write(table_writer, bar) -> (rows, episodes, bytes)`` in one transaction.

    ``iid`` is the source's :func:`import_id`; the id recorded (and returned) also covers
    ``table``. Skips the work (and returns the earlier commit) when ``branch`` already
    has a commit recording that id. On any exception nothing is committed. With an
    ``executor`` (:mod:`treadle.importers.executor`), it stages the ``sources`` instead
    (``write(tw, bar, only=[i, ...])`` for each) into this same transaction.
    """
    import time

    from treadle.names import check_name

    check_name(table, "table")
    iid = table_import_id(iid, table)
    done = find_import(branch, iid)
    if done is not None:
        return ImportResult(done, table, 0, 0, 0, 0.0, iid, skipped=True)
    t0 = time.perf_counter()
    if executor is not None:
        total, unit = len(sources), "source"
    bar = Progress(total, f"import {fmt}", unit, progress)
    try:
        message = f"import {fmt} {what} into {table} (import-id={iid})"
        with branch.transaction(message) as tx:
            if executor is None:
                rows, episodes, nbytes = write(tx.table(table), bar)
            else:
                rows, episodes, nbytes = executor.write(tx.table(table), write, sources, bar)
    finally:
        bar.close()
    return ImportResult(tx.commit, table, rows, episodes, nbytes, time.perf_counter() - t0, iid)

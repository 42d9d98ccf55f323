"""Where an import reads from: local folders and object-store URLs, checked paths, file identity.

A :class:`Source` is read-only access to the files under one root. Every relative path
is checked to stay under that root, so a path taken from a manifest (``index.json``,
``state.json``, ``info.json``) can never read outside the source it came with.
:meth:`Source.identity` names a file's content (for the import id, see
:mod:`treadle.importers.run`).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from treadle.errors import CorruptData, InvalidName, NotFound, StorageError, TreadleError
from treadle.read.prefetch import ordered_map

if TYPE_CHECKING:
    from treadle.storage import Store

_T = TypeVar("_T")

#: local source files up to this many bytes are identified by a hash of their content
HASH_BELOW = 1 << 20


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

            try:
                store = Store.open(self.root.rstrip("/"), storage_options)
            except StorageError as e:
                raise as_source_error(e) from None
            self._store: Any = _SourceStore(store)
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
        info = self._store.stat(key)  # every range of this version (replaced: ChangedObject)
        return io.BufferedReader(_RangeReader(self._store, key, info.size, info.etag), 1 << 20)

    def list(self, rel: str = "") -> list[str]:
        """Files under ``rel`` (recursive), relative to the root, sorted; a link (to a file
        or a folder) that leaves a local root is :class:`InvalidName`."""
        if self._local is not None:
            base = self._local / self._check(rel) if rel else self._local
            if not base.exists():
                return []
            found = list(base.rglob("*"))
            for p in found:  # a reader (zarr) opens paths under a linked folder itself
                if p.is_symlink():
                    self.local_path(str(p.relative_to(self._local)).replace(os.sep, "/"))
            return sorted(
                str(p.relative_to(self._local)).replace(os.sep, "/") for p in found if p.is_file()
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

    def __init__(self, store: Store, key: str, size: int, etag: str | None = None):
        self._store, self._key, self._size, self._pos = store, key, size, 0
        self._etag = etag

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._pos >= self._size:
            return 0
        n = min(len(b), self._size - self._pos, self.CHUNK)
        from treadle.storage import RangeRequest

        data = self._store.get_ranges(
            [RangeRequest(self._key, self._pos, self._pos + n, self._etag)]
        )[0]
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def as_source_error(e: StorageError) -> StorageError:
    """``e`` (of a source's store) naming the source's options: an import's
    ``storage_options``/``--storage-option`` are the destination's, its source's are
    ``source_options``/``--source-option``."""
    text = str(e)
    if "storage_options" not in text and "--storage-option" not in text:
        return e
    text = text.replace("storage_options", "source_options")
    try:
        return type(e)(text.replace("--storage-option", "--source-option"))
    except TypeError:  # an error class that takes more than its message: as it was
        return e


class _SourceStore:
    """A source's :class:`Store`: its errors name the source's options (:func:`as_source_error`)."""

    def __init__(self, store: Store):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        got = getattr(self._store, name)
        if not callable(got):
            return got

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return got(*args, **kwargs)
            except StorageError as e:
                raise as_source_error(e) from None

        return call


def identities(files: Sequence[SourceFile]) -> list[tuple[int, str] | None]:
    """:meth:`Source.identity` of each file (``None`` for a missing one), looked up in parallel."""
    return list(
        ordered_map(lambda f: f.source.identity(f.name), files, threads=16, leave_running=True)
    )


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

"""A bounded local cache of immutable objects (Lance data files) of object-store roots.

A random sample of a table on an object store costs one GET per row (~30 ms each at a
cloud region's latency, a few thousand per second per server at best); the same rows of a
local file are a memory-mapped gather (~60k samples/s). Lance data files never change once
written (a new version writes new files, named by a random id), so a local copy keyed by
root and key is the object itself for as long as it exists: :class:`FileCache` keeps such
copies, and :mod:`treadle.read.fixed` maps them as it maps the files of a local root.

- **Where**: ``$TREADLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/treadle/objects``, else
  ``~/.cache/treadle/objects``. One flat folder; every process of the machine shares it.
- **Bound**: ``$TREADLE_CACHE_BYTES`` (bytes, or with a ``K``/``M``/``G``/``T`` suffix;
  default :data:`DEFAULT_BYTES`, ``0`` turns the cache off). The files it holds, the
  downloads under way included, never sum to more: a download first reserves its size
  (under a lock on the folder), evicting the least recently used files, and never leaves
  less than :data:`MIN_FREE_BYTES` / :data:`MIN_FREE_SHARE` of its disk free
  (``$TREADLE_CACHE_MIN_FREE``, bytes or a size, replaces both); an object that
  does not fit is not cached, and its reader says why (``td.info()``, the ``cached reads``
  fast path) and reads it as before (a Lance take per batch).
- **Safe**: an entry is named by a hash of (root URL with its endpoint or account, key,
  size); it is written to a ``.part`` file under a lock of its own, flushed to disk, then
  renamed into place, so a reader never sees a partial copy; one of the wrong size is
  fetched again. A copy a reader maps is held (:class:`CachedFile`, a shared ``flock``)
  and never evicted: an unlinked file that is still mapped would keep its bytes on disk
  beyond the bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from treadle.concurrency import CONCURRENCY
from treadle.fastpaths import log
from treadle.fork_locks import renew_lock_in_child

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no cache, and file_cache() says why
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from treadle.storage.store import Store

__all__ = [
    "DEFAULT_BYTES",
    "CachedFile",
    "FileCache",
    "delete_forgetting_copies",
    "copy_name",
    "file_cache",
    "forget_copies",
]

DEFAULT_BYTES = 16 << 30
"""The cache's bound when ``$TREADLE_CACHE_BYTES`` is not set (16 GiB)."""

MIN_FREE_BYTES = 1 << 30
MIN_FREE_SHARE = 0.05
"""A copy is not made when it would leave less than the larger of 1 GiB and 5% of the
cache's disk free (unless ``$TREADLE_CACHE_MIN_FREE`` says how much to keep free)."""

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str, name: str = "TREADLE_CACHE_BYTES") -> int:
    """``"1073741824"``, ``"512M"``, ``"16G"`` (binary units, an optional ``B``) -> bytes;
    ``name``: the setting it was given as, for the error."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SUFFIX and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a size (e.g. 16G)") from None
    if value < 0:
        raise ValueError(f"{name}={text!r} is negative")
    if not math.isfinite(value * _SUFFIX[unit]):  # float() takes "nan", "inf", "1e400"
        raise ValueError(f"{name}={text!r} is not a finite size (e.g. 16G)")
    return int(value * _SUFFIX[unit])


def default_dir() -> Path:
    if d := os.environ.get("TREADLE_CACHE_DIR"):
        return Path(d).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "treadle" / "objects"


def file_cache() -> FileCache | str:
    """The cache this process's environment configures, or why there is none."""
    if fcntl is None:
        return "the object cache needs POSIX file locks (fcntl), which this system lacks"
    raw = os.environ.get("TREADLE_CACHE_BYTES")
    limit = DEFAULT_BYTES if raw is None else parse_bytes(raw)
    if limit <= 0:
        return "the object cache is off (TREADLE_CACHE_BYTES=0)"
    raw_free = os.environ.get("TREADLE_CACHE_MIN_FREE")
    keep_free = None if raw_free is None else parse_bytes(raw_free, "TREADLE_CACHE_MIN_FREE")
    where = default_dir()
    key = (str(where), limit, keep_free)
    with _LOCK:
        hit = _CACHES.get(key)
        if hit is None:
            try:
                hit = _CACHES[key] = FileCache(where, limit, keep_free)
            except OSError as e:
                return f"the object cache folder {str(where)!r} is not usable ({e.strerror})"
    return hit


_CACHES: dict[tuple[str, int, int | None], FileCache] = {}
_LOCK = threading.Lock()


renew_lock_in_child(sys.modules[__name__], "_LOCK")


class FileCache:
    """Local copies of immutable objects, at most ``max_bytes`` in ``directory``, leaving
    ``min_free`` bytes of its disk free (``None``: the larger of :data:`MIN_FREE_BYTES`
    and :data:`MIN_FREE_SHARE` of the disk)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int,
                 min_free: int | None = None):  # fmt: skip
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.min_free = min_free
        here = self.directory  # made on the first copy: the nearest folder that exists
        while not here.exists() and here.parent != here:
            here = here.parent
        if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(here))
        self.fetched = 0  # objects this process downloaded (tests count them)

    def __repr__(self) -> str:
        return f"FileCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def path(self, store: Store, key: str, size: int) -> Path | str:
        """:meth:`open`, closed at once: the copy's path (which may then be evicted)."""
        got = self.open(store, key, size)
        if isinstance(got, str):
            return got
        got.close()
        return got.path

    def open(self, store: Store, key: str, size: int) -> CachedFile | str:
        """A local copy of object ``key`` of ``store`` (``size`` bytes, as its metadata
        says), downloaded now when it is not held, and held (never evicted) until its
        :meth:`CachedFile.close`; or why not (it does not fit)."""
        if size > self.max_bytes:
            return (
                f"an object of {size:,} bytes is larger than the object cache's bound "
                f"({self.max_bytes:,} bytes, TREADLE_CACHE_BYTES)"
            )
        name = copy_name(store, key, size)
        final = self.directory / name
        self.directory.mkdir(parents=True, exist_ok=True)  # removed since: made again
        with _locked(self.directory / f"{name}.lock"):
            if _size(final) == size:
                os.utime(final)  # recently used
                return CachedFile(final)
            with contextlib.suppress(FileNotFoundError):
                final.unlink()  # a copy of another size: never used
            part = self.directory / f"{name}.part"
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                why = self._reserve(fd, size, keep={name})
                if why is not None:
                    part.unlink()
                    return why
                store.download(key, fd, size, CONCURRENCY.cache_part_bytes,
                               CONCURRENCY.cache_parts_in_flight)  # fmt: skip
                os.fdatasync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    part.unlink()
                raise
            finally:
                os.close(fd)
            os.replace(part, final)
            self.fetched += 1
            log.info("treadle: cached %s/%s (%s bytes) in %s", store.url, key, size, final)
            return CachedFile(final)

    def used(self) -> int:
        """Bytes the cache's files hold now (downloads under way included)."""
        if not self.directory.is_dir():
            return 0
        return sum(s for _, s, _ in _entries(self.directory))

    def _reserve(self, fd: int, size: int, keep: set[str]) -> str | None:
        """Make room for ``size`` bytes and give them to the open ``.part`` file ``fd``
        (under the folder's lock); or why there is no room."""
        with _locked(self.directory / ".lock"):
            entries = _entries(self.directory)
            used = sum(s for _, s, _ in entries)
            disk = os.statvfs(self.directory)  # never fill the disk: keep a margin free
            margin = self.min_free
            if margin is None:
                margin = max(MIN_FREE_BYTES, int(MIN_FREE_SHARE * disk.f_blocks * disk.f_frsize))
            limit = min(self.max_bytes, used + disk.f_bavail * disk.f_frsize - margin)
            for path, s, _ in sorted(entries, key=lambda e: e[2]):  # least recently used first
                if used + size <= limit:
                    break
                stem = path.name.removesuffix(".part")
                if stem in keep or not _evict(path):
                    continue
                used -= s
            if used + size > limit:
                held = f"{used:,} are in use by readers or downloads"
                if limit < self.max_bytes:
                    held += (f"; the disk it is on keeps {margin:,} bytes free "
                             "(TREADLE_CACHE_MIN_FREE)")  # fmt: skip
                return (
                    f"the object cache ({self.max_bytes:,} bytes, TREADLE_CACHE_BYTES) has no "
                    f"room for {size:,} bytes: {held}"
                )
            os.ftruncate(fd, size)  # counted from now on (its apparent size)
        return None


class CachedFile:
    """A copy in the cache, held: while open, no process evicts it (a shared ``flock`` on
    the file; an eviction takes an exclusive one, without waiting)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY)
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, os may be gone
            self.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _entries(directory: Path) -> list[tuple[Path, int, float]]:
    """(path, apparent size, last use) of every copy and download in the folder."""
    out = []
    for e in os.scandir(directory):
        if e.name.startswith(".") or e.name.endswith(".lock") or e.is_dir():
            continue  # a folder: the chunk store's (treadle.storage.chunkstore)
        with contextlib.suppress(FileNotFoundError):
            st = e.stat()
            out.append((Path(e.path), st.st_size, st.st_mtime))
    return out


def forget_copies(store: Store, key: str, size: int) -> None:
    """Remove this machine's copies of object ``key`` (``size`` bytes) from the object
    cache and the chunk cache (a purge's old data files; a copy a reader holds open stays
    until it closes it, and its name is never used again)."""
    if fcntl is None:
        return
    name = copy_name(store, key, size)
    where = default_dir()
    if (where / name).exists():
        _evict(where / name)
    chunks = where / "chunk-slots"  # every chunk size's files (chunkfolder.chunk_of)
    if chunks.is_dir():
        from treadle.storage.chunkfolder import remove_named
        from treadle.storage.folderlock import folder_lock

        with folder_lock(chunks):
            remove_named(chunks, name)
    from treadle.storage.chunkfolder import LEGACY_FOLDER, remove_legacy

    # the folder before slots named an object by its root URL alone
    by_url = hashlib.sha256(f"{store.url}\0{key}\0{size}".encode()).hexdigest()[:40]
    remove_legacy(where / LEGACY_FOLDER, by_url)


def copy_name(store: Store, key: str, size: int) -> str:
    """The name of this machine's copy of object ``key`` (``size`` bytes) of ``store``: a hash
    of its place (URL, endpoint, account: :attr:`Store.place`), key and size. Two servers
    with one bucket name hold two objects of one key, never served for each other."""
    place = getattr(store, "place", store.url)
    return hashlib.sha256(f"{place}\0{key}\0{size}".encode()).hexdigest()[:40]


def delete_forgetting_copies(store: Store, key: str, size: int) -> None:
    """Delete object ``key`` (``size`` bytes) and this machine's copies of it (purge, gc):
    forgotten before the delete (a process dying in between leaves no copy of an object no
    listing names any more) and again after (a reader that copied it in between)."""
    forget_copies(store, key, size)
    try:
        store.delete(key)
    finally:
        forget_copies(store, key, size)


def _evict(path: Path) -> bool:
    """Remove a copy no reader holds, or a download no process holds any more (its writer
    died): whether it went. A download under way (its lock held) or a copy held open by a
    reader (:class:`CachedFile`) stays: its bytes would stay on disk while it is mapped."""
    stem = path.name.removesuffix(".part")
    try:
        with _locked(path.with_name(f"{stem}.lock"), wait=False):
            if not path.name.endswith(".part") and _held(path):
                return False
            path.unlink(missing_ok=True)
            path.with_name(f"{stem}.lock").unlink(missing_ok=True)
        return True
    except BlockingIOError:
        return False


def _held(path: Path) -> bool:
    """Whether a reader holds the copy at ``path`` (a shared ``flock`` on it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing), released on exit or when the
    process dies. A lock file removed while waiting (by an eviction) is locked afresh."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)

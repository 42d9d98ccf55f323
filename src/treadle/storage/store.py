"""One object-store root for everything treadle keeps: catalogs, tables, media.

A :class:`Store` is a root URI (a local path, ``file://``, ``s3://``, ``gs://``
or ``az://``) opened through ``obstore``. Keys are ``/``-separated paths
relative to the root. Lance opens the same root through :meth:`Store.lance_uri`
and :attr:`Store.lance_options`, so both see one set of credentials.

Credentials are held only in the store objects; they are never part of a ``repr``,
an error message or anything treadle writes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError
from obstore.store import LocalStore

from treadle.errors import NotFound, StorageError
from treadle.storage import cloud
from treadle.storage.after_fork import claim
from treadle.storage.cloud import _CLOUD_SCHEMES, check_root_url, open_cloud, shown_root
from treadle.storage.credsource import Credentials, advice, credentials_of
from treadle.storage.loop import _Loop, request
from treadle.storage.objects import ObjectInfo, RangeRequest  # noqa: F401 - re-exported
from treadle.storage.ranged import Pins, RangedReads
from treadle.storage.retry import (
    _RETRY_ATTEMPTS,
    _backoff,
    _transient,
    _with_retries,
)
from treadle.storage.store_errors import missing_object, store_error


def default_root() -> str:
    """``$TREADLE_ROOT`` if set, else ``~/.treadle``."""
    return os.environ.get("TREADLE_ROOT") or str(Path.home() / ".treadle")


class Store(RangedReads):
    """An object-store root. Use :meth:`Store.open`."""

    def __init__(self, url: str, inner: Any, lance_root: str, lance_options: dict[str, str],
                 place: str | None = None):  # fmt: skip
        self.url = url
        #: the URL and its endpoint/account (:func:`.cloud.store_place`): what caches key by
        self.place = place or url
        self._inner = inner
        self._lance_root = lance_root.rstrip("/")
        self._lance_options = lance_options
        #: where the credentials came from (named when a request is refused), if known
        self.credentials: Credentials | None = None
        self._pins = Pins()  # the version (ETag) of each key its first ranged read saw

    # -- construction -------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        create: bool = False,
    ) -> Store:
        """Open ``root`` (default :func:`default_root`, created if missing).

        A local root must exist and be writable unless ``create=True``. Object-store
        roots need credentials in ``storage_options`` or the usual environment
        variables; without them this raises :class:`CredentialsError` before any
        request is made.
        """
        options = {str(k): v for k, v in (storage_options or {}).items()}
        if root is None:
            root, create = default_root(), True
        root = os.fspath(root)
        parsed = urlparse(root)
        if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
            path = Path(parsed.path if parsed.scheme == "file" else root).expanduser().resolve()
            return cls._open_local(path, create)
        check_root_url(root)
        if parsed.scheme not in _CLOUD_SCHEMES:
            raise StorageError(
                f"unsupported root {shown_root(root)!r}: use a path or s3://, gs://, az://, file://"
            )
        inner, lance_options = open_cloud(root, parsed.scheme, options)
        place = cloud.store_place(root.rstrip("/"), parsed.scheme, options)
        store = cls(root.rstrip("/"), inner, root.rstrip("/"), lance_options, place)
        store.credentials = credentials_of(parsed.scheme, options)
        return store

    @classmethod
    def _open_local(cls, path: Path, create: bool) -> Store:
        if not path.exists():
            if not create:
                raise StorageError(
                    f"root {str(path)!r} does not exist: check the path, or create it "
                    "(td.Client(root, create=True); treadle import and treadle demo create "
                    "their --root)"
                )
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(f"cannot create root {str(path)!r}: {e.strerror}") from None
        if not path.is_dir():
            raise StorageError(f"root {str(path)!r} is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise StorageError(f"root {str(path)!r} is not writable")
        inner = LocalStore(prefix=str(path))
        return cls(str(path), inner, str(path), {})

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- Lance --------------------------------------------------------------------------
    def lance_uri(self, key: str) -> str:
        """The URI Lance opens for ``key`` (a dataset directory under the root)."""
        return f"{self._lance_root}/{key}"

    @property
    def lance_options(self) -> dict[str, str] | None:
        """``storage_options`` for Lance (None for local roots)."""
        return dict(self._lance_options) or None

    def relative_key(self, uri: str) -> str:
        """The key under this root of ``uri`` (a :meth:`lance_uri` or one below it)."""
        root = self._lance_root + "/"
        if not uri.startswith(root):
            raise StorageError(f"{uri!r} is not under the root {self.url!r}")
        return uri[len(root) :]

    @property
    def is_local(self) -> bool:
        return isinstance(self._inner, LocalStore)

    # -- objects ------------------------------------------------------------------------
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write ``data`` at ``key``. With ``if_absent``, return False if it already exists."""
        self._claim("write", key)
        try:
            _with_retries(
                lambda: obstore.put(
                    self._inner, key, data, mode="create" if if_absent else "overwrite"
                )
            )
            return True
        except (AlreadyExistsError, PreconditionError):
            if if_absent:
                return False
            raise
        except Exception as e:
            raise self._error("write", key, e) from None

    def get(self, key: str) -> bytes:
        """All bytes of ``key`` (:class:`NotFound` if missing)."""
        self._claim("read", key)
        try:
            return _with_retries(lambda: bytes(obstore.get(self._inner, key).bytes()))
        except Exception as e:
            raise self._error("read", key, e) from None

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
            return True
        except NotFound:
            return False

    def size(self, key: str) -> int:
        return int(self._head(key)["size"])

    def modified(self, key: str) -> datetime:
        """When ``key`` was last written (UTC)."""
        return self._head(key)["last_modified"]

    def stat(self, key: str) -> ObjectInfo:
        """Size, last-modified time and ETag (None where the store gives none) of ``key``."""
        h = self._head(key)
        return ObjectInfo(int(h["size"]), h["last_modified"], h.get("e_tag"))

    def fingerprint(self, key: str) -> tuple[int, str]:
        """``(size, token)`` of ``key``: the token (its ETag, else its modification time)
        changes whenever its content does."""
        h = self._head(key)
        token = h.get("e_tag") or h.get("version") or h["last_modified"].isoformat()
        return int(h["size"]), str(token)

    def _head(self, key: str) -> Any:
        self._claim("stat", key)
        try:
            return _with_retries(lambda: obstore.head(self._inner, key))
        except Exception as e:
            raise self._error("stat", key, e) from None

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursive), sorted."""
        self._claim("list", prefix)
        prefix = prefix.rstrip("/") + "/"

        def list_all() -> list[str]:
            out: list[str] = []
            for chunk in obstore.list(self._inner, prefix):
                out.extend(str(m["path"]) for m in chunk)
            return out

        try:
            out = _with_retries(list_all)
        except Exception as e:
            if not missing_object(e):
                raise self._error("list", prefix, e) from None
            return []
        return sorted(out)

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        """Keys under ``prefix`` (recursive) with their size and mtime, from the listing
        itself (no request per key)."""
        self._claim("list", prefix)
        prefix = prefix.rstrip("/") + "/"

        def list_all() -> dict[str, ObjectInfo]:
            out: dict[str, ObjectInfo] = {}
            for chunk in obstore.list(self._inner, prefix):
                for m in chunk:
                    out[str(m["path"])] = ObjectInfo(int(m["size"]), m["last_modified"])
            return out

        try:
            return _with_retries(list_all)
        except (NotFoundError, FileNotFoundError):
            return {}
        except Exception as e:
            raise self._error("list", prefix, e) from None

    def missing(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` that do not exist (HEAD requests, many in flight)."""
        self._claim("stat", keys[0] if keys else "")
        limit = asyncio.Semaphore(64)

        async def gone(key: str) -> bool:
            async with limit:
                for attempt in range(_RETRY_ATTEMPTS):
                    try:
                        await request(obstore.head_async(self._inner, key))
                        return False
                    except (NotFoundError, FileNotFoundError):
                        return True
                    except Exception as e:
                        if attempt == _RETRY_ATTEMPTS - 1 or not _transient(e):
                            raise self._error("stat", key, e) from None
                    await asyncio.sleep(_backoff(attempt))
            raise AssertionError("unreachable")

        async def all_() -> list[bool]:
            return await asyncio.gather(*(gone(k) for k in keys))

        _Loop.get()  # a StorageError after the exit hook, before any coroutine exists

        return [k for k, g in zip(keys, _Loop.run(all_()) if keys else []) if g]

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate sub-folder names under ``prefix``."""
        self._claim("list", prefix)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        try:
            res = _with_retries(lambda: obstore.list_with_delimiter(self._inner, prefix or None))
        except Exception as e:
            if not missing_object(e):
                raise self._error("list", prefix, e) from None
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"])

    def entries(self, prefix: str = "") -> list[str]:
        """Names directly under ``prefix`` (``""``: the root): sub-folders and objects."""
        self._claim("list", prefix)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        try:
            res = _with_retries(lambda: obstore.list_with_delimiter(self._inner, prefix or None))
        except (NotFoundError, FileNotFoundError):
            return []
        except Exception as e:
            raise self._error("list", prefix, e) from None
        paths = list(res["common_prefixes"]) + [str(o["path"]) for o in res["objects"]]
        return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in paths})

    def delete(self, key: str) -> None:
        self._claim("delete", key)
        try:
            _with_retries(lambda: obstore.delete(self._inner, key))
        except Exception as e:
            if not missing_object(e):
                raise self._error("delete", key, e) from None

    def _claim(self, op: str, key: str) -> None:
        """A :class:`ForkError` (never a hang) in a process forked after a request."""
        claim(f"{op} {self.url}/{key}")

    def _error(self, op: str, key: str, e: Exception) -> Exception:
        return store_error(self.url, op, key, e, advice(self.credentials), self.place)

"""One object-store root for everything treadle keeps: catalogs, tables, media.

A :class:`Store` is a root URI (a local path, ``file://``, ``s3://``, ``gs://``
or ``az://``) opened through ``obstore``. Keys are ``/``-separated paths
relative to the root. Lance opens the same root through :meth:`Store.lance_uri`
and :attr:`Store.lance_options`, so both see one set of credentials.

Credentials are held only in the store objects; they are never part of a
``repr``, an error message or anything treadle writes.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import LocalStore, from_url

from treadle.errors import CredentialsError, NotFound, StorageError, TreadleError

_CLIENT_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "timeout",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "http1_only",
    "http2_only",
    "proxy_url",
    "user_agent",
}
_SECRET_HINTS = ("secret", "key", "token", "password", "credential", "sas", "signature")
_CLOUD_SCHEMES = {"s3", "gs", "az", "abfs", "abfss", "azure"}
_ENV_PREFIX = {"s3": "AWS_", "gs": "GOOGLE_"} | dict.fromkeys(
    ("az", "abfs", "abfss", "azure"), "AZURE_"
)

# obstore retries 5xx, 429, timeouts and connection errors itself (``retry_config`` in
# ``_open_cloud``), but not every failure while a response *body* streams in: a LIST
# whose body is cut off surfaces as "error getting list response body", a cut GET as
# a body error. Those are retried once more here, bounded in count and time.
_RETRY_ATTEMPTS = 6
_RETRY_BUDGET_S = 60.0
_TRANSIENT_HINTS = (
    "body error",
    "response body",
    "error sending request",
    "connection",
    "timed out",
    "timeout",
    "broken pipe",
    "incomplete",
    "unexpected eof",
    "slowdown",
    "status code: 5",
    "service unavailable",
    "internal error",
    "bad gateway",
    "gateway timeout",
)
_T = TypeVar("_T")


def _transient(e: BaseException) -> bool:
    """A failure that may well succeed if tried again (never 4xx, never a missing key)."""
    if isinstance(
        e,
        (
            NotFoundError,
            FileNotFoundError,
            AlreadyExistsError,
            PreconditionError,
            PermissionDeniedError,
            UnauthenticatedError,
            NotImplementedError,
            ValueError,
            TypeError,
        ),
    ):
        return False
    # every obstore error's debug text names its "retry_timeout": not a timeout
    text = str(e).lower().replace("retry_timeout", "")
    if "403 forbidden" in text or "401 unauthorized" in text or "accessdenied" in text:
        return False
    if re.search(r"after [1-9][0-9]* retries", text):
        return False  # obstore already spent its retries (and its retry_timeout) on it
    return any(h in text for h in _TRANSIENT_HINTS)


def _backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(2 s, 0.05 s * 2**attempt)]."""
    return random.uniform(0.0, min(2.0, 0.05 * 2**attempt))


def _with_retries(fn: Callable[[], _T]) -> _T:
    deadline = time.monotonic() + _RETRY_BUDGET_S
    for attempt in range(_RETRY_ATTEMPTS):
        try:
            return fn()
        except Exception as e:
            last = attempt == _RETRY_ATTEMPTS - 1 or time.monotonic() >= deadline
            if last or not _transient(e):
                raise
        time.sleep(_backoff(attempt))
    raise AssertionError("unreachable")


def default_root() -> str:
    """``$TREADLE_ROOT`` if set, else ``~/.treadle``."""
    return os.environ.get("TREADLE_ROOT") or str(Path.home() / ".treadle")


_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` safe to print: anything that looks like a secret is masked.

    That is every value of a key that names a secret, and the ``user:password@`` part of
    any URL value (``proxy_url="http://user:pw@proxy:3128"``).
    """
    out: dict[str, Any] = {}
    for k, v in (options or {}).items():
        lk = k.lower()
        secret = any(h in lk for h in _SECRET_HINTS) and "region" not in lk
        out[k] = "***" if secret else _URL_USERINFO.sub("***@", v) if isinstance(v, str) else v
    return out


def _option_value(v: Any) -> str:
    """A storage option value as object_store and Lance parse it (``True`` -> ``"true"``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    text = str(v)
    low = text.strip().lower()
    if low in ("true", "yes", "on", "false", "no", "off"):
        return "true" if low in ("true", "yes", "on") else "false"
    return text


def _as_bool(v: Any) -> bool:
    return str(v).lower() in {"1", "true", "yes", "on"}


class _Loop:
    """One long-lived event loop thread shared by every store (obstore's async API).

    Nothing is left running on it when a call returns or the interpreter exits: a
    request still in flight in obstore's Rust runtime while Python finalises calls back
    into a dying interpreter (SIGABRT/SIGSEGV at exit). :meth:`gather` cancels and awaits
    the siblings of a failed request; an ``atexit`` hook cancels and awaits whatever is
    still running (another thread's read), then stops the loop.
    """

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _pid: int | None = None
    _SHUTDOWN_WAIT_S = 10.0

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="treadle-io", daemon=True)
                t.start()
                if cls._pid is None:
                    atexit.register(cls.shutdown)
                cls._loop, cls._thread, cls._pid = loop, t, os.getpid()
            return cls._loop

    @classmethod
    def run(cls, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, cls.get()).result()

    @staticmethod
    async def gather(coros: Sequence[Any]) -> list[Any]:
        """``asyncio.gather``, but the first failure cancels the others and waits for them."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            await _cancel_and_wait(tasks)
            raise

    @classmethod
    def shutdown(cls) -> None:
        """Cancel and await every task on the loop, then stop it (run at interpreter exit)."""
        with cls._lock:
            loop, thread, pid = cls._loop, cls._thread, cls._pid
            cls._loop = cls._thread = None
        if loop is None or thread is None or pid != os.getpid() or not loop.is_running():
            return

        async def drain() -> None:
            me = asyncio.current_task()
            await _cancel_and_wait([t for t in asyncio.all_tasks() if t is not me])

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(drain(), loop).result(cls._SHUTDOWN_WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(cls._SHUTDOWN_WAIT_S)
        if not thread.is_alive():
            loop.close()


async def _cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class ObjectInfo:
    """Size and last-modified time (UTC, the store's clock) of one object."""

    size: int
    modified: datetime


@dataclass(frozen=True)
class RangeRequest:
    """Bytes ``[start, end)`` of object ``key``."""

    key: str
    start: int
    end: int


class Store:
    """An object-store root. Use :meth:`Store.open`."""

    def __init__(self, url: str, inner: Any, lance_root: str, lance_options: dict[str, str]):
        self.url = url
        self._inner = inner
        self._lance_root = lance_root.rstrip("/")
        self._lance_options = lance_options

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
        if parsed.scheme not in _CLOUD_SCHEMES:
            raise StorageError(
                f"unsupported root {root!r}: use a path or s3://, gs://, az://, file://"
            )
        return cls._open_cloud(root, parsed.scheme, options)

    @classmethod
    def _open_local(cls, path: Path, create: bool) -> Store:
        if not path.exists():
            if not create:
                raise StorageError(
                    f"root {str(path)!r} does not exist (create it, or pass create=True)"
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

    @classmethod
    def _open_cloud(cls, root: str, scheme: str, options: dict[str, Any]) -> Store:
        if scheme == "s3":
            _require_s3_credentials(root, options)
        if _ENV_PREFIX.get(scheme) == "AZURE_":
            _refuse_emulator_with_endpoint(root, options)
        client = {k: _option_value(v) for k, v in options.items() if k.lower() in _CLIENT_KEYS}
        config = {k: _option_value(v) for k, v in options.items() if k.lower() not in _CLIENT_KEYS}
        # obstore ignores the environment's client settings (AWS_ALLOW_HTTP=true, ...) once
        # client_options are passed, so they are read here the way object_store's from_env would
        given = {k.lower() for k in client}
        for key in _CLIENT_KEYS - given:
            value = os.environ.get(_ENV_PREFIX.get(scheme, "AWS_") + key.upper())
            if value is not None:
                client[key] = _option_value(value)
        if scheme == "s3" and any(k.lower() in ("aws_endpoint", "endpoint") for k in config):
            config.setdefault("aws_virtual_hosted_style_request", "false")
        retry = {
            "max_retries": 8,
            "backoff": {
                "init_backoff": timedelta(milliseconds=50),
                "max_backoff": timedelta(seconds=5),
                "base": 2.0,
            },
            "retry_timeout": timedelta(seconds=120),
        }
        try:
            inner = from_url(
                root.rstrip("/"), config=config, client_options=client, retry_config=retry
            )
        except Exception as e:  # obstore raises on unknown keys etc.; never echo values
            raise StorageError(
                f"cannot open {root!r}: {type(e).__name__}: {_first_line(e)}"
            ) from None
        lance_options = {k: _option_value(v) for k, v in options.items()}
        if "allow_http" in client:
            lance_options["allow_http"] = client["allow_http"]
        return cls(root.rstrip("/"), inner, root.rstrip("/"), lance_options)

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

    @property
    def is_local(self) -> bool:
        return isinstance(self._inner, LocalStore)

    # -- objects ------------------------------------------------------------------------
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write ``data`` at ``key``. With ``if_absent``, return False if it already exists."""
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

    def fingerprint(self, key: str) -> tuple[int, str]:
        """``(size, token)`` of ``key``: the token (its ETag, else its modification time)
        changes whenever its content does."""
        h = self._head(key)
        token = h.get("e_tag") or h.get("version") or h["last_modified"].isoformat()
        return int(h["size"]), str(token)

    def _head(self, key: str) -> Any:
        try:
            return _with_retries(lambda: obstore.head(self._inner, key))
        except Exception as e:
            raise self._error("stat", key, e) from None

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursive), sorted."""
        prefix = prefix.rstrip("/") + "/"

        def list_all() -> list[str]:
            out: list[str] = []
            for chunk in obstore.list(self._inner, prefix):
                out.extend(str(m["path"]) for m in chunk)
            return out

        try:
            out = _with_retries(list_all)
        except Exception as e:
            if not _missing_object(e):
                raise self._error("list", prefix, e) from None
            return []
        return sorted(out)

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        """Keys under ``prefix`` (recursive) with their size and mtime, from the listing
        itself (no request per key)."""
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
        limit = asyncio.Semaphore(64)

        async def gone(key: str) -> bool:
            async with limit:
                for attempt in range(_RETRY_ATTEMPTS):
                    try:
                        await obstore.head_async(self._inner, key)
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

        return [k for k, g in zip(keys, _Loop.run(all_()) if keys else []) if g]

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate sub-folder names under ``prefix``."""
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        try:
            res = _with_retries(lambda: obstore.list_with_delimiter(self._inner, prefix or None))
        except Exception as e:
            if not _missing_object(e):
                raise self._error("list", prefix, e) from None
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"])

    def entries(self, prefix: str = "") -> list[str]:
        """Names directly under ``prefix`` (``""``: the root): sub-folders and objects."""
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
        try:
            _with_retries(lambda: obstore.delete(self._inner, key))
        except Exception as e:
            if not _missing_object(e):
                raise self._error("delete", key, e) from None

    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes]:
        """Fetch many byte ranges, many requests in flight; ranges of one object are coalesced."""
        if not requests:
            return []
        by_key: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_key.setdefault(r.key, []).append(i)

        async def one(key: str, idx: list[int]) -> tuple[list[int], list[Any]]:
            starts = [requests[i].start for i in idx]
            ends = [requests[i].end for i in idx]
            deadline = time.monotonic() + _RETRY_BUDGET_S
            for attempt in range(_RETRY_ATTEMPTS):
                try:
                    bufs = await obstore.get_ranges_async(
                        self._inner, key, starts=starts, ends=ends
                    )
                    break
                except Exception as e:
                    last = attempt == _RETRY_ATTEMPTS - 1 or time.monotonic() >= deadline
                    if last or not _transient(e):
                        raise self._error("read", key, e) from None
                await asyncio.sleep(_backoff(attempt))
            return idx, bufs

        out: list[bytes] = [b""] * len(requests)
        for idx, bufs in _Loop.run(_Loop.gather([one(k, v) for k, v in by_key.items()])):
            for i, b in zip(idx, bufs):
                out[i] = b.to_bytes() if hasattr(b, "to_bytes") else bytes(b)
        return out

    def _error(self, op: str, key: str, e: Exception) -> Exception:
        where = f"{self.url}/{key}"
        bucket = _missing_bucket(e)
        if bucket is not None:
            return StorageError(
                f"{op} {where} failed: bucket {bucket or urlparse(self.url).netloc!r} does not "
                "exist (check the root URL and the endpoint)"
            )
        if _missing_object(e):
            return NotFound(f"no object {where}")
        text = str(e)
        denied = "403 Forbidden" in text or "401 Unauthorized" in text or "AccessDenied" in text
        if isinstance(e, (UnauthenticatedError, PermissionDeniedError)) or denied:
            return CredentialsError(
                f"{op} {where} refused: access denied (check credentials in storage_options "
                "or the AWS_*/GOOGLE_*/AZURE_* environment)"
            )
        return StorageError(f"{op} {where} failed: {type(e).__name__}: {_first_line(e)}")


def lance_error(e: BaseException, where: str) -> TreadleError:
    """A Lance read/write failure as a treadle error naming ``where`` (table, version, ...).

    Lance raises ``OSError``/``ValueError``/``pyarrow.ArrowInvalid`` whose text carries
    object_store's cause; this maps "lacked the necessary privileges" to
    :class:`CredentialsError`, a missing object to :class:`NotFound`, anything else to
    :class:`StorageError`, keeping the first line of Lance's text (no credentials: Lance
    never puts them in its messages; the endpoint URL may appear).
    """
    text = _first_line(e) if isinstance(e, Exception) else str(e)
    low = text.lower()
    bucket = _missing_bucket(e)
    if bucket is not None:
        return StorageError(
            f"{where}: bucket {bucket or '(of the root)'!r} does not exist (check the root URL "
            f"and the endpoint): {text}"
        )
    if "necessary privileges" in low or "403 forbidden" in low or "accessdenied" in low:
        return CredentialsError(
            f"{where}: access denied (check credentials in storage_options or the "
            f"AWS_*/GOOGLE_*/AZURE_* environment): {text}"
        )
    if "not found" in low or "does not exist" in low or "nosuchkey" in low:
        return NotFound(f"{where}: {text}")
    return StorageError(f"{where}: {type(e).__name__}: {text}")


_XML_ERROR = re.compile(r"<\?xml[^>]*\?>\s*<Error>(.*?)</Error>", re.S)
# S3's NoSuchBucket and Azure's ContainerNotFound (its XML body; a bulk DELETE's reason text)
_NO_SUCH_BUCKET = re.compile(
    r"<Code>(NoSuchBucket|ContainerNotFound)</Code>|The specified (bucket|container) does not exist"
)


def _xml_summary(m: re.Match[str]) -> str:
    """An S3 XML error body as ``Code: Message`` (the raw XML is unreadable in a message)."""
    code = re.search(r"<Code>(.*?)</Code>", m.group(1), re.S)
    msg = re.search(r"<Message>(.*?)</Message>", m.group(1), re.S)
    return ": ".join(x.group(1).strip() for x in (code, msg) if x) or "(S3 error)"


def _first_line(e: BaseException) -> str:
    text = _XML_ERROR.sub(_xml_summary, str(e)).strip().splitlines()
    return text[0][:300] if text else ""


def _missing_bucket(e: BaseException) -> str | None:
    """The bucket's name ("" if not given) when ``e`` says the bucket does not exist, else None.

    A GET/LIST/DELETE on a missing bucket comes back as 404 like a missing object, and
    obstore raises ``NotFoundError`` for it: it must not read as "no such object" (an
    empty listing, an absent ref) when the root itself is wrong.
    """
    text = str(e)
    if not _NO_SUCH_BUCKET.search(text):
        return None
    name = re.search(r"<BucketName>([^<]*)</BucketName>", text)
    return name.group(1) if name else ""


def _missing_object(e: BaseException) -> bool:
    return isinstance(e, (NotFoundError, FileNotFoundError)) and _missing_bucket(e) is None


def _refuse_emulator_with_endpoint(root: str, options: dict[str, Any]) -> None:
    """object_store's Azure emulator mode sends every request to ``$AZURITE_BLOB_STORAGE_URL``
    (default 127.0.0.1:10000) whatever the endpoint says: refuse the pair rather than talk
    to another server than the one named."""
    given = {k.lower(): v for k, v in options.items()}
    env = os.environ
    emulator = next(
        (given[k] for k in ("azure_storage_use_emulator", "use_emulator") if k in given),
        env.get("AZURE_STORAGE_USE_EMULATOR", ""),
    )
    endpoint = any(k in given for k in ("azure_storage_endpoint", "azure_endpoint", "endpoint"))
    if _as_bool(emulator) and (endpoint or env.get("AZURE_STORAGE_ENDPOINT")):
        raise StorageError(
            f"cannot open {root!r}: azure_storage_use_emulator ignores azure_storage_endpoint "
            "(every request would go to $AZURITE_BLOB_STORAGE_URL or 127.0.0.1:10000); give "
            "the endpoint (http://HOST:PORT/ACCOUNT) with allow_http, without use_emulator"
        )


def _require_s3_credentials(root: str, options: dict[str, Any]) -> None:
    keys = {k.lower() for k in options}
    if _as_bool(options.get("skip_signature", options.get("aws_skip_signature", False))):
        return
    if {"aws_access_key_id", "aws_secret_access_key"} <= keys or {
        "access_key_id",
        "secret_access_key",
    } <= keys:
        return
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return
    if any(
        env.get(v)
        for v in (
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    ):
        return
    raise CredentialsError(
        f"no credentials for {root!r}: pass storage_options={{'aws_access_key_id': ..., "
        "'aws_secret_access_key': ...} or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
        "(or skip_signature='true' for a public bucket)"
    )

"""Object-store failures as treadle errors naming the object (never a credential)."""

from __future__ import annotations

import re
from urllib.parse import urlparse

from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

from treadle.errors import CorruptData, CredentialsError, NotFound, StorageError


class ShortObject(CorruptData):
    """An object shorter than the bytes a read asked of it (cut short, or replaced, after
    it was written): ``key`` and ``size`` let the reader name what it was reading."""

    def __init__(self, message: str, key: str, size: int):
        super().__init__(message)
        self.key, self.size = key, size


class ChangedObject(CorruptData):
    """An object replaced in the store while it was read in several requests (its ETag
    changed): ``key``, the version a read first saw (``first``) and the one there now
    (``now``, None if unknown). Bytes of both would mix, so none are returned."""

    def __init__(self, message: str, key: str, first: str, now: str | None):
        super().__init__(message)
        self.key, self.first, self.now = key, first, now


class RetriesSpent(Exception):
    """A transient failure that lasted through every retry: the last error ``cause``,
    ``tries`` made and ``seconds`` spent (named in the error the user sees)."""

    def __init__(self, cause: BaseException, tries: int, seconds: float):
        super().__init__(str(cause))
        self.cause, self.tries, self.seconds = cause, tries, seconds


def store_error(url: str, op: str, key: str, e: Exception, advice: str = "",
                place: str | None = None) -> Exception:  # fmt: skip
    """The error for ``op`` (read, write, list, ...) of ``key`` under root ``url`` failing;
    ``advice`` (:meth:`Store.denied_advice`) ends a refusal's message; ``place`` (the root
    with its endpoint or account) names the store that did not answer, if none did."""
    where = f"{url}/{key}"
    tries = ""
    waited = None
    if isinstance(e, RetriesSpent):
        tries = f" ({e.tries} {'try' if e.tries == 1 else 'tries'} in {e.seconds:.0f} s)"
        waited = e.seconds
        e = e.cause if isinstance(e.cause, Exception) else e
    if no_answer(e):
        return StorageError(
            f"{op} {where} failed{tries}: the store {place or url} did not answer in "
            f"{waited if waited is not None else obstore_elapsed(e):.0f} s ({TIMEOUT_SETTINGS})"
            f": {type(e).__name__}: {first_line(e)}"
        )
    bucket = missing_bucket(e)
    if bucket is not None:
        return StorageError(
            f"{op} {where} failed: bucket {bucket or urlparse(url).netloc!r} does not "
            "exist (check the root URL and the endpoint)"
        )
    if missing_object(e):
        return NotFound(f"no object {where}")
    text = str(e)
    denied = "403 Forbidden" in text or "401 Unauthorized" in text or "AccessDenied" in text
    if isinstance(e, (UnauthenticatedError, PermissionDeniedError)) or denied:
        return CredentialsError(
            f"{op} {where} refused: access denied ({advice or CHECK_CREDENTIALS})"
        )
    return StorageError(f"{op} {where} failed{tries}: {type(e).__name__}: {first_line(e)}")


TIMEOUT_SETTINGS = (
    "storage options 'timeout': how long a request waits, default 30s; 'retry_timeout': "
    "how long a call retries, default 60s; or AWS_/AZURE_/GOOGLE_ variables: AWS_TIMEOUT, "
    "AWS_RETRY_TIMEOUT, ..."
)
_NO_ANSWER = ("timedout", "timed out", "kind: timeout", "deadline has elapsed")
_ELAPSED = re.compile(r"\bin ([0-9.]+)(ns|µs|us|ms|s)\b")
_UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def no_answer(e: BaseException) -> bool:
    """Whether ``e`` says a request timed out: the store (or something on the way) did not
    answer, or not in time (object_store's and Lance's text: ``kind: Timeout``, ``TimedOut``)."""
    text = str(e).lower()
    return any(h in text for h in _NO_ANSWER)


def obstore_elapsed(e: BaseException) -> float:
    """The seconds object_store says a failed call took through its retries (``Error
    performing GET ... in 61.2s, after 1 retries``), 0 where it does not say."""
    m = _ELAPSED.search(str(e))
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0


CHECK_CREDENTIALS = (
    "check credentials in storage_options (--storage-option on the command line) or the "
    "AWS_*/GOOGLE_*/AZURE_* environment"
)
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


def first_line(e: BaseException) -> str:
    """The first line of an error's text (at most 300 characters), an S3 XML error body
    shown as ``Code: Message``."""
    text = _XML_ERROR.sub(_xml_summary, str(e)).strip().splitlines()
    return text[0][:300] if text else ""


def missing_bucket(e: BaseException) -> str | None:
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


def missing_object(e: BaseException) -> bool:
    """Whether ``e`` says the object is missing (not the bucket)."""
    return isinstance(e, (NotFoundError, FileNotFoundError)) and missing_bucket(e) is None

"""Retries of transient object-store failures, bounded in count and time."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from treadle.storage.store_errors import RetriesSpent

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


def spent(e: Exception, attempt: int, start: float) -> Exception:
    """The error to raise once attempt ``attempt`` (from 0) failed for good: a transient
    failure's :class:`RetriesSpent` (its tries and time named to the user), else ``e``."""
    if not _transient(e):
        return e
    return RetriesSpent(e, attempt + 1, time.monotonic() - start)


def _with_retries(fn: Callable[[], _T]) -> _T:
    start = time.monotonic()
    for attempt in range(_RETRY_ATTEMPTS):
        try:
            return fn()
        except Exception as e:
            last = attempt == _RETRY_ATTEMPTS - 1 or time.monotonic() >= start + _RETRY_BUDGET_S
            if not _transient(e):
                raise
            if last:
                raise spent(e, attempt, start) from e
        time.sleep(_backoff(attempt))
    raise AssertionError("unreachable")

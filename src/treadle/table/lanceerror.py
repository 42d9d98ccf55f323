"""Lance failures as treadle errors naming the table (the mapping every Lance call uses).

It sits with the pinned reads (the lowest layer that calls Lance); the catalog's
per-project Lance handle (:mod:`treadle.catalog.lance`) adds what only it knows: an
expired commit, a project that does not exist, a damaged version gc stops on.
"""

from __future__ import annotations

from treadle.errors import CredentialsError, NotFound, StorageError, TreadleError
from treadle.storage.store_errors import (
    CHECK_CREDENTIALS,
    TIMEOUT_SETTINGS,
    first_line,
    missing_bucket,
    no_answer,
    obstore_elapsed,
)


def lance_error(e: BaseException, where: str, advice: str = "",
                place: str | None = None) -> TreadleError:  # fmt: skip
    """A Lance read/write failure as a treadle error naming ``where`` (table, version, ...).

    Lance raises ``OSError``/``ValueError``/``pyarrow.ArrowInvalid`` whose text carries
    object_store's cause; this maps "lacked the necessary privileges" to
    :class:`CredentialsError`, a missing object to :class:`NotFound`, anything else to
    :class:`StorageError`, keeping the first line of Lance's text (no credentials: Lance
    never puts them in its messages; the endpoint URL may appear). ``advice``
    (:func:`treadle.storage.credsource.advice`) names the setting the credentials came from;
    ``place`` (:attr:`Store.place`: root, endpoint or account) the store that, if it timed
    out, did not answer.
    """
    text = first_line(e) if isinstance(e, Exception) else str(e)
    low = text.lower()
    bucket = missing_bucket(e)
    if bucket is not None:
        return StorageError(
            f"{where}: bucket {bucket or '(of the root)'!r} does not exist (check the root URL "
            f"and the endpoint): {text}"
        )
    if "necessary privileges" in low or "403 forbidden" in low or "accessdenied" in low:
        return CredentialsError(f"{where}: access denied ({advice or CHECK_CREDENTIALS}): {text}")
    if "not found" in low or "does not exist" in low or "nosuchkey" in low:
        return NotFound(f"{where}: {text}")
    # Lance keeps object_store's text but not its cause's kind: a stall reads as a request
    # not sent, after retries (object_store retries timeouts and connection failures alike)
    if no_answer(e) or ("error sending request" in str(e) and obstore_elapsed(e) > 0):
        return StorageError(
            f"{where}: the store {place or '(the root)'} did not answer (Lance's last "
            f"request waited {obstore_elapsed(e):.0f} s through its retries, after Lance's "
            f"own tries; {TIMEOUT_SETTINGS}): {type(e).__name__}: {text}"
        )
    return StorageError(f"{where}: {type(e).__name__}: {text}")

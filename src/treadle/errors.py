"""Exceptions raised by treadle. Every error names the thing it is about."""

from __future__ import annotations


class TreadleError(Exception):
    """Base class of every error treadle raises on purpose."""


class InvalidName(TreadleError, ValueError):
    """A project, branch or table name that is empty, too long or could escape its root."""


class NotFound(TreadleError, KeyError):
    """An unknown project, branch, table, commit or object."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else "not found"


class ExpiredCommit(NotFound):
    """Reading a commit whose table versions ``gc --keep-days`` expired (retention)."""


class Purged(TreadleError):
    """Reading an episode that ``project.purge`` removed from history (a pinned run
    record, a tag or ``table.at(...)`` that reaches it). It names the episode, the
    purge's commit and its reason: ``.episode``, ``.table``, ``.commit``, ``.reason``."""

    def __init__(self, message: str, *, episode: str = "", table: str = "",
                 commit: str = "", reason: str = ""):  # fmt: skip
        super().__init__(message)
        self.episode, self.table, self.commit, self.reason = episode, table, commit, reason


class AlreadyExists(TreadleError):
    """Creating something (a branch, a project) that already exists."""


class CommitConflict(TreadleError):
    """A commit lost a race against another writer that changed the same table."""


class MergeConflict(TreadleError):
    """A merge whose sides changed the same table in ways that do not combine (it names
    the table and what each side did), or with several most recent common ancestors."""


class SchemaMismatch(TreadleError, ValueError):
    """Appended rows whose columns or types do not match the table."""


class StorageError(TreadleError):
    """The object store or disk failed (after retries) or refused access."""


class CredentialsError(StorageError):
    """Credentials are missing or were refused by the object store."""


class ForkError(TreadleError):
    """A read in a process forked (``os.fork()``) after its parent had read from a store:
    the object-store runtime's threads are not in the child, so the read would hang."""


class CorruptData(TreadleError):
    """Stored bytes failed their checksum or could not be decoded."""


class VideoError(TreadleError, ValueError):
    """Video input that cannot be encoded, remuxed or decoded."""


class PlanError(TreadleError, ValueError):
    """A recipe, run record or loader state that cannot be planned."""


class UnsafeInput(TreadleError, ValueError):
    """Source data that would need unpickling (``.pyd``/``.pth`` members, MDS ``pkl``).

    Refused unless the caller passes ``allow_pickle=True``. Also source data past an
    importer's size cap (a possible decompression bomb: ``max_shard_bytes``,
    ``max_member_bytes``), refused unless the cap is raised.
    """


class UnsupportedFormat(TreadleError, ValueError):
    """A source in a format version or encoding the importer does not know."""


class MissingDependency(TreadleError, ImportError):
    """An optional dependency a feature needs is not installed (the message says how)."""


class PlanWarning(UserWarning):
    """A plan that is not exactly what was asked (a share planned off its asked value)."""

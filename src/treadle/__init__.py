"""treadle: feed model training from versioned tables.

Name tables, a weight for each, windows of frames or rows, and a seed; treadle
pins every table to a version, plans every batch before the first step, and
streams device batches, in the same order on one GPU or many, with exact resume.
"""

from treadle.errors import (
    AlreadyExists,
    CommitConflict,
    CorruptData,
    CredentialsError,
    InvalidName,
    NotFound,
    PlanError,
    SchemaMismatch,
    StorageError,
    TreadleError,
    VideoError,
)
from treadle.plan.windows import Rows, Video, Windows

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "CommitConflict",
    "CorruptData",
    "CredentialsError",
    "InvalidName",
    "NotFound",
    "PlanError",
    "Rows",
    "SchemaMismatch",
    "StorageError",
    "TreadleError",
    "Video",
    "VideoError",
    "Windows",
    "__version__",
]

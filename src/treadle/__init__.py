"""treadle: feed model training from versioned tables.

Name tables, a weight for each, windows of frames or rows, and a seed; treadle
pins every table to a version, plans every batch before the first step, and
streams device batches, in the same order on one GPU or many, with exact resume.
"""

import os as _os

_os.environ.setdefault("LANCE_LOG", "error")  # Lance's Rust WARN lines are noise to users

from treadle.workers import nopandas as _nopandas  # noqa: E402

if _nopandas.in_worker_server():  # before Lance: pyarrow.dataset would import pandas (issue 33)
    _nopandas.import_arrow_without_pandas()

from treadle.catalog import Branch, Client, Commit, Project, TableRef, Transaction  # noqa: E402
from treadle.catalog.diff import Diff, TableDiff  # noqa: E402
from treadle.errors import (  # noqa: E402
    AlreadyExists,
    CommitConflict,
    CorruptData,
    CredentialsError,
    ExpiredCommit,
    ForkError,
    InvalidName,
    MergeConflict,
    MissingDependency,
    NotFound,
    PlanError,
    PlanWarning,
    Purged,
    SchemaMismatch,
    StorageError,
    TreadleError,
    UnsafeInput,
    UnsupportedFormat,
    VideoError,
)
from treadle.info import info  # noqa: E402
from treadle.plan.plan import Batch, Plan  # noqa: E402
from treadle.plan.recipe import Component, Recipe  # noqa: E402
from treadle.plan.record import RunRecord  # noqa: E402
from treadle.plan.shuffle import BlockShuffle  # noqa: E402
from treadle.plan.stages import Ramp, Schedule  # noqa: E402
from treadle.plan.windows import Rows, Video, Windows  # noqa: E402
from treadle.stats.column_stats import ColumnStats  # noqa: E402
from treadle.table import EpisodeIndex, ScanRequest, Table  # noqa: E402
from treadle.table.splits import split_episodes  # noqa: E402
from treadle.video import VideoFile, VideoFrames  # noqa: E402

#: The torch adapters, imported (with torch) on first use: ``import treadle`` in a worker
#: process or a data-only script does not pay for torch.
_TORCH_NAMES = ("CheckpointRow", "Checkpoints", "EvalLoader", "ScanDataset", "TrainLoader")


def _version() -> str:
    """One version string: pyproject.toml's, through the installed package's metadata, read
    on first use (importing ``importlib.metadata`` costs ~40 ms, and the worker processes'
    server, which imports treadle, never asks)."""
    from importlib import metadata

    try:
        version = metadata.version("treadle")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version


def __getattr__(name: str) -> object:
    if name == "__version__":
        return _version()
    if name in ("importers", "RayExecutor"):  # imported on first use: the workers' server,
        import treadle.importers  # which imports treadle, never needs them (~0.1 s)
        from treadle.importers.ray_executor import RayExecutor

        return treadle.importers if name == "importers" else RayExecutor
    if name == "preload_workers":  # the torch layer's (importing it imports torch)
        from treadle.workers.processes import preload_workers

        return preload_workers
    if name in _TORCH_NAMES or name == "torch":
        import treadle.torch

        return treadle.torch if name == "torch" else getattr(treadle.torch, name)
    raise AttributeError(f"module 'treadle' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AlreadyExists",
    "Batch",
    "BlockShuffle",
    "CheckpointRow",
    "Checkpoints",
    "ColumnStats",
    "Component",
    "EvalLoader",
    "Plan",
    "Recipe",
    "RayExecutor",
    "Ramp",
    "RunRecord",
    "Schedule",
    "ScanDataset",
    "TrainLoader",
    "VideoFile",
    "VideoFrames",
    "Branch",
    "Client",
    "Commit",
    "EpisodeIndex",
    "Project",
    "ScanRequest",
    "Table",
    "TableRef",
    "Transaction",
    "CommitConflict",
    "CorruptData",
    "CredentialsError",
    "ExpiredCommit",
    "ForkError",
    "InvalidName",
    "MergeConflict",
    "MissingDependency",
    "Diff",
    "TableDiff",
    "NotFound",
    "PlanError",
    "PlanWarning",
    "Purged",
    "Rows",
    "SchemaMismatch",
    "StorageError",
    "TreadleError",
    "UnsafeInput",
    "UnsupportedFormat",
    "Video",
    "VideoError",
    "Windows",
    "split_episodes",
    "importers",
    "preload_workers",
    "info",
    "__version__",
]

"""The import driver: the options every importer shares, the import id, one transaction.

Resumability (the choice every importer shares)
-----------------------------------------------
An import is **one transaction** (:meth:`Branch.transaction`). Rows are staged as
Lance data files that no version references (the transaction flushes every ~64 MB, so
memory stays bounded), and the branch moves once, by compare-and-swap, at the very
end. A crash at any point before that leaves the branch exactly where it was (the
orphaned files are removed by ``treadle gc``); re-running the same command starts
over and cannot duplicate rows, because nothing of the first attempt was ever
visible.

Each import also has a deterministic **import id**: a hash of the format, the
destination table, the options, and the source: each file's URL/path and the
identity of its content (:meth:`~treadle.importers.sources.Source.identity`: the object store's ETag; for a
local file a SHA-256 of its bytes up to :data:`HASH_BELOW` bytes, else its size and
modification time in nanoseconds). It is written into the commit message
(``import-id=<id>``). Before doing any work, a re-run looks for that id in the
branch's log and, if the commit is there (the crash came after the commit but before
the process noticed), returns that commit instead of importing again. So "run it
again until it succeeds" is always safe, while the same files into another table, or
a corrected file (even one of the same size), import again.

Partial reuse of the data files staged by a crashed attempt was rejected: it would
need a second, non-atomic manifest next to the catalog, and re-reading a source is
cheap next to the risk of committing half-written fragments.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from treadle.errors import NotFound, TreadleError
from treadle.importers.arrow import DEFAULT_CHUNK_ROWS, check_json_as
from treadle.importers.images import check_images
from treadle.importers.import_progress import Progress
from treadle.names import check_name
from treadle.read.prefetch import prefetch

if TYPE_CHECKING:
    from treadle.catalog.client import Project

IMPORT_ID_RE = re.compile(r"import-id=([0-9a-f]{16})")


@dataclass(frozen=True)
class ImportOptions:
    """The options the importers share, built once from an importer's keyword arguments.

    Each importer's own options (``max_shard_bytes``, ``split``, ``tolerance_s``...) stay
    its arguments. Credentials (``storage_options``, ``source_options``) and the client
    are never shown by ``repr``.
    """

    branch: str | None = None
    images: str = "encoded"
    allow_pickle: bool = False
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    source_options: dict[str, Any] | None = field(default=None, repr=False)
    client: Any = field(default=None, repr=False)
    root: str | None = None
    progress: bool | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    rename: dict[str, str] | None = None
    json_as: str = "typed"
    executor: Any = None  # an importers.executor.Executor (which imports Progress from here)

    def __post_init__(self) -> None:
        check_images(self.images)
        check_json_as(self.json_as)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> ImportOptions:
        """The options among an importer's ``arguments`` (its ``locals()`` on entry); those
        it does not take keep their defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in arguments.items() if k in names})

    def for_sources(self) -> ImportOptions:
        """These options without the client, the executor and the credentials: what a
        ``write`` closure keeps (a Ray executor ships the closure to its tasks)."""
        return replace(self, storage_options=None, source_options=None, client=None, executor=None)

    def id_options(self, *names: str, **extra: Any) -> dict[str, Any]:
        """The options named (and ``extra``) as the import id records them."""
        return {**{n: getattr(self, n) for n in names}, **extra}

    def open_branch(self, project: Project) -> Any:
        """The branch to import into: see :func:`resolve_branch`."""
        return resolve_branch(project, self.branch, self.client, self.root, self.storage_options)


@dataclass
class ImportResult:
    """What an import did: the commit (None when the source was empty), rows, bytes, seconds.

    ``videos`` (LeRobot imports): per episode and video column, ``{"episode", "column",
    "video": "copied" | "re-encoded", "why"}``, in import order; None where the importer
    does not report it (other formats, an executor's remote tasks, a skipped re-run).
    ``cameras`` (RLDS, HDF5, Zarr, ROS imports): per camera column, what it was stored as, its bytes before
    and after, and with ``images="video"`` the PSNR (mean and minimum over frames) of the
    stored video against the source images' decode (:mod:`treadle.importers.camera_video`).
    ``topics`` (ROS imports): per bag and topic, its messages, mean rate, largest gap and
    how many messages the clock used once, more than once, never.
    """

    commit: Any
    table: str
    rows: int
    episodes: int
    bytes_read: int
    seconds: float
    import_id: str
    skipped: bool = False
    videos: list[dict[str, str]] | None = None
    cameras: list[dict[str, Any]] | None = None
    topics: list[dict[str, Any]] | None = None


def import_id(
    fmt: str, sources: Sequence[str], identities: Sequence[Any], options: dict[str, Any]
) -> str:
    """The deterministic id of an import's source: format, files, their content, options.

    ``identities`` name each file's content (:func:`~treadle.importers.sources.identities`). :func:`run_import`
    adds the destination table to this id before it records or looks it up.
    """
    blob = json.dumps(
        {
            "format": fmt,
            "sources": list(sources),
            "identities": list(identities),
            "options": options,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def table_import_id(iid: str, table: str) -> str:
    """The id recorded for source id ``iid`` imported into ``table``."""
    return hashlib.sha256(json.dumps([iid, table]).encode()).hexdigest()[:16]


def find_import(branch: Any, iid: str, limit: int = 200) -> Any:
    """The commit of ``branch`` (within ``limit`` commits) that recorded import ``iid``."""
    try:
        log = branch.log(limit=limit)
    except TreadleError:
        return None
    for c in log:
        m = IMPORT_ID_RE.search(c.message or "")
        if m and m.group(1) == iid:
            return c
    return None


def resolve_branch(
    project: Project,
    branch: str | None,
    client: Any = None,
    root: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """A :class:`Branch` from a project name or object (created if missing)."""
    if isinstance(project, str):
        if client is None:
            from treadle.catalog import Client

            client = Client(root, storage_options)
        project = client.project(project)
    name = branch or "main"
    try:
        return project.branch(name)
    except NotFound:
        if name == "main":
            raise
        return project.create_branch(name)


def append_tables(tw: Any, bar: Progress, tables: Iterable[pa.Table]) -> int:
    """Append ``tables`` (read ahead on a background thread) to ``tw``; the rows appended."""
    rows = 0
    for t in prefetch(tables):
        tw.append(t)
        rows += t.num_rows
        bar.update(t.num_rows)
    return rows


def run_import(
    opts: ImportOptions,
    branch: Any,
    table: str,
    *,
    fmt: str,
    iid: str,
    what: str,
    write: Callable[..., tuple[int, int, int]],
    total: int | None,
    unit: str,
    sources: Sequence[str] = (),
) -> ImportResult:
    """Run ``write(table_writer, bar) -> (rows, episodes, bytes)`` in one transaction.

    ``iid`` is the source's :func:`import_id`; the id recorded (and returned) also covers
    ``table``. Skips the work (and returns the earlier commit) when ``branch`` already
    has a commit recording that id. On any exception nothing is committed. With
    ``opts.executor`` (:mod:`treadle.importers.executor`), it stages the ``sources``
    instead (``write(tw, bar, only=[i, ...])`` for each) into this same transaction.
    """
    check_name(table, "table")
    iid = table_import_id(iid, table)
    done = find_import(branch, iid)
    if done is not None:
        return ImportResult(done, table, 0, 0, 0, 0.0, iid, skipped=True)
    t0 = time.perf_counter()
    executor = opts.executor
    if executor is not None:
        total, unit = len(sources), "source"
    bar = Progress(total, f"import {fmt}", unit, opts.progress)
    ok = False
    try:
        message = f"import {fmt} {what} into {table} (import-id={iid})"
        with branch.transaction(message) as tx:
            if executor is None:
                rows, episodes, nbytes = write(tx.table(table), bar)
            else:
                rows, episodes, nbytes = executor.write(tx.table(table), write, sources, bar)
        ok = True
    finally:
        bar.close(ok)
    return ImportResult(tx.commit, table, rows, episodes, nbytes, time.perf_counter() - t0, iid)

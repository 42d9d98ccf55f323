"""What the robot-data importers (HDF5, Zarr, ROS 2) share: their files, one episode at a time.

A format's importer finds its source files (:func:`source_files`), reads what it keeps as
table metadata, and gives :func:`import_episodes` a function that yields one episode at a
time (``name, columns, rows, bytes read``) for the files it is asked for. This module
turns that into one import (:func:`~treadle.importers.run.run_import`): one commit, the
import id, progress in bytes, the cameras' report (``ImportResult.cameras``: bytes and PSNR),
one Ray task per file with an executor, and the source's metadata and episode sets kept
beside the committed version (``table.metadata``, ``table.episode_sets()``).

Readers such as h5py and SQLite need a seekable local file: an object-store file is
copied, in 8 MiB pieces, into a temporary folder that lives as long as the import
(:class:`LocalCopies`), so memory stays bounded whatever the file's size.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.errors import InvalidName, NotFound
from treadle.importers.cameras import Reports
from treadle.importers.run import ImportOptions, ImportResult, Progress, import_id, run_import
from treadle.importers.sources import Source, SourceFile, identities, split_url

if TYPE_CHECKING:
    from treadle.catalog.client import Project

log = logging.getLogger("treadle")

#: bytes a moment costs besides its values (the episode and frame columns, offsets): the
#: HDF5 and Zarr importers count it against ``max_episode_bytes``, so a source of many
#: empty moments is bounded too
ROW_BYTES = 32
#: (episode name, columns for append_episode, rows, bytes read)
Episode = tuple[str, dict[str, Any], int, int]
#: episodes(unit indices, local copies, camera report) -> episodes in order; a unit is a
#: file (HDF5, ROS 2) or an episode (Zarr)
EpisodesFn = Callable[[Sequence[int], "LocalCopies", Reports | None], Iterator[Episode]]


def source_files(
    src: str, storage_options: dict[str, Any] | None, suffixes: tuple[str, ...], what: str
) -> tuple[Source, list[str], bool]:
    """``(source, file names, is a folder)``: ``src`` itself when it ends with one of
    ``suffixes``, else every such file under the folder ``src``, in name order."""
    src = str(src).rstrip("/")
    if src.lower().endswith(suffixes):
        root, name = split_url(src)
        source = Source(root, storage_options)
        if not source.exists(name):
            raise NotFound(f"no {what} file {source.describe(name)}")
        return source, [name], False
    source = Source(src, storage_options)
    names = [n for n in source.list() if n.lower().endswith(suffixes)]
    if not names:
        raise NotFound(f"no {what} files ({', '.join(suffixes)}) in {source.describe()}")
    return source, names, True


class LocalCopies:
    """Local paths of source files: the file itself on local disk, else a temporary copy
    (made once, removed by :meth:`close`)."""

    def __init__(self, source: Source):
        self.source = source
        self._dir: str | None = None
        self._copies: dict[str, str] = {}

    def path(self, name: str) -> str:
        if not self.source.url:
            return str(self.source.local_path(name))
        if name not in self._copies:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="treadle-import-")
            dst = Path(self._dir) / str(len(self._copies))
            with self.source.open(name) as r, open(dst, "wb") as w:
                shutil.copyfileobj(r, w, 8 << 20)
            self._copies[name] = str(dst)
        return self._copies[name]

    def tree(self, names: Sequence[str]) -> str:
        """A local folder holding ``names`` (a Zarr store's files) at their relative paths:
        the source's own folder on local disk, else a temporary copy of each."""
        if not self.source.url:
            root = self.source.root
            return str(
                Path(root[7:] if root.startswith("file://") else root).expanduser().resolve()
            )
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="treadle-import-")
        base = Path(self._dir) / "tree"
        for name in names:
            if name.startswith("/") or ".." in name.split("/"):
                raise InvalidName(f"path {name!r} escapes the source root {self.source.root!r}")
            dst = base / name
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                with self.source.open(name) as r, open(dst, "wb") as w:
                    shutil.copyfileobj(r, w, 8 << 20)
        return str(base)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir, self._copies = None, {}

    def __enter__(self) -> LocalCopies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class SourceMeta:
    """What the source says of the whole dataset: kept beside the committed version."""

    metadata: dict[str, Any]
    episode_sets: dict[str, list[str]]
    fmt: str


def import_episodes(
    opts: ImportOptions,
    project: Project,
    table: str,
    *,
    fmt: str,
    source: Source,
    names: Sequence[str],
    episodes: EpisodesFn,
    options: dict[str, Any],
    fps: float | None,
    images: str,
    meta: SourceMeta | None = None,
    copies: LocalCopies | None = None,
    units: Sequence[str] | None = None,
    column_metadata: dict[str, dict[str, Any]] | None = None,  # for the columns it names
) -> ImportResult:
    """Import every episode ``episodes`` yields as one commit (see module doc). ``names``
    are the source's files (the import id covers their content); ``units`` name what
    ``episodes`` takes by index (default: the files), one executor task each."""
    sources = [source.describe(n) for n in names] if units is None else list(units)
    ids = _identities(source, names, fmt)
    total = sum(i[0] for i in ids if i)
    report = Reports(images) if opts.executor is None else None
    br = opts.open_branch(project)
    own = copies is None
    copies = copies or LocalCopies(source)

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        rows = eps = nbytes = 0
        files = range(len(sources)) if only is None else only
        local = copies if only is None else LocalCopies(source)
        try:
            for name, cols, n, read in episodes(files, local, report):
                given = {c: m for c, m in (column_metadata or {}).items() if c in cols}
                tw.append_episode(cols, episode=name, fps=fps, column_metadata=given)
                rows, eps, nbytes = rows + n, eps + 1, nbytes + read
                bar.update(read)
        finally:
            if local is not copies:
                local.close()
        return rows, eps, nbytes

    try:
        result = run_import(
            opts,
            br,
            table,
            fmt=fmt,
            iid=import_id(fmt, [source.describe(n) for n in names], ids, options),
            what=_what(source, names),
            write=write,
            total=total,
            unit="B",
            sources=sources,
        )
    finally:
        if own:
            copies.close()
    return _finish(result, br, table, fmt, meta, report)


def _identities(source: Source, names: Sequence[str], fmt: str) -> list[Any]:
    ids = identities([SourceFile(source, n) for n in names])
    for n, i in zip(names, ids):
        if i is None:
            raise NotFound(f"{fmt} file {source.describe(n)} is gone")
    return ids


def _what(source: Source, names: Sequence[str]) -> str:
    """The source as the commit message names it."""
    return (
        source.describe(names[0])
        if len(names) == 1
        else f"{source.describe()} ({len(names)} files)"
    )


def _finish(
    result: ImportResult,
    br: Any,
    table: str,
    fmt: str,
    meta: SourceMeta | None,
    report: Reports | None,
) -> ImportResult:
    """Keep the source's metadata beside the commit; add the cameras' report."""
    if meta and (meta.metadata or meta.episode_sets) and result.commit is not None:
        from treadle.table.source_meta import put_source_meta

        pinned = br.table(table).at(result.commit.id)
        put_source_meta(pinned, meta.metadata, meta.episode_sets, meta.fmt)
    if report is not None and not result.skipped:
        for row in report.rows():
            if row["psnr_mean_db"] is not None:
                log.info("import %s: camera %r as H.264, PSNR mean %.2f dB, min %.2f dB",
                         fmt, row["column"], row["psnr_mean_db"], row["psnr_min_db"])  # fmt: skip
        result = replace(result, cameras=report.rows() or None, topics=report.topics or None)
    return result

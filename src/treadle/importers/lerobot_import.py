"""Import a LeRobot dataset (codebase v3.0, and v2.1/v2.0) as a time-indexed table.

Layouts read (from LeRobot's ``datasets/utils.py``):

- **v3.0** — ``meta/info.json`` (``codebase_version``, ``fps``, ``features``,
  ``data_path``, ``video_path``); ``meta/episodes/chunk-*/file-*.parquet`` (one row per
  episode: ``episode_index``, ``length``, ``data/chunk_index``, ``data/file_index``,
  ``videos/<key>/chunk_index|file_index|from_timestamp|to_timestamp``);
  ``meta/tasks.parquet``; ``data/chunk-*/file-*.parquet`` holding the frames of many
  episodes; ``videos/<key>/chunk-*/file-*.mp4`` holding many episodes one after the
  other (an episode is the span ``[from_timestamp, to_timestamp)`` of its file).
- **v2.1** — ``meta/episodes.jsonl``, ``meta/tasks.jsonl``,
  ``data/chunk-XXX/episode_XXXXXX.parquet`` and
  ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4`` (one file per episode and camera).

Each episode becomes one ``append_episode`` (rows ``episode``, ``frame``, then every
feature; a ``task`` string column when the dataset has tasks; dots in names become
``_`` because Lance refuses them). Each camera (``dtype: video``) becomes a video column:

- v2.1: the episode's file goes in whole as ``td.VideoFile`` (H.264 is remuxed without
  re-encoding; other codecs, such as LeRobot's default AV1, are re-encoded by the video
  layer).
- v3.0, H.264: LeRobot concatenates episode files without re-encoding, so an episode
  starts on a keyframe; its packets (by timestamp, ``[from_timestamp, to_timestamp)``)
  are copied into a small MP4 and passed as ``td.VideoFile`` (bit-exact, no decode),
  when they decode to the source's frames on their own (checked; see
  :func:`treadle.video.span.cut_span`: a file encoded in one piece with B-frames has
  spans whose last frames reference the next episode's).
- v3.0, other codecs, or an episode whose packets do not stand alone: the span's frames
  are decoded (PyAV) and passed as ``td.VideoFrames`` (re-encoded to H.264, lossy).

Checks, each a clear error naming the episode: ``meta/`` is checked field by field
(:mod:`treadle.importers.lerobot_meta`); ``timestamp`` must equal ``frame_index / fps``
within ``tolerance_s``; each camera must have exactly one frame per row, at
``from_timestamp + timestamp`` (within ``tolerance_s`` or half a frame, whichever is
larger); every ``task_index`` must name a task.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from treadle.errors import CorruptData, NotFound, SchemaMismatch, UnsafeInput
from treadle.importers.arrow import check_rename, column_name
from treadle.importers.executor import Executor, pick
from treadle.importers.images import decode_image
from treadle.importers.lerobot_meta import (
    MAX_META_BYTES,
    Episode,
    LeRobotMeta,
    read_meta,
    rows_per_file,
    values_per_row,
)
from treadle.importers.lerobot_report import VideoCodecs
from treadle.importers.lerobot_stats import STATS_SOURCE, read_source_stats
from treadle.importers.parquet_bounded import check_footer
from treadle.importers.parquet_pages import MAX_PAGE_BYTES, check_pages
from treadle.importers.run import ImportOptions, ImportResult, Progress, import_id, run_import
from treadle.importers.sources import Source, SourceFile, identities
from treadle.plan.component import lerobot_episode
from treadle.read.prefetch import default_threads, ordered_map, prefetch
from treadle.video.span import span_value

if TYPE_CHECKING:
    from treadle.catalog.client import Project
    from treadle.table.table import Table

__all__ = [
    "Episode",
    "LeRobotMeta",
    "check_timestamps",
    "import_lerobot",
    "iter_episodes",
    "read_meta",
]


# -- frames -------------------------------------------------------------------------------


class _DataFiles:
    """The data parquet file of the current episode(s); one file in memory at a time."""

    def __init__(self, source: Source, meta: LeRobotMeta, file_rows: dict[str, int]):
        self.source, self.meta, self.file_rows = source, meta, file_rows
        self.name: str | None = None
        self.table: pa.Table | None = None
        self.episodes: np.ndarray | None = None

    def rows(self, ep: Episode) -> pa.Table:
        if self.name != ep.data_file:
            try:
                raw = self.source.read(ep.data_file)
            except NotFound:
                raise NotFound(
                    f"episode {ep.index}: data file {self.source.describe(ep.data_file)} is missing"
                ) from None
            where = f"episode {ep.index}: data file {self.source.describe(ep.data_file)}"
            try:
                rows = self.file_rows[ep.data_file]
                check_footer(pa.BufferReader(raw), where, rows, values_per_row(self.meta))
                check_pages(pa.BufferReader(raw), where, MAX_PAGE_BYTES)
                table = pq.read_table(pa.BufferReader(raw))
            except UnsafeInput:
                raise
            except (pa.ArrowException, OSError, ValueError) as e:
                raise CorruptData(f"{where} is corrupt: {e}") from None
            if "episode_index" not in table.column_names:
                raise CorruptData(f"{where} has no 'episode_index' column")
            for col, floats in _NUMERIC.items():
                if col in table.column_names:
                    _check_numeric(table[col], col, floats, where)
            self.table, self.name = table, ep.data_file
            self.episodes = table["episode_index"].to_numpy()
        assert self.table is not None and self.episodes is not None
        idx = np.flatnonzero(self.episodes == ep.index)
        t = self.table.take(pa.array(idx))
        if "frame_index" in t.column_names:
            t = t.sort_by("frame_index")
        return t


#: Data columns the importer computes with: name -> whether floats are allowed.
_NUMERIC = {"episode_index": False, "frame_index": False, "task_index": False, "timestamp": True}


def _check_numeric(col: pa.ChunkedArray, name: str, floats: bool, where: str) -> None:
    t = col.type
    ok = pa.types.is_integer(t) or (floats and pa.types.is_floating(t))
    if not ok:
        kind = "a number" if floats else "an integer"
        raise CorruptData(f"{where}: column {name!r} is {t}, not {kind}")
    if col.null_count:
        raise CorruptData(f"{where}: column {name!r} has {col.null_count} null value(s)")


def check_timestamps(ts: np.ndarray, fi: np.ndarray, fps: float, ep: int, tol: float) -> None:
    """``timestamp == frame_index / fps`` (within ``tol``), and frames ``0..T-1``."""
    bad_ts = np.flatnonzero(~np.isfinite(ts.astype(np.float64)))
    if bad_ts.size:
        raise CorruptData(f"episode {ep}: timestamp of frame {bad_ts[0]} is {ts[bad_ts[0]]}")
    if fi.size and not np.array_equal(fi, np.arange(fi.size)):
        bad = int(np.flatnonzero(fi != np.arange(fi.size))[0])
        raise CorruptData(
            f"episode {ep}: frame_index is not 0..{fi.size - 1} (row {bad} has {fi[bad]})"
        )
    drift = np.abs(ts.astype(np.float64) - np.arange(ts.size) / fps)
    if drift.size and drift.max() > tol:
        k = int(np.argmax(drift > tol))
        raise CorruptData(
            f"episode {ep}: timestamp drifts from frame_index/fps at frame {k}: "
            f"{float(ts[k]):.6f}s, expected {k / fps:.6f}s at {fps:g} fps "
            f"(drift {drift[k]:.6f}s > tolerance {tol}s)"
        )


def iter_episodes(
    source: Source,
    meta: LeRobotMeta,
    opts: ImportOptions | None = None,
    *,
    tolerance_s: float = 1e-4,
    threads: int | None = None,
    file_rows: dict[str, int] | None = None,
) -> Iterator[tuple[str, dict[str, Any], int]]:
    """``(episode name, columns for append_episode, bytes read)`` per episode, in order.

    ``file_rows``: the rows of every episode of each data file (:func:`file_rows`; by
    default those of ``meta.episodes``, which may be a part of the dataset's).

    Video decoding of upcoming episodes runs on a thread pool while earlier ones are written.
    """
    opts = opts or ImportOptions()
    files = _DataFiles(source, meta, file_rows or rows_per_file(meta))

    def build(item: tuple[Episode, pa.Table]) -> tuple[str, dict[str, Any], int]:
        return _episode(source, meta, *item, opts, tolerance_s)

    def loaded() -> Iterator[tuple[Episode, pa.Table]]:
        for ep in meta.episodes:
            yield ep, files.rows(ep)

    # An episode's decoded frames can be large (T x H x W x 3): at most `threads` in flight.
    threads = threads or min(2, default_threads())
    yield from ordered_map(build, loaded(), threads, ahead=threads, leave_running=True)


def _episode(
    source: Source, meta: LeRobotMeta, ep: Episode, t: pa.Table, opts: ImportOptions, tol: float
) -> tuple[str, dict[str, Any], int]:
    """One episode's name, columns (its rows, tasks and cameras) and bytes read."""
    if t.num_rows != ep.length:
        raise CorruptData(
            f"episode {ep.index}: {t.num_rows} rows in {source.describe(ep.data_file)}, "
            f"meta says length {ep.length}"
        )
    if t.num_rows == 0:
        raise CorruptData(f"episode {ep.index} has no rows")
    ts = _timestamps(t, meta.fps, ep.index, tol)
    where = f"LeRobot episode {ep.index}"
    cols: dict[str, Any] = {}
    for c in t.column_names:
        col = column_name(c, where, opts.rename)
        cols[col] = _column(
            t[c].combine_chunks(), meta.features.get(c), c in meta.images, opts.images, ep.index, c
        )
    if meta.tasks and "task_index" in t.column_names and "task" not in cols:
        cols["task"] = _tasks(t["task_index"].to_numpy(), meta.tasks, ep, source)
    nbytes = t.nbytes
    for cam in meta.cameras:
        col = column_name(cam, where, opts.rename)
        vname = ep.video_files[cam]
        at = f"episode {ep.index}, camera {cam!r} ({source.describe(vname)})"
        data = _video_data(source, vname, at)
        nbytes += len(data) if isinstance(data, bytes) else 0
        span = ep.spans[cam] if meta.version == "v3.0" else None
        cols[col] = span_value(data, span, ts, meta.fps, tol, at)
    return lerobot_episode(ep.index), cols, nbytes


def _timestamps(t: pa.Table, fps: float, ep: int, tol: float) -> np.ndarray:
    """The episode's ``timestamp`` column, checked (:func:`check_timestamps`), or
    ``frame / fps`` where it has none."""
    ts = t["timestamp"].to_numpy() if "timestamp" in t.column_names else None
    fi = t["frame_index"].to_numpy() if "frame_index" in t.column_names else None
    if ts is None:
        return np.arange(t.num_rows) / fps
    check_timestamps(ts, fi if fi is not None else np.arange(len(ts)), fps, ep, tol)
    return ts


def _video_data(source: Source, name: str, where: str) -> bytes | str:
    """A camera's video file: its local path, or its bytes for an object-store source."""
    try:
        data: bytes | str = str(source.local_path(name)) if not source.url else source.read(name)
        if not source.url and not source.exists(name):
            raise NotFound(name)
    except NotFound:
        raise NotFound(f"{where}: video file is missing") from None
    return data


def _tasks(index: np.ndarray, tasks: dict[int, str], ep: Episode, source: Source) -> list[str]:
    unknown = sorted(set(index.tolist()) - tasks.keys())
    if unknown:
        raise CorruptData(
            f"episode {ep.index}: task_index {unknown[0]} in {source.describe(ep.data_file)} "
            "is not in the dataset's tasks (meta/tasks.parquet or meta/tasks.jsonl)"
        )
    return [tasks[i] for i in index.tolist()]


def _column(col: pa.Array, feature: Any, is_image: bool, images: str, ep: int, name: str) -> Any:
    if isinstance(col.type, pa.ExtensionType):
        col = col.storage
    if is_image and pa.types.is_struct(col.type):
        raw = col.field("bytes")
        if images == "decoded":
            return np.stack(
                [
                    decode_image(b.as_py(), "", f"episode {ep}, {name!r}, frame {j}")
                    for j, b in enumerate(raw)
                ]
            )
        return raw.cast(pa.large_binary())
    if (
        pa.types.is_list(col.type)
        or pa.types.is_fixed_size_list(col.type)
        or pa.types.is_large_list(col.type)
    ):
        try:
            shape = tuple(int(x) for x in ((feature or {}).get("shape") or ()))
        except (TypeError, ValueError, AttributeError):
            raise CorruptData(
                f"episode {ep}: feature {name!r} has a malformed shape in meta/info.json"
            ) from None
        flat = col.flatten()
        while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
            flat = flat.flatten()
        try:
            arr = flat.to_numpy(zero_copy_only=False)
            return arr.reshape((len(col), *shape)) if shape else arr.reshape(len(col), -1)
        except (ValueError, TypeError, pa.ArrowInvalid) as e:
            raise SchemaMismatch(
                f"episode {ep}: feature {name!r} does not have shape {list(shape)}: {e}"
            ) from None
    return col


def import_lerobot(
    src: str,
    project: Project,
    table: str,
    *,
    branch: str | None = None,
    images: str = "encoded",
    tolerance_s: float = 1e-4,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    allow_pickle: bool = False,
    rename: dict[str, str] | None = None,
    executor: Executor | None = None,
    max_meta_bytes: int = MAX_META_BYTES,
) -> ImportResult:
    """Import a LeRobot v3.0 / v2.1 dataset folder (or URL) into ``table``; one commit.

    ``tolerance_s`` bounds timestamp drift (LeRobot's own default, 1e-4 s).
    ``max_meta_bytes`` (default 256 MiB) bounds ``meta/``: a JSON file larger than that
    (each is parsed whole), or a metadata parquet file whose columns used decode to more,
    stops the import with :class:`~treadle.errors.UnsafeInput` naming the file.
    ``executor=td.RayExecutor()`` stages each episode as a Ray task (each reads its
    episode's data file and video spans) and commits once here.
    ``allow_pickle`` is accepted for a uniform CLI; LeRobot data is never unpickled.
    """
    return _import(src, project, table, ImportOptions.of(locals()), tolerance_s, max_meta_bytes)


def _import(
    src: str,
    project: Project,
    table: str,
    opts: ImportOptions,
    tolerance_s: float,
    max_meta_bytes: int = MAX_META_BYTES,
) -> ImportResult:
    source = Source(str(src).rstrip("/"), opts.source_options)
    meta = read_meta(source, max_meta_bytes)
    check_rename(opts.rename, meta.features, f"LeRobot dataset {source.root} (meta/info.json)")
    shipped = read_source_stats(source, max_meta_bytes)
    br = opts.open_branch(project)
    names = sorted({e.data_file for e in meta.episodes}) + sorted(
        {f for e in meta.episodes for f in e.video_files.values()}
    )
    # the metadata decides episodes, tasks and timestamps: its files are part of the source
    names += source.list("meta")
    ids = identities([SourceFile(source, n) for n in names])
    options = opts.id_options("images", "rename", tolerance_s=tolerance_s)
    total_bytes = sum(i[0] for i in ids if i and i[0] > 0)
    conv = opts.for_sources()

    videos: list[dict[str, str]] = []
    codecs = VideoCodecs(source)

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        rows = eps = nbytes = 0
        part = meta if only is None else replace(meta, episodes=pick(meta.episodes, only))
        episodes = iter_episodes(
            source, part, conv, tolerance_s=tolerance_s, file_rows=rows_per_file(meta)
        )
        for (name, cols, n), ep in zip(prefetch(episodes, depth=1), part.episodes):
            videos.extend(codecs.report(name, ep, cols, meta, conv.rename))
            tw.append_episode(cols, episode=name, fps=meta.fps)
            rows += len(next(iter(cols.values())))
            eps += 1
            nbytes += n
            bar.update(1)
        return rows, eps, (total_bytes if only is None else nbytes)

    result = run_import(
        opts,
        br,
        table,
        fmt="lerobot",
        iid=import_id("lerobot", [source.describe(n) for n in names], ids, options),
        what=f"{meta.version} dataset {source.root} ({len(meta.episodes)} episodes)",
        write=write,
        total=len(meta.episodes),
        unit="episode",
        sources=[f"episode {e.index} of {source.root}" for e in meta.episodes],
    )
    if shipped and result.commit is not None:
        _keep_source_stats(br.table(table).at(result.commit.id), shipped, opts.rename)
    if opts.executor is None and not result.skipped:
        result = replace(result, videos=videos)
    return result


def _keep_source_stats(table: Table, shipped: dict[str, dict[str, Any]], rename: Any) -> None:
    """The source's ``meta/stats.json`` beside the imported version, under column names."""
    from treadle.table.source_stats import put_source_stats

    names = set(table.schema.names)
    cols = {}
    for feature, fields in shipped.items():
        col = column_name(feature, "LeRobot meta/stats.json", rename)
        if col in names:
            cols[col] = fields
    put_source_stats(table, cols, STATS_SOURCE)

"""Read and check ``meta/`` of a LeRobot dataset (codebase v3.0, and v2.1/v2.0).

Metadata comes from the dataset, so it is hostile until checked: every field used is
checked for type and range, path templates (``data_path``/``video_path``) may only use
LeRobot's own fields with small integer widths (a width of two billion would make a
2 GB string), and JSON nesting too deep to parse is refused. Anything wrong is
:class:`CorruptData` naming the file and the field.

Memory is bounded by ``max_meta_bytes`` (:data:`MAX_META_BYTES`, 256 MiB; an
``import_lerobot`` option): a JSON file (parsed whole) larger than that, or parquet
metadata whose columns used would decode to more (counted from the footer and the
dictionaries, before decoding), is :class:`UnsafeInput` naming the file. Only the
columns used are read from ``meta/episodes/*.parquet`` (not its per-episode statistics).
"""

from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from treadle.errors import CorruptData, NotFound, TreadleError, UnsafeInput, UnsupportedFormat
from treadle.importers.parquet_bounded import read_columns
from treadle.importers.sources import Source, parse_manifest

SUPPORTED = ("v3.0", "v2.1", "v2.0")
DEFAULT_V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_V3_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_V2_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
DEFAULT_V2_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

#: Format specs a path template may use: ``{key}``/``{key:s}`` for the camera key, an
#: integer with an optional zero-padded width below 100 (``{episode_index:06d}``).
_INT_SPEC = re.compile(r"(0?[1-9][0-9]?)?d?")
_MAX_TEMPLATE = 1024
_MAX_INDEX = 2**63 - 1
#: default ``max_meta_bytes``: the largest JSON file of ``meta/`` read (each is parsed
#: whole), and the most bytes the columns used of one metadata parquet file may decode to
MAX_META_BYTES = 256 << 20


@dataclass
class Episode:
    """One episode's metadata."""

    index: int
    length: int
    data_file: str
    video_files: dict[str, str] = field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass
class LeRobotMeta:
    """What ``meta/`` says about the dataset."""

    version: str
    fps: float
    features: dict[str, Any]
    cameras: list[str]
    images: list[str]
    tasks: dict[int, str]
    episodes: list[Episode]


def read_meta(source: Source, max_meta_bytes: int = MAX_META_BYTES) -> LeRobotMeta:
    """Parse ``meta/`` of a v3.0 or v2.1 dataset (:class:`UnsupportedFormat` otherwise).

    Malformed metadata (wrong types, missing keys, unsafe templates) is
    :class:`CorruptData` naming the file and field; a file past ``max_meta_bytes`` is
    :class:`UnsafeInput` (see the module's doc).
    """
    return parse_manifest(
        lambda: _read_meta(source, max_meta_bytes), source.describe("meta/"), "LeRobot metadata"
    )


def read_meta_file(source: Source, name: str, limit: int) -> bytes:
    """A JSON file of ``meta/``, refused from its size past ``limit`` (it is parsed whole:
    a parse holds many times the bytes it reads)."""
    size = source.size(name)
    raw = source.read(name) if size <= limit else b""
    if max(size, len(raw)) > limit:  # the file may have grown since
        raise UnsafeInput(
            f"{source.describe(name)} has {max(size, len(raw)):,} bytes, more than "
            f"max_meta_bytes={limit:,} (it is parsed whole); raise max_meta_bytes if you trust it"
        )
    return raw


def load_json(raw: bytes, where: str) -> Any:
    """JSON from bytes; invalid UTF-8/JSON or nesting too deep is :class:`CorruptData`."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CorruptData(f"{where} is not valid JSON: {type(e).__name__}: {e}") from None


def _read_meta(source: Source, limit: int) -> LeRobotMeta:
    where = source.describe("meta/info.json")
    try:
        raw = read_meta_file(source, "meta/info.json", limit)
    except NotFound:
        raise NotFound(f"not a LeRobot dataset: {where} does not exist") from None
    info = load_json(raw, where)
    if not isinstance(info, dict):
        raise CorruptData(f"{where} is not a JSON object")
    version = info.get("codebase_version")
    if version not in SUPPORTED:
        raise UnsupportedFormat(
            f"{where}: LeRobot codebase_version {version!r} is not supported "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    fps = _number(info.get("fps"), where, "fps")
    if fps <= 0:
        raise CorruptData(f"{where}: field 'fps' must be positive, got {fps}")
    features = info.get("features")
    if not isinstance(features, dict):
        raise CorruptData(f"{where}: field 'features' is missing or not an object")
    for k, f in features.items():
        if not isinstance(f, dict):
            raise CorruptData(f"{where}: field 'features.{k}' is not an object")
    cameras = [k for k, f in features.items() if f.get("dtype") == "video"]
    images = [k for k, f in features.items() if f.get("dtype") == "image"]
    if version == "v3.0":
        tasks = _tasks_v3(source, limit)
        episodes = _episodes_v3(source, info, cameras, limit)
    else:
        tasks = _tasks_v2(source, limit)
        episodes = _episodes_v2(source, info, cameras, limit)
    seen: dict[int, str] = {}
    for e, where in episodes:
        if e.index in seen:
            raise CorruptData(
                f"{where}: episode_index {e.index} appears twice (first at {seen[e.index]})"
            )
        seen[e.index] = where
    return LeRobotMeta(
        version,
        fps,
        features,
        cameras,
        images,
        tasks,
        sorted((e for e, _ in episodes), key=lambda e: e.index),
    )


def _number(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CorruptData(f"{where}: field {name!r} must be a number, got {value!r:.40}")
    out = float(value)
    if not math.isfinite(out):
        raise CorruptData(f"{where}: field {name!r} must be finite, got {out}")
    return out


def _index(value: Any, where: str, name: str) -> int:
    """A non-negative integer field (an integral float is accepted, as parquet may widen)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INDEX:
        raise CorruptData(
            f"{where}: field {name!r} must be a non-negative integer, got {value!r:.40}"
        )
    return value


def _template(info: dict[str, Any], key: str, default: str, names: set[str], where: str) -> str:
    """``info[key]`` (or ``default``), checked to format to a short path (see module doc)."""
    value = info.get(key) or default
    if not isinstance(value, str) or len(value) > _MAX_TEMPLATE:
        raise CorruptData(f"{where}: field {key!r} must be a path template string")
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as e:
        raise CorruptData(f"{where}: field {key!r} is not a valid template: {e}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        ok = name in names and conversion is None
        ok = ok and (spec in ("", "s") if name == "video_key" else bool(_INT_SPEC.fullmatch(spec)))
        if not ok:
            raise CorruptData(
                f"{where}: field {key!r} has an unsupported placeholder "
                f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                f"(allowed: {', '.join(sorted(names))}, integer widths below 100)"
            )
    return value


def _format(template: str, where: str, key: str, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, ValueError, IndexError) as e:
        raise CorruptData(f"{where}: field {key!r} does not format: {e}") from None


def _parquet(source: Source, name: str, pick: Any, limit: int) -> pa.Table:
    """The columns ``pick(the file's column names)`` of a metadata parquet file (those it
    has), refused past ``limit`` bytes decoded (:func:`read_columns`)."""
    try:
        raw = source.read(name)
        names = pq.read_schema(pa.BufferReader(raw)).names
        return read_columns(raw, source.describe(name), pick(names), limit, "max_meta_bytes")
    except TreadleError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptData(f"{source.describe(name)} is not a readable parquet file: {e}") from None


def _task_column(names: list[str]) -> str | None:
    return "task" if "task" in names else next((n for n in names if n.startswith("__index")), None)


def _tasks_v3(source: Source, limit: int) -> dict[int, str]:
    name = "meta/tasks.parquet"
    if not source.exists(name):
        return {}
    where = source.describe(name)
    t = _parquet(source, name, lambda names: ["task_index", _task_column(names)], limit)
    names = t.column_names
    task_col = _task_column(names)
    if task_col is None or "task_index" not in names:
        raise CorruptData(f"{where}: no task/task_index columns")
    out = {}
    for i, s in zip(t["task_index"].to_pylist(), t[task_col].to_pylist()):
        if not isinstance(s, str):
            raise CorruptData(f"{where}: field {task_col!r} must be a string, got {s!r:.40}")
        out[_index(i, where, "task_index")] = s
    return out


def _jsonl(source: Source, name: str, limit: int) -> list[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for each non-blank line of a JSON-lines file."""
    out = []
    for n, line in enumerate(read_meta_file(source, name, limit).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source.describe(name)} line {n}"
        d = load_json(line, where)
        if not isinstance(d, dict):
            raise CorruptData(f"{where} is not a JSON object")
        out.append((where, d))
    return out


def _tasks_v2(source: Source, limit: int) -> dict[int, str]:
    if not source.exists("meta/tasks.jsonl"):
        return {}
    out = {}
    for where, d in _jsonl(source, "meta/tasks.jsonl", limit):
        task = d.get("task")
        if not isinstance(task, str):
            raise CorruptData(f"{where}: field 'task' must be a string, got {task!r:.40}")
        out[_index(d.get("task_index"), where, "task_index")] = task
    return out


def _span(row: dict[str, Any], cam: str, where: str) -> tuple[float, float]:
    a = _number(row.get(f"videos/{cam}/from_timestamp"), where, f"videos/{cam}/from_timestamp")
    b = _number(row.get(f"videos/{cam}/to_timestamp"), where, f"videos/{cam}/to_timestamp")
    if not 0 <= a <= b:
        raise CorruptData(
            f"{where}: video span of {cam!r} is [{a}, {b}) s (from_timestamp must be >= 0 and "
            "<= to_timestamp)"
        )
    return a, b


def _episodes_v3(
    source: Source, info: dict[str, Any], cameras: list[str], limit: int
) -> list[tuple[Episode, str]]:
    files = [n for n in source.list("meta/episodes") if n.endswith(".parquet")]
    if not files:
        raise NotFound(f"LeRobot v3.0 dataset {source.root} has no meta/episodes/*.parquet")
    info_where = source.describe("meta/info.json")
    data_path = _template(
        info, "data_path", DEFAULT_V3_DATA, {"chunk_index", "file_index"}, info_where
    )
    video_path = _template(
        info,
        "video_path",
        DEFAULT_V3_VIDEO,
        {"chunk_index", "file_index", "video_key"},
        info_where,
    )
    used = ["episode_index", "length", "data/chunk_index", "data/file_index"] + [
        f"videos/{cam}/{k}"
        for cam in cameras
        for k in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    ]
    out: list[tuple[Episode, str]] = []
    for name in files:
        for n, r in enumerate(_parquet(source, name, lambda _: used, limit).to_pylist()):
            where = f"{source.describe(name)} row {n}"
            e = Episode(
                _index(r.get("episode_index"), where, "episode_index"),
                _index(r.get("length"), where, "length"),
                _format(
                    data_path,
                    info_where,
                    "data_path",
                    chunk_index=_index(r.get("data/chunk_index"), where, "data/chunk_index"),
                    file_index=_index(r.get("data/file_index"), where, "data/file_index"),
                ),
            )
            for cam in cameras:
                e.video_files[cam] = _format(
                    video_path,
                    info_where,
                    "video_path",
                    video_key=cam,
                    chunk_index=_index(
                        r.get(f"videos/{cam}/chunk_index"), where, f"videos/{cam}/chunk_index"
                    ),
                    file_index=_index(
                        r.get(f"videos/{cam}/file_index"), where, f"videos/{cam}/file_index"
                    ),
                )
                e.spans[cam] = _span(r, cam, where)
            out.append((e, where))
    return out


def _episodes_v2(
    source: Source, info: dict[str, Any], cameras: list[str], limit: int
) -> list[tuple[Episode, str]]:
    if not source.exists("meta/episodes.jsonl"):
        raise NotFound(f"LeRobot {info.get('codebase_version')} dataset has no meta/episodes.jsonl")
    info_where = source.describe("meta/info.json")
    chunks = _index(info.get("chunks_size") or 1000, info_where, "chunks_size") or 1000
    names = {"episode_chunk", "episode_index"}
    data_path = _template(info, "data_path", DEFAULT_V2_DATA, names, info_where)
    video_path = _template(info, "video_path", DEFAULT_V2_VIDEO, names | {"video_key"}, info_where)
    out = []
    for where, d in _jsonl(source, "meta/episodes.jsonl", limit):
        ep = _index(d.get("episode_index"), where, "episode_index")
        e = Episode(
            ep,
            _index(d.get("length"), where, "length"),
            _format(
                data_path, info_where, "data_path", episode_chunk=ep // chunks, episode_index=ep
            ),
        )
        for cam in cameras:
            e.video_files[cam] = _format(
                video_path,
                info_where,
                "video_path",
                episode_chunk=ep // chunks,
                video_key=cam,
                episode_index=ep,
            )
        out.append((e, where))
    return out


def rows_per_file(meta: LeRobotMeta) -> dict[str, int]:
    """Data file -> the rows its episodes have (what its footer may state)."""
    out: dict[str, int] = {}
    for e in meta.episodes:
        out[e.data_file] = out.get(e.data_file, 0) + e.length
    return out


def values_per_row(meta: LeRobotMeta) -> int:
    """The most leaf values one column of a data file may have a row: the largest feature
    (a camera's frames are in video files, an image is one value: its bytes)."""
    sizes = [1]
    for f in meta.features.values():
        if f.get("dtype") in ("video", "image"):
            continue
        shape = f.get("shape")
        if isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape):
            sizes.append(math.prod(shape))
    return max(sizes)

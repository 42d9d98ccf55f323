"""``td.importers.ros2``: ROS 2 bags (rosbag2 with MCAP or SQLite storage), ``.mcap`` files
and ROS 1 ``.bag`` files -> a table sampled on one clock, one bag an episode.

:mod:`~treadle.importers.ros2.ros2_bags` finds and reads the bags,
:mod:`~treadle.importers.ros2.ros2_messages` turns messages into values,
:mod:`~treadle.importers.ros2.ros2_align` fixes the clock and the message each topic gives at
each moment, and :mod:`~treadle.importers.ros2.ros2_episode` builds the columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any

from treadle.importers.arrow import column_name
from treadle.importers.cameras import Reports, check_camera_mode
from treadle.importers.episodic import Episode, LocalCopies, SourceMeta, import_episodes
from treadle.importers.ros2.ros2_align import ALIGNS, as_fraction
from treadle.importers.ros2.ros2_bags import (
    Bag,
    TopicSpec,
    find_bags,
    first_joint_names,
    load_values,
    read_bag,
    require_rosbags,
)
from treadle.importers.ros2.ros2_episode import episode_columns
from treadle.importers.run import ImportOptions, ImportResult
from treadle.importers.sources import Source

if TYPE_CHECKING:
    from treadle.catalog.client import Project
    from treadle.importers.executor import Executor

MAX_EPISODE_BYTES = 4 << 30


@dataclass(frozen=True)
class _Settings:
    specs: tuple[TopicSpec, ...]
    fps: Fraction
    images: str
    max_episode_bytes: int
    joints: dict[str, list[str]] = field(default_factory=dict)  # topic -> joint order


def topic_specs(
    topics: Mapping[str, str],
    align: Mapping[str, str] | None,
    stamp: str | Mapping[str, str],
) -> tuple[TopicSpec, ...]:
    """``topics`` (``{"/topic" or "/topic:field.path": column}``) checked, with each column's
    alignment and each topic's stamp."""
    if not isinstance(topics, Mapping) or not topics:
        raise ValueError("topics must name at least one topic: {'/joint_states': 'joints', ...}")
    align = dict(align or {})
    stamps = dict(stamp) if isinstance(stamp, Mapping) else {}
    default = "header" if isinstance(stamp, Mapping) else stamp
    specs = []
    for key, col in topics.items():
        topic, _, field = str(key).partition(":")
        if not topic.startswith("/"):
            raise ValueError(f"topic {key!r} must start with '/'")
        specs.append(TopicSpec(topic, field or None, column_name(col, f"topic {key!r}"),
                               align.pop(col, "hold"), stamps.pop(topic, default)))  # fmt: skip
    for s in specs:
        if s.align not in ALIGNS:
            raise ValueError(
                f"align for column {s.column!r} must be one of {ALIGNS}, got {s.align!r}"
            )
        if s.stamp not in ("header", "log"):
            raise ValueError(
                f"stamp for topic {s.topic} must be 'header' or 'log', got {s.stamp!r}"
            )
    if align:
        raise ValueError(f"align names columns no topic gives: {sorted(align)}")
    if stamps:
        raise ValueError(f"stamp names topics not selected: {sorted(stamps)}")
    columns = [s.column for s in specs]
    if len(set(columns)) != len(columns):
        raise ValueError(f"two topics give the same column: {columns}")
    return tuple(specs)


def import_ros2(
    src: str,
    project: Project,
    table: str,
    *,
    topics: Mapping[str, str],
    fps: float | str | Fraction,
    stamp: str | Mapping[str, str] = "header",
    align: Mapping[str, str] | None = None,
    images: str = "video",
    max_episode_bytes: int = MAX_EPISODE_BYTES,
    branch: str | None = None,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    executor: Executor | None = None,
    allow_pickle: bool = False,
    rename: dict[str, str] | None = None,
) -> ImportResult:
    """Import ROS bags into ``table`` on one clock at ``fps``; one bag an episode, one commit.

    ``topics``: ``{"/topic": column}`` (``"/topic:field.path"`` for a field of any type);
    ``stamp``: ``"header"`` (a message's ``header.stamp`` when it has one, else its log
    time), ``"log"``, or ``{"/topic": "log"}``; ``align``: ``{column: "linear" | "next"}``
    (default sample-and-hold). ``images``: ``"video"`` (PSNR in the result), ``"encoded"``
    (a ``CompressedImage``'s bytes as they are; raw images as PNG) or ``"decoded"``. The
    result's ``topics`` reports each bag's topics. See docs/api.md for the exact rules.
    ``rename``, ``allow_pickle``: accepted for a uniform CLI (``topics`` names columns)."""
    check_camera_mode(images)
    require_rosbags()
    settings = _Settings(
        topic_specs(topics, align, stamp), as_fraction(fps), images, int(max_episode_bytes)
    )
    opts = ImportOptions.of({k: v for k, v in locals().items() if k not in ("images", "rename")})
    source, bags = find_bags(src, opts.source_options)
    names = [f for b in bags for f in b.files]
    copies = LocalCopies(source)
    try:
        settings, meta, joint_meta = _joint_order(source, bags[0], settings, copies)
        result = import_episodes(
            opts,
            project,
            table,
            fmt="ros2",
            source=source,
            names=names,
            episodes=partial(_episodes, source, tuple(bags), settings),
            options=_id_options(opts, settings),
            fps=float(settings.fps),
            images=settings.images,
            meta=meta,
            copies=copies,
            units=[source.describe(b.path) for b in bags],
            column_metadata=joint_meta,
        )
    finally:
        copies.close()
    return replace(result, topics=None) if opts.executor is not None else result


def _id_options(opts: ImportOptions, settings: _Settings) -> dict[str, Any]:
    """The options the import id records."""
    topics = [(s.topic, s.field, s.column, s.align, s.stamp) for s in settings.specs]
    return opts.id_options(images=settings.images, fps=str(settings.fps), topics=topics)


def _joint_order(
    source: Source, first: Bag, settings: _Settings, copies: LocalCopies
) -> tuple[_Settings, SourceMeta, dict[str, dict[str, Any]]]:
    """The JointState order of every bag (the first bag's first message's): in the
    settings, in the table's metadata (``joint_names``: ``{column: [joint, ...]}``) and as
    the column metadata (``joint_names``) of ``<col>_position``, ``_velocity``, ``_effort``."""
    where = f"bag {source.describe(first.path)}"
    joints = first_joint_names(
        _local(copies, first), settings.specs, where, settings.max_episode_bytes
    )
    columns = {s.topic: s.column for s in settings.specs if s.field is None}
    names = {columns[t]: n for t, n in joints.items()}
    meta = SourceMeta({"joint_names": names} if names else {}, {}, "ros2")
    per_column = {
        f"{col}{part}": {"joint_names": n}
        for col, n in names.items()
        for part in ("_position", "_velocity", "_effort")
    }
    return replace(settings, joints=joints), meta, per_column


def _episodes(
    source: Source,
    bags: Sequence[Bag],
    settings: _Settings,
    units: Sequence[int],
    copies: LocalCopies,
    report: Reports | None,
) -> Iterator[Episode]:
    """One episode per bag in ``units``."""
    for i in units:
        bag = bags[i]
        where = f"bag {source.describe(bag.path)}"
        local = _local(copies, bag)
        limit = settings.max_episode_bytes
        data = read_bag(local, settings.specs, where, limit, settings.joints)
        load = partial(_load, local, data, where=where, limit=limit)
        cols, n, rows = episode_columns(
            data, settings.fps, settings.images, bag.episode, where, report, load, limit
        )
        if report is not None:
            report.topics.extend(rows)
        yield bag.episode, cols, n, sum(source.size(f) for f in bag.files)


def _local(copies: LocalCopies, bag: Bag) -> str:
    """The local path AnyReader opens for ``bag``: its file, or its folder."""
    if len(bag.files) == 1 and bag.files[0] == bag.path:
        return copies.path(bag.path)
    base = copies.tree(bag.files)
    return f"{base}/{bag.path}" if bag.path else base


def _load(local: str, data: list[Any], needed: list[set[int]], *, where: str, limit: int) -> None:
    load_values(local, data, needed, where, limit)

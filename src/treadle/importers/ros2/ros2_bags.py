"""Finding the bags of a ROS source and reading the selected topics of one (rosbags).

A source is a rosbag2 folder (``metadata.yaml`` beside ``.mcap`` or ``.db3`` files), a single
``.mcap`` file, a ROS 1 ``.bag``, or a folder of those: each bag is one episode, named by its
folder or file stem, in name order. ``rosbags``' ``AnyReader`` reads all of them without a
ROS install (an optional extra: ``pip install 'treadle[ros2]'``). A bag is read twice:
:func:`read_bag` keeps every message's time and its value unless it is an image;
:func:`load_values` then converts only the images the clock uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from treadle.errors import CorruptData, MissingDependency, NotFound, SchemaMismatch, UnsafeInput
from treadle.importers.ros2.ros2_inflate import capped
from treadle.importers.ros2.ros2_messages import Converter, converter, header_stamp
from treadle.importers.sources import Source, split_url

INSTALL = "pip install 'treadle[ros2]'"
FILE_BAGS = (".mcap", ".bag")
#: kinds whose values are read in a second pass, only for the messages the clock uses
HEAVY = ("camera", "image", "depth")
JOINT_STATE = "sensor_msgs/msg/JointState"
_IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
#: a header stamp further than this from its log time is an error (an unset stamp, another clock)
MAX_STAMP_SKEW_NS = 10 * 10**9


@dataclass(frozen=True)
class Bag:
    """One bag of a source: its episode name, its files, and the path AnyReader opens."""

    episode: str
    files: tuple[str, ...]
    path: str  # relative to the source: the bag folder, or the file


@dataclass(frozen=True)
class TopicSpec:
    """One selected topic: ``/topic`` or ``/topic:field.path``, its column, alignment, stamp."""

    topic: str
    field: str | None
    column: str
    align: str
    stamp: str


@dataclass
class TopicData:
    """What one bag gave of one :class:`TopicSpec`: message times (ns, log order), values."""

    spec: TopicSpec
    msgtype: str = ""
    times: list[int] = field(default_factory=list)
    values: list[dict[str, Any]] = field(default_factory=list)
    conv: Converter | None = None


def require_rosbags() -> Any:
    try:
        from rosbags.highlevel import AnyReader
    except ImportError as e:
        raise MissingDependency(
            f"ROS bag imports need rosbags ({e}); install it with: {INSTALL}"
        ) from None
    return AnyReader


def find_bags(src: str, options: dict[str, Any] | None) -> tuple[Source, list[Bag]]:
    """The bags of ``src`` in episode-name order (see the module doc)."""
    src = str(src).rstrip("/")
    if src.lower().endswith(FILE_BAGS):
        root, name = split_url(src)
        source = Source(root, options)
        if not source.exists(name):
            raise NotFound(f"no bag file {source.describe(name)}")
        return source, [Bag(PurePosixPath(name).stem, (name,), name)]
    source = Source(src, options)
    files = source.list()
    if "metadata.yaml" in files:
        return source, [Bag(PurePosixPath(src).name, tuple(files), "")]
    folders = sorted(
        {str(PurePosixPath(f).parent) for f in files if PurePosixPath(f).name == "metadata.yaml"}
    )
    bags = [
        Bag(PurePosixPath(d).name, tuple(f for f in files if f.startswith(d + "/")), d)
        for d in folders
    ]
    inside = {f for b in bags for f in b.files}
    bags += [
        Bag(PurePosixPath(f).stem, (f,), f)
        for f in files
        if f.lower().endswith(FILE_BAGS) and f not in inside
    ]
    if not bags:
        raise NotFound(
            f"no ROS bags (metadata.yaml folders, .mcap or .bag files) in {source.describe()}"
        )
    bags.sort(key=lambda b: b.episode)
    for a, b in zip(bags, bags[1:]):
        if a.episode == b.episode:
            raise CorruptData(
                f"{source.describe()}: two bags are both named {a.episode!r} ({a.path}, {b.path})"
            )
    return source, bags


def read_bag(
    local: str,
    specs: Sequence[TopicSpec],
    where: str,
    limit: int,
    joints: Mapping[str, list[str]] | None = None,
) -> list[TopicData]:
    """Every message of the selected topics of the bag at ``local``, converted (JointState
    values in the order ``joints[topic]``)."""
    data = [TopicData(s) for s in specs]
    with open_bag(local, where, limit) as reader:
        by_topic = _connections(reader, specs, where)
        conns = [c for cs in by_topic.values() for c in cs]
        check_chunks(reader, conns, where, limit)
        total, counts = 0, dict.fromkeys(range(len(conns)), 0)
        for conn, logtime, raw in reader.messages(connections=conns):
            counts[conns.index(conn)] += 1
            msg = decode(reader, raw, conn, logtime, where)
            total += len(raw) if conn.msgtype not in _IMAGE_TYPES else 0
            if total > limit:
                raise CorruptData(
                    f"{where}: the selected topics hold over {limit} bytes (max_episode_bytes)"
                )
            for d in data:
                if d.spec.topic == conn.topic:
                    _add(d, conn.msgtype, msg, int(logtime), where, (joints or {}).get(conn.topic))
        _check_counts(conns, counts, where)
    for d in data:
        if not d.times:
            raise CorruptData(
                f"{where}: topic {d.spec.topic} ({d.msgtype or 'no type'}) has no message"
            )
    return data


@contextlib.contextmanager
def open_bag(local: str, where: str, limit: int) -> Iterator[Any]:
    """rosbags' ``AnyReader`` over the bag at ``local``, its chunks inflating to at most
    ``limit`` bytes (:func:`~treadle.importers.ros2.ros2_inflate.capped`); rosbags' errors,
    of many types, become :class:`CorruptData` naming the bag (``where``)."""
    from rosbags.typesys import Stores, get_typestore

    reader_cls = require_rosbags()
    try:
        with (
            capped(where, limit),
            reader_cls(
                [Path(local)], default_typestore=get_typestore(Stores.ROS2_HUMBLE)
            ) as reader,
        ):
            yield reader
    except Exception as e:
        if type(e).__module__.startswith("treadle"):
            raise
        raise CorruptData(f"{where} cannot be read as a ROS bag: {type(e).__name__}: {e}") from None


def _check_counts(conns: list[Any], counts: dict[int, int], where: str) -> None:
    """Fewer messages read than the bag's index states is a damaged bag: rosbags stops
    reading an MCAP chunk at a damaged record without a word (and may give a garbage value
    before it). More than stated is let be (a recording cut short writes its counts early)."""
    for i, conn in enumerate(conns):
        stated = int(getattr(conn, "msgcount", 0) or 0)
        if counts[i] < stated:
            raise CorruptData(
                f"{where}: topic {conn.topic} ({conn.msgtype}) gave {counts[i]} messages, "
                f"its index states {stated} (a damaged or truncated bag)"
            )


def check_chunks(reader: Any, conns: Sequence[Any], where: str, limit: int) -> None:
    """Refuse, before any is read, MCAP chunks that rosbags would hold inflated at once past
    ``limit`` bytes (and a SQLite bag's message larger than that). rosbags merges chunks by
    time and inflates a chunk once its first time comes up, keeping it until its last
    message is out: chunks that overlap in time are all held at once (a bag of a few KB whose
    chunks all span one second, each inflating to just under the cap, asked for any number
    of caps). The sizes are the MCAP index's."""
    wanted = {(c.topic, c.msgtype) for c in conns}
    for sub in getattr(reader, "readers", []):
        storage = getattr(sub, "storage", None)
        for st in getattr(storage, "storages", [storage]):
            chunks = getattr(st, "chunks", None) or []
            ids = {c.id for c in getattr(st, "connections", []) if (c.topic, c.msgtype) in wanted}
            if getattr(st, "dbconn", None) is not None and ids:
                _check_rows(st.dbconn, ids, where, limit)
            events = sorted(
                e
                for ch in chunks
                if any(ch.channel_count.get(i, 0) for i in ids)
                for e in (
                    (ch.message_start_time, 0, ch.uncompressed_size),
                    (ch.message_end_time, 1, -ch.uncompressed_size),
                )
            )  # a chunk that starts when another ends is held with it
            held = 0
            for _, _, size in events:
                held += size
                if held > limit:
                    raise UnsafeInput(
                        f"{where}: rosbags would hold over {limit:,} bytes of its MCAP chunks "
                        "inflated at once (max_episode_bytes; a chunk that large, or chunks "
                        "overlapping in time: a decompression bomb, or raise max_episode_bytes "
                        "if the bag is real)"
                    )


def _check_rows(db: Any, ids: set[int], where: str, limit: int) -> None:
    """A SQLite bag's largest selected message, refused past ``limit`` before it is read
    (SQLite reads a row whole; ``length()`` of a blob reads no content)."""
    marks = ",".join("?" * len(ids))
    query = f"SELECT max(length(data)) FROM messages WHERE topic_id IN ({marks})"  # noqa: S608
    (largest,) = next(iter(db.execute(query, tuple(ids))))
    if largest is not None and largest > limit:
        raise UnsafeInput(
            f"{where}: a selected message holds {largest:,} bytes, over max_episode_bytes "
            f"({limit:,} bytes; raise it if the bag is real)"
        )


def decode(reader: Any, raw: bytes, conn: Any, logtime: int, where: str) -> Any:
    """One message of ``conn``, deserialized from a view of ``raw``: rosbags slices what it
    is given, and a slice of ``bytes`` copies the whole message (a view's is free; arrays in
    the message then are views of ``raw``). A message that cannot be read names its topic."""
    try:
        return reader.deserialize(memoryview(raw), conn.msgtype)
    except Exception as e:  # rosbags raises several types for a damaged message
        raise CorruptData(
            f"{where}, topic {conn.topic} ({conn.msgtype}): the message logged at "
            f"{int(logtime) / 1e9:.9f} s cannot be deserialized: {type(e).__name__}: {e}"
        ) from None


def _connections(reader: Any, specs: Sequence[TopicSpec], where: str) -> dict[str, list[Any]]:
    by_topic: dict[str, list[Any]] = {}
    for c in reader.connections:
        by_topic.setdefault(c.topic, []).append(c)
    missing = sorted({s.topic for s in specs} - by_topic.keys())
    if missing:
        raise NotFound(f"{where}: no topic {missing[0]!r} in the bag (it has {sorted(by_topic)})")
    return {s.topic: by_topic[s.topic] for s in specs}


def _add(
    d: TopicData, msgtype: str, msg: Any, logtime: int, where: str, joints: list[str] | None
) -> None:
    at = f"{where}, topic {d.spec.topic} ({msgtype})"
    if d.conv is None:
        d.msgtype = msgtype
        d.conv = converter(msgtype, d.spec.field, msg, at, joints)
    elif msgtype != d.msgtype:  # else one column silently mixes the values of two types
        raise SchemaMismatch(
            f"{where}: topic {d.spec.topic} has messages of two types, {d.msgtype} and "
            f"{msgtype}; a column holds values of one type (import another topic)"
        )
    stamp = header_stamp(msg) if d.spec.stamp == "header" else None
    if stamp is not None and abs(stamp - logtime) > MAX_STAMP_SKEW_NS:
        raise CorruptData(
            f"{at}: header stamp {stamp / 1e9:.3f} s is {abs(stamp - logtime) / 1e9:.1f} s from "
            f"its log time {logtime / 1e9:.3f} s (an unset stamp, or another clock); import "
            f"with stamp={{{d.spec.topic!r}: 'log'}} (--stamp {d.spec.topic}=log) to use log times "
            "for this topic"
        )
    d.times.append(stamp if stamp is not None else logtime)
    d.values.append(None if d.conv.kind in HEAVY else d.conv.value(msg))


def first_joint_names(
    local: str, specs: Sequence[TopicSpec], where: str, limit: int
) -> dict[str, list[str]]:
    """Per selected JointState topic, the joint names of its first message in this bag:
    the order of the values in every bag of the import (chunks inflate to ``limit`` bytes)."""
    topics = {s.topic for s in specs if s.field is None}
    out: dict[str, list[str]] = {}
    with open_bag(local, where, limit) as reader:
        conns = [c for c in reader.connections if c.topic in topics and c.msgtype == JOINT_STATE]
        wanted = {c.topic for c in conns}
        if not conns:  # (no connections means every connection to rosbags)
            return out
        check_chunks(reader, conns, where, limit)
        for conn, logtime, raw in reader.messages(connections=conns):
            if conn.topic not in out:
                msg = decode(reader, raw, conn, logtime, where)
                out[conn.topic] = [str(n) for n in msg.name]
            if out.keys() >= wanted:
                break
    return out


def load_values(
    local: str, data: list[TopicData], needed: list[set[int]], where: str, limit: int
) -> None:
    """Second pass over the bag: the values of the image topics' messages at the log
    positions ``needed[j]`` of ``data[j]`` (at most ``limit`` bytes of them)."""
    heavy = {
        j for j, d in enumerate(data) if d.conv is not None and d.conv.kind in HEAVY and needed[j]
    }
    if not heavy:
        return
    topics = {data[j].spec.topic for j in heavy}
    seen = dict.fromkeys(topics, -1)
    total = 0
    with open_bag(local, where, limit) as reader:
        conns = [c for c in reader.connections if c.topic in topics]
        check_chunks(reader, conns, where, limit)
        for conn, logtime, raw in reader.messages(connections=conns):
            seen[conn.topic] += 1
            k = seen[conn.topic]
            want = [j for j in heavy if data[j].spec.topic == conn.topic and k in needed[j]]
            if not want:
                continue
            msg = decode(reader, raw, conn, logtime, where)
            total += len(raw)
            if total > limit:
                raise CorruptData(
                    f"{where}: the moments' images hold over {limit} bytes (max_episode_bytes)"
                )
            for j in want:
                data[j].values[k] = data[j].conv.value(msg)  # type: ignore[union-attr]

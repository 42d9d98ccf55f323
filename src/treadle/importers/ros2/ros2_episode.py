"""One bag's topics (read by :mod:`~treadle.importers.ros2.ros2_bags`) -> one episode's columns.

The clock and the picks are :mod:`~treadle.importers.ros2.ros2_align`'s; this module turns
the picked messages into columns (cameras through :mod:`treadle.importers.cameras`, depth
as exact ``uint16`` / ``float32`` Rows), adds ``timestamp`` and ``<col>_age_s``, and reports
per topic its messages, mean rate, largest gap and how often each message was used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, SchemaMismatch, UnsafeInput
from treadle.importers.cameras import Reports, camera_value, encoded_image, png_bytes
from treadle.importers.ros2.ros2_align import (
    NS,
    Picks,
    clock,
    clock_moments,
    order,
    pick,
    usage,
)
from treadle.importers.ros2.ros2_bags import TopicData
from treadle.video.image_decode import image_header

log = logging.getLogger("treadle")

#: a message more than this much earlier than one logged before it is an error
REORDER_WINDOW_NS = NS
#: a topic whose largest gap is over this many clock periods is named in a warning
GAP_WARNING_PERIODS = 5
#: the kinds of values that are images or depth (never a null before a latched message,
#: but under images="encoded")
MEDIA = ("camera", "image", "depth")


def episode_columns(
    data: list[TopicData],
    fps: Fraction,
    images: str,
    episode: str,
    where: str,
    report: Reports | None,
    load: Callable[[list[set[int]]], None] | None = None,
    limit: int | None = None,
) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
    """``(columns, moments, per-topic report rows)`` of one bag. ``load(needed)`` fills in
    the values of the image topics' messages at the log positions ``needed[j]`` of
    ``data[j]`` (read only for the messages the clock uses: bounded memory). ``limit``
    (``max_episode_bytes``) bounds the clock: a rate that would make more moments than it
    can hold is an error before they are made."""
    ordered = []
    for d in data:
        times = np.asarray(d.times, np.int64)
        pos = order(times, REORDER_WINDOW_NS, f"{where}, topic {d.spec.topic}")
        ordered.append((d, times[pos], pos))
    ticks = _ticks(ordered, fps, where, limit)
    picked = []
    for d, times, _ in ordered:
        _check_align(d, d.spec.align, where)  # asked of a latched topic too: never ignored
        align = "hold" if times.size == 1 else d.spec.align
        picked.append(pick(times, ticks, align))
    if load is not None:
        load([_needed(p, pos) for p, (_, _, pos) in zip(picked, ordered)])
    cols: dict[str, Any] = {"timestamp": (ticks - ticks[0]) / NS}
    owners = {"episode": "the table", "frame": "the table", "timestamp": "the clock"}
    rows = []
    period = float(NS / fps)
    for (d, times, pos), picks in zip(ordered, picked):
        values = [d.values[i] for i in pos]
        got = _values(d, values, picks, images, fps, (episode, where), report, limit)
        got["_age_s"] = picks.age_s
        for suffix, column in got.items():
            name = d.spec.column + suffix
            if name in owners:  # else one topic's values silently replace another's
                raise SchemaMismatch(
                    f"{where}: column {name!r} of topic {d.spec.topic} is also given by "
                    f"{owners[name]}; name the topic's column otherwise"
                )
            owners[name] = f"topic {d.spec.topic}"
            cols[name] = column
        rows.append(_report(d, episode, times, picks, times.size == 1, period, where))
    return cols, int(ticks.size), rows


def _ticks(
    ordered: list[tuple[TopicData, np.ndarray, np.ndarray]],
    fps: Fraction,
    where: str,
    limit: int | None = None,
) -> np.ndarray:
    """The bag's clock (:func:`~treadle.importers.ros2.ros2_align.clock`), refused when its
    moments alone would take more than ``limit`` bytes."""
    clocked = [(d, t) for d, t, _ in ordered if t.size > 1]
    if not clocked:
        raise CorruptData(f"{where}: every selected topic has one message: no clock to sample at")
    nexts = [int(t[-1]) for d, t in clocked if d.spec.align == "next"]
    rest = [(d, t) for d, t in clocked if d.spec.align != "next"] or clocked
    first, last = [int(t[0]) for _, t in clocked], [int(t[-1]) for _, t in rest]
    moments = clock_moments(first, last, nexts, fps)
    if limit is not None and moments * 8 * (1 + 2 * len(ordered)) > limit:
        raise CorruptData(  # each moment holds at least a time and, per topic, an index and an age
            f"{where}: a clock at {fps} fps gives {moments} moments over "
            f"{(min([*last, *nexts]) - max(first)) / NS:.3f} s, more than max_episode_bytes "
            f"({limit}) can hold; check fps"
        )
    ticks = clock(first, last, nexts, fps)
    if ticks.size == 0:
        raise CorruptData(f"{where}: the topics never overlap in time: no moment at {fps} fps")
    return ticks


def _needed(picks: Picks, pos: np.ndarray) -> set[int]:
    """The log positions of the messages ``picks`` uses."""
    used = picks.index[picks.index >= 0]
    if picks.upper is not None:
        used = np.concatenate([used, picks.upper[picks.upper >= 0]])
    return {int(i) for i in pos[np.unique(used)]}


def _check_align(d: TopicData, align: str, where: str) -> None:
    assert d.conv is not None
    if align == "linear" and d.conv.kind != "float":
        what = {"quat": "an orientation (quaternion)"}.get(d.conv.kind, f"{d.conv.kind} values")
        raise SchemaMismatch(
            f"{where}: column {d.spec.column!r} ({d.spec.topic}, {d.msgtype}) holds {what}: "
            "align='linear' interpolates floats only; use 'hold' or 'next'"
        )


def _values(
    d: TopicData,
    values: list[dict[str, Any]],
    picks: Picks,
    images: str,
    fps: Fraction,
    names: tuple[str, str],
    report: Reports | None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Per column suffix, the picked values of one topic (``names``: its episode, its bag)."""
    assert d.conv is not None
    kind, out = d.conv.kind, {}
    for suffix in next(v for v in values if v is not None):
        name = d.spec.column + suffix
        _check_size([values[i][suffix] for i in picks.index if i >= 0], names[1], name, limit)
        if kind in MEDIA:
            picked = [values[i][suffix] if i >= 0 else None for i in picks.index]
            out[suffix] = _media(d, picked, images, fps, names, name, report, limit)
        elif picks.index.min() < 0:  # a latched topic before its message: nulls
            out[suffix] = _with_nulls([values[i][suffix] if i >= 0 else None for i in picks.index])
        elif picks.weight is not None:
            lo = np.stack([np.asarray(values[i][suffix], np.float64) for i in picks.index])
            hi = np.stack([np.asarray(values[i][suffix], np.float64) for i in picks.upper])
            w = picks.weight.reshape(-1, *([1] * (lo.ndim - 1)))
            out[suffix] = lo + w * (hi - lo)
        elif kind in ("str",):
            out[suffix] = [values[i][suffix] for i in picks.index]
        else:
            out[suffix] = np.stack([np.asarray(values[i][suffix]) for i in picks.index])
    return out


def _media(
    d: TopicData,
    picked: list[Any],
    images: str,
    fps: Fraction,
    names: tuple[str, str],
    name: str,
    report: Reports | None,
    limit: int | None = None,
) -> Any:
    """One camera (encoded bytes or pixels) or depth column of the picked messages (None
    before a latched topic's message: only ``images="encoded"`` has a null for it)."""
    assert d.conv is not None
    (episode, where), kind = names, d.conv.kind
    at = f"{where}, column {name!r}"
    before = sum(v is None for v in picked)
    if before and (kind == "depth" or images != "encoded"):
        what = "an exact depth" if kind == "depth" else f"an images={images!r} camera"
        fix = "" if kind == "depth" else "import with images='encoded' (null there), or "
        raise SchemaMismatch(
            f"{at}: topic {d.spec.topic} ({d.msgtype}) is latched and its one message comes "
            f"after {before} of the episode's {len(picked)} moments: {what} column cannot hold "
            f"nulls before it; {fix}leave the topic out, or publish it before the clock starts"
        )
    if kind == "depth":
        return np.stack(picked)
    if kind == "image":
        nbytes = sum(len(b) for b in picked if b is not None)
        if images == "encoded":  # kept as they are, but each must be an image
            for b in {id(b): b for b in picked if b is not None}.values():
                image_header(b, f"{at} ({d.spec.topic}, a CompressedImage)")
            if report is not None:
                report.camera(name).add(nbytes, None, None)
            return picked
        frames = _decoded(picked, at, limit)
        return camera_value(frames, images, float(fps), episode, name, report, nbytes)
    if before:  # raw pixels, images="encoded": PNG, null before the message
        have = [v for v in picked if v is not None]
        if report is not None:
            report.camera(name).add(sum(v.nbytes for v in have), None, None)
        return [None if v is None else png_bytes(v) for v in picked]
    return camera_value(np.stack(picked), images, float(fps), episode, name, report)


def _check_size(picked: list[Any], where: str, name: str, limit: int | None) -> None:
    """A column whose moments would hold more than ``limit`` bytes is refused before it is
    made: a message is held at every moment until the next, so one large message (a raw
    image, a long array) under a fast clock asks for moments x its size."""
    if limit is None:
        return
    need = sum(v.nbytes if isinstance(v, np.ndarray) else len(v) if isinstance(v, bytes)
               else 8 for v in picked)  # fmt: skip
    if need > limit:
        raise UnsafeInput(
            f"{where}, column {name!r}: its {len(picked)} moments hold {need:,} bytes, over "
            f"max_episode_bytes ({limit:,}; a message held at many moments: check fps, or "
            "raise max_episode_bytes)"
        )


def _decoded(picked: list[bytes], at: str, limit: int | None) -> np.ndarray:
    """The moments' frames of encoded images, each message decoded once (a held one is
    picked at many moments). Their size is known from the images' headers before any is
    decoded: past ``limit`` (a few KB of PNG can state 180 M pixels, and each moment holds
    one) an error, before the memory is taken."""
    heads = {id(b): image_header(b, at) for b in picked}
    need = sum(heads[id(b)].width * heads[id(b)].height * 3 for b in picked)
    if limit is not None and need > limit:
        raise UnsafeInput(
            f"{at}: its {len(picked)} moments' images decode to {need:,} bytes, over "
            f"max_episode_bytes ({limit:,}; images that inflate past it, or raise it)"
        )
    frames: dict[int, np.ndarray] = {}
    for b in picked:
        if id(b) not in frames:
            frames[id(b)] = encoded_image(b, "decoded", at)
    return np.stack([frames[id(b)] for b in picked])


def _with_nulls(items: list[Any]) -> Any:
    """Values with ``None`` before a latched topic's message, as an Arrow array."""
    sample = next(v for v in items if v is not None)
    if isinstance(sample, np.ndarray):
        return pa.array([None if v is None else v.tolist() for v in items])
    return pa.array(items)


def _report(
    d: TopicData,
    episode: str,
    times: np.ndarray,
    picks: Picks,
    latched: bool,
    period: float,
    where: str,
) -> dict[str, Any]:
    gaps = np.diff(times) / NS
    rate = (
        (times.size - 1) / ((times[-1] - times[0]) / NS)
        if times.size > 1 and times[-1] > times[0]
        else None
    )
    row = {
        "episode": episode,
        "topic": d.spec.topic,
        "column": d.spec.column,
        "type": d.msgtype,
        "messages": len(d.times),
        "latched": latched,
        "mean_rate_hz": None if rate is None else float(rate),
        "largest_gap_s": float(gaps.max()) if gaps.size else None,
        **usage(picks.index, picks.upper, int(times.size)),
    }
    row["never_used"] += len(d.times) - int(times.size)  # lost to a later one of the same time
    if d.conv is not None and d.conv.joints is not None:
        row["joints"] = list(d.conv.joints)  # the order of the values in each JointState column
    if gaps.size and gaps.max() * NS > GAP_WARNING_PERIODS * period:
        log.warning(
            "%s: topic %s has a gap of %.3f s, over %d clock periods",
            where,
            d.spec.topic,
            gaps.max(),
            GAP_WARNING_PERIODS,
        )
    return row

"""The frame size each ``td.Video`` output of a run delivers, checked before step 0.

A batch stacks every sample's frames of one output name (a column, or what ``rename=``
makes of it) in one tensor, so without ``size=(H, W)`` every episode a run's anchors reach
must decode to one size, in every component that fills that name. A video column's size
is what its writes recorded per episode (:mod:`treadle.table.frame_sizes`: no read); a
table written before treadle recorded them has its index read instead (each row's
``width``/``height``): the first row of each episode its anchors reach, one ``take`` a
block of episodes, and the fast path ``recorded video sizes`` says it is off. An image column's
sizes are what its writes recorded (:mod:`treadle.table.image_sizes`; one size per table,
else :mod:`treadle.plan.image_columns` already refused it). Two sizes are a
:class:`~treadle.errors.PlanError` naming both, with a table and episode of each; before,
the loader stopped at the first step that drew both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle import fastpaths
from treadle.errors import PlanError
from treadle.plan.windows import Video
from treadle.table.frame_sizes import parse_key, recorded_frame_sizes
from treadle.table.image_sizes import recorded_images

if TYPE_CHECKING:
    from treadle.plan.component import Component
    from treadle.table.table import Table

#: (height, width) -> (component number, table name, episode name or "size=")
Seen = dict[tuple[int, int], tuple[int, str, str]]


def check_video_sizes(
    components: Sequence[Component],
    tables: Sequence[Table],
    episodes: Sequence[Any],
    anchors: Sequence[Any],
) -> None:
    """:class:`PlanError` when an output name of ``td.Video`` frames would stack two sizes
    (``tables``, ``episodes``, ``anchors``: each component's pinned table, its episode
    index and its anchor runs)."""
    seen: dict[str, Seen] = {}
    for i, comp in enumerate(components):
        if comp.windows is None:
            continue
        rename = dict(comp.rename or ())
        table = tables[i]
        names = getattr(getattr(table, "schema", None), "names", ())
        for col, spec in comp.windows.items():
            if not isinstance(spec, Video):
                continue
            out = seen.setdefault(rename.get(col, col), {})
            if spec.size is not None or col not in names:  # optional: zeros
                if spec.size is not None:
                    out.setdefault(tuple(spec.size), (i, table.name, "size="))
                continue
            for hw, episode in _sizes(table, col, episodes[i], anchors[i]):
                out.setdefault(hw, (i, table.name, episode))
    for name, sizes in seen.items():
        if len(sizes) > 1:
            (a, (i, ta, ea)), (b, (j, tb, eb)) = list(sizes.items())[:2]
            raise PlanError(
                f"td.Video output {name!r} would stack frames of two sizes: {_hw(a, ea)} "
                f"(component {i}, table {ta!r}{_ep(ea)}) and {_hw(b, eb)} (component {j}, "
                f"table {tb!r}{_ep(eb)}); give the td.Video spec(s) a size=(H, W) to resize "
                "them to one"
            )


def check_scan_sizes(
    table: Table, columns: Sequence[str], rows: np.ndarray, sized: Sequence[str], label: str
) -> None:
    """:class:`PlanError` when a scan's rows (sorted row ids) of one of the video
    ``columns`` not in ``sized`` decode to two sizes (a batch stacks one frame per row)."""
    rows = np.asarray(rows, np.int64)
    video = [c for c in columns if c in table.video_columns and c not in sized]
    if not len(rows) or not video or getattr(table, "dataset", None) is None:
        return
    if not getattr(table, "is_time_indexed", True):
        return  # no episodes to name: the batch that meets two sizes says so
    episodes = table.episodes()
    for col in video:
        found = _sizes(table, col, episodes, (rows,))
        if len(found) > 1:
            (a, ea), (b, eb) = found[:2]
            raise PlanError(
                f"{label}: video column {col!r} holds frames of two sizes in the rows it "
                f"reads: {_hw(a, ea)} (episode {ea!r}) and {_hw(b, eb)} (episode {eb!r}), "
                "and a batch stacks one frame a row; give ScanDataset size=(H, W) (or "
                f"size={{{col!r}: (H, W)}}) to resize them to one, or scan the episodes of "
                "one size (scan_request(columns, filter=...))"
            )


def _hw(hw: tuple[int, int], episode: str) -> str:
    return f"{hw[0]}x{hw[1]} (HxW{', its size=' if episode == 'size=' else ''})"


def _ep(episode: str) -> str:
    return "" if episode == "size=" else f", episode {episode!r}"


def _sizes(table: Table, col: str, episodes: Any, runs: Any) -> list[tuple[tuple[int, int], str]]:
    """Each distinct (height, width) of ``col`` in the episodes ``runs`` reach, with the
    first such episode's name: from what the writes recorded
    (:mod:`treadle.table.frame_sizes`), or from the index where they recorded nothing."""
    if col not in table.video_columns:
        rec = recorded_images(table.schema).get(col) or {}
        return [((int(h), int(w)), str(e)) for w, h, e in (rec.get("sizes") or [])[:1]]
    dataset = getattr(table, "dataset", None)
    if dataset is None:  # a stand-in without data (the planner's tests)
        return []
    starts = np.asarray(episodes.starts, dtype=np.int64)
    begin = np.asarray(runs[0], dtype=np.int64)
    reached = np.unique(np.searchsorted(starts, begin, side="right") - 1)
    entry = recorded_frame_sizes(table.schema).get(col)
    if entry is None:
        fastpaths.off(
            "recorded video sizes",
            f"table {table.name!r}, column {col!r} was written before treadle recorded "
            "each episode's frame size",
        )
        found: dict[tuple[int, int], int] = {}
    else:
        found, reached = _from_record(entry, episodes, reached)
    if len(reached):
        for hw, e in _read_sizes(table, dataset, col, starts, reached).items():
            found.setdefault(hw, e)
    ordered = sorted(found.items(), key=lambda kv: kv[1])  # in episode order, as first met
    return [(hw, str(episodes.names[e])) for hw, e in ordered]


def _from_record(
    entry: dict[str, Any], episodes: Any, reached: np.ndarray
) -> tuple[dict[tuple[int, int], int], np.ndarray]:
    """The sizes the record says the ``reached`` episodes hold (``{(h, w): first
    episode}``), and the reached episodes it cannot tell (to read from the index): none,
    unless two keys' holders are not all listed (or a column of over 16 sizes)."""
    if entry.get("many"):
        return {}, reached
    held, more = entry.get("held") or {}, set(entry.get("more") or ())
    found: dict[tuple[int, int], int] = {}
    told = np.zeros(len(reached), bool)
    names = episodes.names.array
    for key, listed in held.items():
        if key in more or not listed:
            continue
        hit = pc.is_in(names, value_set=pa.array(listed, pa.string())).to_numpy(
            zero_copy_only=False
        )[reached]
        told |= hit
        hw = parse_key(key)
        if hit.any() and hw is not None:
            found[hw] = int(reached[np.argmax(hit)])
    rest = reached[~told]
    if len(rest) and len(more) == 1:  # every other episode holds the one key left
        hw = parse_key(next(iter(more)))
        if hw is not None:
            found[hw] = int(rest[0])
        rest = rest[:0]
    return found, rest


def _read_sizes(
    table: Table, dataset: Any, col: str, starts: np.ndarray, reached: np.ndarray
) -> dict[tuple[int, int], int]:
    """``{(h, w): first episode}`` of the ``reached`` episodes, read from the index: the
    first row of each (one ``take`` a block of episodes)."""
    rows = starts[reached]
    # only the two sizes, a block of rows at a time: a million episodes' whole index rows
    # (stream names, codecs) at once would not keep a plan's memory flat
    columns = [f"{col}.width", f"{col}.height"] if "." not in col and "`" not in col else [col]
    first: dict[tuple[int, int], int] = {}
    for lo in range(0, len(rows), _BLOCK):
        part = rows[lo : lo + _BLOCK]
        try:  # not table.take: a purged episode's rows are null, and raise there
            index = dataset.take(part.tolist(), columns=columns).column(col).combine_chunks()
        except (OSError, pa.ArrowException) as e:
            raise table.read_error(e, f"reading the frame sizes of {col!r} in {table!r}") from None
        hw = np.stack([_field(index, "height"), _field(index, "width")], axis=1)
        valid = (hw >= 0).all(axis=1)
        pairs, at = np.unique(hw[valid], axis=0, return_index=True)
        order = np.argsort(at)  # in episode order, as first met
        for pair, i in zip(pairs[order].tolist(), np.flatnonzero(valid)[at[order]].tolist()):
            first.setdefault((int(pair[0]), int(pair[1])), int(reached[lo + i]))
    return first


_BLOCK = 1 << 16


def _field(index: pa.Array, name: str) -> np.ndarray:
    """Field ``name`` of a struct array as int64, -1 where the row (or the field) is null."""
    return (
        pc.struct_field(index, name).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    )

"""A new column's values, one per moment, from what a user labels: per moment, per
episode, or spans of an episode in seconds (or frames).

Every check runs before anything is written: an episode the table does not have, a
per-moment array of the wrong length, a per-episode mapping that misses episodes
(unless a default is given), spans that overlap or lie outside their episode, seconds
on a table without an fps. A frame ``f`` is in the span ``[start, end)`` when
``start <= f / fps < end``, computed exactly: the seconds and the fps are taken as the
decimal fractions their shortest text gives (``0.1`` is 1/10, ``29.97`` is 2997/100).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import NotFound, SchemaMismatch
from treadle.table.defaults import NO_DEFAULT
from treadle.table.episodes import EpisodeIndex
from treadle.table.tensors import column_from_values


def _column(name: str, values: Any, rows: int, where: str) -> tuple[pa.Field, pa.Array]:
    """:func:`column_from_values`, its error naming the table (``where``)."""
    try:
        return column_from_values(name, values, rows)
    except SchemaMismatch as e:
        why = str(e).removeprefix(f"column {name!r}: ")
        raise SchemaMismatch(f"{where}: {why}; nothing was written") from None


def _positions(index: EpisodeIndex, names: Sequence[str], where: str) -> dict[str, int]:
    """Each name's episode position; :class:`NotFound` for one the table lacks."""
    at = {n: i for i, n in enumerate(index.names)}
    for n in names:
        if n not in at:
            raise NotFound(f"{where}: the table has no episode {n!r}; nothing was written")
    return at


def per_episode(
    name: str, index: EpisodeIndex, values: Mapping[str, Any], default: Any, where: str
) -> tuple[pa.Field, pa.Array]:
    """A column holding ``values[episode]`` at each of the episode's moments."""
    at = _positions(index, list(values), where)
    missing = [n for n in index.names if n not in values]
    if missing and default is NO_DEFAULT:
        raise SchemaMismatch(
            f"{where}: no value for {len(missing)} episode(s), e.g. {missing[0]!r}; give "
            "default= for them; nothing was written"
        )
    per = [default] * len(index.names) if missing else [None] * len(index.names)
    for n, v in values.items():
        per[at[n]] = v
    field, arr = _column(name, per, len(per), where)
    rows = np.repeat(np.arange(len(per), dtype=np.int64), np.asarray(index.lengths, np.int64))
    return field, arr.take(pa.array(rows))


def per_moment(name: str, values: Any, rows: int, where: str) -> tuple[pa.Field, pa.Array]:
    """A column of one value per moment, in table order."""
    try:
        if isinstance(values, (str, bytes)):  # else stored one character per moment
            raise TypeError
        n = len(values)
    except TypeError:
        raise SchemaMismatch(
            f"{where}: give one value per moment (an array of {rows}), a mapping of episode "
            f"names to values, or fn=; got {type(values).__name__}"
        ) from None
    if n != rows:
        grew = " (if rows were appended since the values were made, make them again)"
        raise SchemaMismatch(
            f"{where}: {n} values for {rows} moments (one value per moment, in table "
            f"order){grew if n < rows else ''}; nothing was written"
        )
    return _column(name, values, rows, where)


def exact(x: Any, what: str, where: str) -> Fraction:
    """``x`` as the fraction its shortest decimal text gives."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, Fraction, np.number)):
        raise SchemaMismatch(f"{where}: {what} {x!r} is not a number")
    if isinstance(x, Fraction):
        return x
    f = float(x)
    if not np.isfinite(f):
        raise SchemaMismatch(f"{where}: {what} {x!r} is not finite")
    return Fraction(int(x)) if isinstance(x, (int, np.integer)) else Fraction(repr(f))


def _frame_range(span: Any, fps: Fraction | None, length: int, where: str) -> tuple[int, int]:
    """The frames ``[first, stop)`` a span covers, checked to lie in the episode."""
    if not isinstance(span, (tuple, list)) or len(span) != 3:
        raise SchemaMismatch(f"{where}: a span is (start, end, value), got {span!r}")
    start, end = exact(span[0], "start", where), exact(span[1], "end", where)
    if not start < end:
        raise SchemaMismatch(f"{where}: span {span[:2]!r} is empty (start must be < end)")
    if fps is None:  # frames: start <= f < end
        first, stop, limit = _ceil(start), _ceil(end), Fraction(length)
    else:  # seconds: start <= f / fps < end  <=>  start * fps <= f < end * fps
        first, stop, limit = _ceil(start * fps), _ceil(end * fps), Fraction(length) / fps
    if start < 0 or end > limit:
        unit = "frames" if fps is None else "seconds"
        raise SchemaMismatch(
            f"{where}: span {tuple(span[:2])!r} lies outside the episode (0 to {float(limit):g} "
            f"{unit}); nothing was written"
        )
    return first, stop


def _ceil(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def spans(
    name: str,
    index: EpisodeIndex,
    labels: Mapping[str, Sequence[Any]],
    fps: float | None,
    frames: bool,
    default: Any,
    where: str,
) -> tuple[pa.Field, pa.Array]:
    """A column holding each span's value at the moments it covers, ``default`` (or
    null) elsewhere. Spans of one episode must not overlap."""
    if not frames and fps is None:
        raise SchemaMismatch(
            f"{where}: the table has no fps, so spans in seconds cannot be placed; give frame "
            "spans with frames=True; nothing was written"
        )
    rate = None if frames else exact(fps, "fps", where)
    at = _positions(index, list(labels), where)
    starts = np.asarray(index.starts, np.int64)
    lengths = np.asarray(index.lengths, np.int64)
    values: list[Any] = [None if default is NO_DEFAULT else default] * int(lengths.sum())
    for ep, ep_spans in labels.items():
        e = at[ep]
        here = f"{where}, episode {ep!r}"
        ranges = sorted(
            (_frame_range(s, rate, int(lengths[e]), here) + (s,) for s in ep_spans),
            key=lambda r: r[0],
        )
        for (_, stop, s1), (first, _, s2) in zip(ranges, ranges[1:], strict=False):
            if first < stop:
                raise SchemaMismatch(f"{here}: spans {s1!r} and {s2!r} overlap")
        for first, stop, s in ranges:
            base = int(starts[e])
            values[base + first : base + stop] = [s[2]] * (stop - first)
    return _column(name, values, len(values), where)

"""A table's frame rate: set by its first write that names one, never changed after.

Kept in the table's schema metadata (``treadle:fps``), so it travels with every Lance
version. ``append_episode(..., fps=30)``, a ``VideoFrames``/``VideoFile``'s rate and an
importer's source fps all name one; a later write with another rate is refused.
"""

from __future__ import annotations

import math

import pyarrow as pa

from treadle.errors import SchemaMismatch

FPS_KEY = b"treadle:fps"
_REL_TOLERANCE = 1e-9  # the same rate written as 30 and 30.0, or through a float round trip


def schema_fps(schema: pa.Schema | None) -> float | None:
    """The fps a schema records, or None."""
    raw = (schema.metadata or {}).get(FPS_KEY) if schema is not None else None
    return None if raw is None else float(raw)


def check_rate(fps: object, where: str) -> float:
    """A positive, finite frame rate as a float; :class:`SchemaMismatch` naming ``where``."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)):
        raise SchemaMismatch(f"{where}: fps must be a number, got {fps!r}")
    rate = float(fps)
    if not math.isfinite(rate) or rate <= 0:
        raise SchemaMismatch(f"{where}: fps must be positive and finite, got {fps!r}")
    return rate


def same_rate(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOLERANCE)


def with_fps(schema: pa.Schema, fps: float, where: str) -> pa.Schema:
    """``schema`` recording ``fps``; :class:`SchemaMismatch` when it records another one."""
    have = schema_fps(schema)
    if have is not None:
        if not same_rate(have, fps):
            raise SchemaMismatch(
                f"{where} has fps {have:g}; this write gives fps {fps:g} (a table has one "
                "frame rate, set by its first write that names one)"
            )
        return schema
    meta = dict(schema.metadata or {})
    meta[FPS_KEY] = repr(float(fps)).encode()
    return schema.with_metadata(meta)


def episode_fps(fps: object, video_rates: dict[str, float], where: str) -> float | None:
    """The one rate an episode's write names: ``fps`` and every video column's rate must
    agree (else :class:`SchemaMismatch` naming the column); None when none names one."""
    rate = None if fps is None else check_rate(fps, where)
    for col, r in video_rates.items():
        if rate is None:
            rate = float(r)
        elif not same_rate(rate, float(r)):
            raise SchemaMismatch(
                f"{where}: video column {col!r} is {float(r):g} fps, the episode's fps is {rate:g}"
            )
    return rate


def merge_fps(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the fps ``other`` records too (rows written apart that meet: a
    rebased transaction, a merge, an import's processes); :class:`SchemaMismatch` when
    both record different ones (the table would claim one rate for rows of another)."""
    mine, theirs = schema_fps(schema), schema_fps(other)
    if theirs is None or (mine is not None and same_rate(mine, theirs)):
        return schema
    if mine is not None:
        raise SchemaMismatch(
            f"rows written apart name different frame rates, {mine:g} and {theirs:g} fps (a "
            "table has one frame rate, set by its first write that names one); nothing was "
            "committed"
        )
    return with_fps(schema, theirs, "")

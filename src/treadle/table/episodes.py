"""Episodes of a time-indexed table: where each one's rows are, and the rules they follow.

Rows of one episode are contiguous, carry the episode's name in ``episode`` (a string)
and run ``frame`` 0, 1, ..., len-1. An episode ends where the name changes *or* the frame
falls back to 0; names are unique in a table. The same checks guard writes (as
:class:`~treadle.errors.SchemaMismatch`) and the episode index of a stored table (as
:class:`~treadle.errors.CorruptData`), so a table that breaks them is never read with
made-up boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle.errors import TreadleError

EPISODE = "episode"
FRAME = "frame"


@dataclass(frozen=True)
class EpisodeIndex:
    """Where each episode's rows are: ``starts[e] .. starts[e] + lengths[e] - 1``."""

    names: list[str]
    starts: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.names)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _first_null(arr: pa.Array) -> int:
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def episode_runs(
    episodes: pa.Array | pa.ChunkedArray,
    frames: pa.Array | pa.ChunkedArray,
    where: str,
    error: type[TreadleError],
    first_frame: int = 0,
) -> EpisodeIndex:
    """The episodes of these ``episode``/``frame`` columns; ``error`` (naming ``where``, the
    column and the episode) when they break a rule: wrong type, nulls, a negative frame,
    frames that do not run 0..len-1, or one name used for two episodes.

    ``first_frame``: the frame the first row has (a slice of a table that starts inside
    an episode, e.g. one Lance fragment); its first run is then that episode's tail."""
    if isinstance(episodes, pa.ChunkedArray):
        episodes = episodes.combine_chunks()
    if isinstance(frames, pa.ChunkedArray):
        frames = frames.combine_chunks()
    checks = (
        (EPISODE, episodes, _is_string(episodes.type), "a string"),
        (FRAME, frames, pa.types.is_integer(frames.type), "an integer"),
    )
    for col, arr, ok, what in checks:
        if not ok:
            raise error(f"{where}: column {col!r} must be {what} column, it is {arr.type}")
        if arr.null_count:
            raise error(f"{where}: column {col!r} is null at row {_first_null(arr)}")
    n = len(frames)
    if n == 0:
        return EpisodeIndex([], np.zeros(0, np.int64), np.zeros(0, np.int64))
    f = frames.to_numpy(zero_copy_only=False).astype(np.int64)
    if np.any(f < 0):
        r = int(np.flatnonzero(f < 0)[0])
        raise error(f"{where}: column {FRAME!r} is negative ({f[r]}) at row {r}")
    renamed = pc.not_equal(episodes[1:], episodes[:-1]).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.concatenate([[True], renamed | (f[1:] == 0)])).astype(np.int64)
    lengths = np.diff(np.append(starts, n)).astype(np.int64)
    names = [str(x) for x in episodes.take(pa.array(starts)).to_pylist()]
    run = np.repeat(np.arange(len(starts)), lengths)
    expected = np.arange(n, dtype=np.int64) - starts[run]
    expected[: lengths[0]] += first_frame
    bad = np.flatnonzero(f != expected)
    if bad.size:
        r = int(bad[0])
        raise error(
            f"{where}: column {FRAME!r} of episode {names[run[r]]!r} must run 0, 1, ..., len-1: "
            f"row {r} has frame {f[r]}, expected {expected[r]}"
        )
    first: dict[str, int] = {}
    for name, start in zip(names, starts):
        if name in first:
            raise error(
                f"{where}: episode {name!r} (column {EPISODE!r}) is used for two episodes, at "
                f"rows {first[name]} and {int(start)}; episode names must be unique in a table"
            )
        first[name] = int(start)
    return EpisodeIndex(names, starts, lengths)

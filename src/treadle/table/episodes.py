"""Episodes of a time-indexed table: where each one's rows are, and the rules they follow.

Rows of one episode are contiguous, carry the episode's name in ``episode`` (a string)
and run ``frame`` 0, 1, ..., len-1. An episode ends where the name changes *or* the frame
falls back to 0; names are unique in a table. The same checks guard writes (as
:class:`~treadle.errors.SchemaMismatch`) and the episode index of a stored table (as
:class:`~treadle.errors.CorruptData`), so a table that breaks them is never read with
made-up boundaries.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treadle.errors import CorruptData, TreadleError

EPISODE = "episode"
FRAME = "frame"


class EpisodeNames(Sequence[str]):
    """The episodes' names, in order, as one Arrow string array: ~14 bytes per episode
    where a list of Python strings took ~70 (issue 33: a 1M-episode table's index is held
    by the training process and every worker). Reads like a list of ``str``: ``len``,
    ``names[e]``, ``names[a:b]`` (a list), iteration, ``in``, ``index``, ``==`` a list."""

    __slots__ = ("_array",)

    def __init__(self, names: Iterable[str] | pa.Array | pa.ChunkedArray):
        if isinstance(names, EpisodeNames):
            arr = names.array
        elif isinstance(names, pa.ChunkedArray):
            arr = names.combine_chunks()
        elif isinstance(names, pa.Array):
            arr = names
        else:
            arr = _string_array(names if isinstance(names, list) else list(names))
        if arr.type != pa.string():
            arr = arr.cast(pa.string())
        self._array = arr

    @property
    def array(self) -> pa.Array:
        """The names as one Arrow string array."""
        return self._array

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return self.array.to_pylist()[i] if i.step else self._slice(i)
        n = len(self.array)
        k = operator.index(i)
        if not -n <= k < n:
            raise IndexError(f"episode {k} of {n}")
        return self.array[k].as_py()

    def _slice(self, i: slice) -> list[str]:
        start, stop, _ = i.indices(len(self.array))
        return self.array.slice(start, max(0, stop - start)).to_pylist()

    def __iter__(self) -> Iterator[str]:
        for at in range(0, len(self.array), 1 << 16):  # a bounded list at a time
            yield from self.array.slice(at, 1 << 16).to_pylist()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._find(name) >= 0

    def index(self, name: Any, start: int = 0, stop: int | None = None) -> int:
        k = self._find(name) if isinstance(name, str) and not start and stop is None else -1
        if k < 0:
            k = list(self).index(name, start, len(self) if stop is None else stop)
        return k

    def _find(self, name: str) -> int:
        return int(pc.index(self.array, pa.scalar(name, pa.string())).as_py())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EpisodeNames):
            return self.array.equals(other.array)
        if isinstance(other, list | tuple):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (a list's equality: not hashable)

    def __reduce__(self) -> tuple[Any, tuple[pa.Array]]:
        return EpisodeNames, (self.array,)  # lazy names are read to be pickled

    def __repr__(self) -> str:
        head = ", ".join(repr(n) for n in self[:5])
        return f"EpisodeNames([{head}{', ...' if len(self) > 5 else ''}], {len(self)} episodes)"


def _string_array(names: list[str]) -> pa.Array:
    """``names`` as an Arrow string array whose buffers are exactly its bytes, held by
    numpy and ``bytes`` (an Arrow builder over-allocates, and its pool keeps freed pages:
    +38 MB resident for 13 MB of names at 1M episodes)."""
    if not all(isinstance(n, str) for n in names):
        raise TypeError("episode names must be strings")
    joined = "".join(names)
    if joined.isascii():
        data, lens = joined.encode("ascii"), np.fromiter(map(len, names), np.int64, len(names))
    else:
        parts = [n.encode() for n in names]
        data, lens = b"".join(parts), np.fromiter(map(len, parts), np.int64, len(parts))
    del joined
    if len(data) >= 2**31:
        raise TreadleError(f"{len(names)} episode names of {len(data)} bytes: over 2 GiB")
    offsets = np.zeros(len(names) + 1, np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(names), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


class LazyEpisodeNames(EpisodeNames):
    """Names read on first use (``len`` needs none): a plan and a reader need only where
    episodes are, so a training process or worker holds no names unless it asks (a plan
    with ``episodes=``, ``plan.exclude``, an error naming an episode)."""

    __slots__ = ("_n", "_load", "_lock", "_where")

    def __init__(self, n: int, load: Callable[[], EpisodeNames], where: str = "episode names"):
        self._array, self._n, self._load, self._lock = None, int(n), load, threading.Lock()
        self._where = where

    @property
    def array(self) -> pa.Array:
        with self._lock:
            if self._array is None:
                names = self._load().array
                if len(names) != self._n:
                    raise CorruptData(
                        f"{self._where}: {len(names)} episode names for {self._n} episodes; "
                        "delete its stored episode index to have it recomputed"
                    )
                self._array = names
        return self._array

    def __len__(self) -> int:
        return self._n


@dataclass(frozen=True)
class EpisodeIndex:
    """Where each episode's rows are: ``starts[e] .. starts[e] + lengths[e] - 1``; ``names``
    is an :class:`EpisodeNames` (a list of names is taken and converted)."""

    names: EpisodeNames
    starts: np.ndarray
    lengths: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.names, EpisodeNames):
            object.__setattr__(self, "names", EpisodeNames(self.names))

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
    names = EpisodeNames(episodes.take(pa.array(starts)))
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
    twice = first_repeat(names)
    if twice is not None:
        a, b = twice
        raise error(
            f"{where}: episode {names[b]!r} (column {EPISODE!r}) is used for two episodes, at "
            f"rows {int(starts[a])} and {int(starts[b])}; episode names must be unique in a table"
        )
    return EpisodeIndex(names, starts, lengths)


def first_repeat(names: EpisodeNames) -> tuple[int, int] | None:
    """``(i, j)``, ``i < j``, of the earliest ``j`` whose name an episode ``i`` had, or None
    when every name is unique. Checked on the sorted names (1M names: 0.2 s, ~15 MB; a
    hash count took 0.65 s and ~100 MB, a set of Python strings ~100 MB)."""
    arr = names.array
    if len(arr) < 2:
        return None
    order = pc.sort_indices(arr)
    ordered = arr.take(order)
    del order
    if not pc.any(pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))).as_py():
        return None
    first: dict[str, int] = {}  # a repeat is an error: the slow exact search is fine
    for j, name in enumerate(names):
        if name in first:
            return first[name], j
        first[name] = j
    raise AssertionError("sorted names repeat, but no name does")  # pragma: no cover

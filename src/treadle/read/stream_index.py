"""The stream index of an episode's video column, looked up by a reader: only the episodes
it reads are held, in a bounded LRU cache.

A reader used to load the whole video column of every table it read (every row's
struct, ~200 bytes per frame, in every reader process and every worker). Now each
batch loads the episodes it needs that are not cached, with one Lance ``take`` per
table and column, and keeps them as compact numpy arrays (:func:`treadle.video.column_layout.index_from_arrow`,
~25-33 bytes per frame, owning their memory: no view keeps the take's Arrow buffers
alive). At most ``max_frames`` frames of index, in at most ``max_episodes`` episodes, stay
cached; the least recently used episodes go first, so resident video index is bounded
whatever the table's size and however short its episodes.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from treadle.table.table import Table

DEFAULT_MAX_FRAMES = 1 << 18  # ~8 MB of index: a few batches of long episodes


def _arrays(index: Any) -> list[np.ndarray]:
    out = [index.offset, index.size, index.key, index.pts, index.decode]
    out += [a for a in (index.crc,) if a is not None]
    # cached derived arrays (functools.cached_property keeps them in __dict__)
    out += [index.__dict__[k] for k in ("display_of_decode", "key_decode_positions")
            if k in index.__dict__]  # fmt: skip
    return out


def index_nbytes(index: Any) -> int:
    """Bytes one stream index holds: its arrays (data and headers) and the object."""
    return sys.getsizeof(index) + sum(sys.getsizeof(a) + _data(a) for a in _arrays(index))


def _data(a: np.ndarray) -> int:
    # getsizeof counts an owning array's data; a view's data belongs to its base
    return 0 if a.base is None else a.nbytes


class StreamIndexes:
    """``(table, version, column, episode) -> (stream key, StreamIndex)``, bounded by the
    frames it holds and by episodes (default ``max_frames // 32``: 8192). Thread-safe."""

    def __init__(self, max_frames: int = DEFAULT_MAX_FRAMES, max_episodes: int | None = None):
        self.max_frames = int(max_frames)
        # an episode's index also costs ~0.7 KB whatever its length (its object and array
        # headers): 2**18 frames of 4-frame episodes held ~65k of them, ~60 MB (issue 33)
        self.max_episodes = max(1, self.max_frames // 32 if max_episodes is None else max_episodes)
        self._items: OrderedDict[tuple[str, int, str, int], tuple[str, Any]] = OrderedDict()
        self._frames = 0
        self._lock = threading.Lock()
        # one load at a time: two batches read ahead at once must not both read an episode
        self._loading = threading.Lock()

    def lookup(self, table: Table, column: str, episode: int) -> tuple[str, Any]:
        """The stream key and index of ``column`` in episode number ``episode`` of ``table``."""
        k = (table.name, table.version, column, int(episode))
        with self._lock:
            hit = self._items.get(k)
            if hit is not None:
                self._items.move_to_end(k)
                return hit
        return self.load(table, column, [episode])[int(episode)]

    def load(self, table: Table, column: str, episodes: Any) -> dict[int, tuple[str, Any]]:
        """Make sure these episodes are cached (one take for the ones that are not);
        returns them."""
        with self._loading:
            return self._load(table, column, episodes)

    def _load(self, table: Table, column: str, episodes: Any) -> dict[int, tuple[str, Any]]:
        from treadle.video import index_from_arrow

        wanted = sorted({int(e) for e in np.asarray(episodes).reshape(-1)})
        base = (table.name, table.version, column)
        out: dict[int, tuple[str, Any]] = {}
        with self._lock:
            for e in wanted:
                hit = self._items.get((*base, e))
                if hit is not None:
                    self._items.move_to_end((*base, e))
                    out[e] = hit
        todo = [e for e in wanted if e not in out]
        if not todo:
            return out
        eps = table.episodes()
        starts, lengths = eps.starts[todo], eps.lengths[todo]
        rows = np.concatenate(
            [np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, lengths)]
        )
        col = table.take(rows, [column]).column(column).combine_chunks()
        at = 0
        for e, n in zip(todo, lengths.tolist()):
            out[e] = index_from_arrow(col.slice(at, n))
            at += n
        del col
        with self._lock:
            for e in todo:
                self._put((*base, e), out[e])
        return out

    def _put(self, k: tuple[str, int, str, int], value: tuple[str, Any]) -> None:
        old = self._items.pop(k, None)
        if old is not None:
            self._frames -= len(old[1])
        self._items[k] = value
        self._frames += len(value[1])
        while len(self._items) > 1 and (
            self._frames > self.max_frames or len(self._items) > self.max_episodes
        ):
            _, (_, gone) = self._items.popitem(last=False)
            self._frames -= len(gone)

    def resident_frames(self) -> int:
        """Frames of stream index held now."""
        return self._frames

    def resident_bytes(self) -> int:
        """Bytes of stream index held now (:func:`index_nbytes` of every cached episode)."""
        with self._lock:
            return sum(index_nbytes(v[1]) for v in self._items.values())

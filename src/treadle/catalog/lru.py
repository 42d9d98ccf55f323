"""A small thread-safe least-recently-used map: per-version handles a long-lived process
keeps (open Lance datasets, episode indexes) without growing with the history."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``size`` entries; the least recently used goes first."""

    def __init__(self, size: int):
        self.size = int(size)
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def setdefault(self, key: K, value: V) -> V:
        """The value already there (a racing opener's), else ``value``, now the newest."""
        with self._lock:
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return value

    def drop(self, which: Callable[[K], bool]) -> None:
        """Remove every entry whose key ``which`` selects."""
        with self._lock:
            for key in [k for k in self._items if which(k)]:
                del self._items[key]

    def __len__(self) -> int:
        return len(self._items)

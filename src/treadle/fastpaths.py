"""Fast paths that say when they are off.

treadle's fastest paths rest on checks made at run time (struct layouts of PyAV's FFmpeg,
Lance's page layout): when a check fails, the path falls back to a slower, equally exact
one. :func:`off` records why, and the first time a path goes off in a process it logs one
warning through the ``treadle`` logger, so that a PyAV or pylance upgrade that costs speed
says so. :func:`treadle.info` reports every path, on or off with its reason.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from treadle.fork_locks import renew_lock_in_child

__all__ = ["PATHS", "Checked", "log", "off", "reasons"]

T = TypeVar("T")

log = logging.getLogger("treadle")
"""treadle's logger: every message treadle logs goes through it (``logging.getLogger("treadle")``)."""

PATHS = {
    "native decode": "video windows decode through PyAV's objects (~20% slower)",
    "compiled window loop": "video windows decode with FFmpeg calls made from Python, the "
    "GIL taken back after each (5-10% slower with 2 decode threads)",
    "direct conversion": "frames convert through PyAV's reformat and are copied (slower)",
    "fixed-width reads": "fixed-width columns are read with a Lance take per batch (slower)",
    "nvdec": "video decodes on the CPU",
    "cached reads": "fixed-width columns on object stores are read with a Lance take per batch "
    "(a request per row)",
    "image reads": "image columns of local tables are read with a Lance take per batch "
    "(~10x the CPU of a copy; Lance-compressed or nullable pages, deletions: compact())",
    "chunk cache": "with lookahead, rows of tables past the object cache are read with a "
    "Lance take per batch (a request per row), video windows with a range request each",
    "recorded video sizes": "plans read the frame size of each episode a run reaches from the "
    "video index (a take per 65,536 episodes: scattered reads on object stores) of tables "
    "written before treadle recorded them",
    "unflushed chunks": "each fetch of the chunk cache is flushed to disk (fdatasync) before "
    "its chunks are marked present (~10% of a fetch's time past the object cache)",
}
"""Each fast path, and what runs instead when it is off."""

_OFF: dict[str, str] = {}
_LOCK = threading.Lock()


renew_lock_in_child(sys.modules[__name__], "_LOCK")


def off(path: str, reason: str) -> None:
    """Record that fast path ``path`` (a key of :data:`PATHS`) is off because of ``reason``.

    The first call for a path in a process logs one warning; later ones only keep the
    first reason."""
    with _LOCK:
        first = path not in _OFF
        if first:
            _OFF[path] = reason
    if first:
        log.warning("treadle: %s is off: %s; %s", path, reason, PATHS[path])


def reasons() -> dict[str, str]:
    """``{path: reason}`` of every fast path that went off in this process so far."""
    with _LOCK:
        return dict(_OFF)


class Checked(Generic[T]):
    """A fast path's object, loaded and checked once per process.

    ``load`` returns the object, or a string saying why the path is off. :meth:`get` is the
    object, or ``None`` where the check failed (recorded with :func:`off`, which logs it
    once); :meth:`why` is the reason (``None`` when loaded). Tests swap a module's instance
    for a fresh one (load again) or for :meth:`fixed` (``Checked.fixed(path, None)``: off).
    """

    def __init__(self, path: str, load: Callable[[], T | str]) -> None:
        if path not in PATHS:
            raise KeyError(f"no fast path {path!r} (known: {', '.join(PATHS)})")
        self.path = path
        self._load = load
        self._done = False
        self._value: T | None = None
        self._why: str | None = None

    @classmethod
    def fixed(cls, path: str, value: T | None, why: str | None = None) -> Checked[T]:
        """One already decided: ``value``, or off (``None``) for ``why``, logged nowhere."""
        got = cls(path, lambda: "never loaded")
        got._done, got._value = True, value
        got._why = why if value is None else None
        return got

    def get(self) -> T | None:
        """The object, loaded on the first call; ``None`` where the path is off."""
        if not self._done:  # two threads may both load: each gets an equal object
            got = self._load()
            if isinstance(got, str):
                self._why = got
                off(self.path, got)
            else:
                self._value = got
            self._done = True
        return self._value

    def why(self) -> str | None:
        """Why the path is off (loading it first), ``None`` when it is on."""
        self.get()
        return self._why

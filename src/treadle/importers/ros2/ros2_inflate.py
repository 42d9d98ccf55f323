"""A bag's compressed chunks, inflated with a cap (rosbags inflates them whole, unbounded).

rosbags decompresses each MCAP chunk (zstd, lz4), each ROS 1 chunk (bz2, lz4) and each
rosbag2 SQLite message (zstd) in one call with no bound on the output: a bag of 100 KB can
ask for any amount of memory before a message is seen (zeros inflate about 30,000:1 with
zstd). While treadle reads a bag (:func:`capped`), those calls go through decompressors that
stop once the output passes the import's ``max_episode_bytes`` (or an MCAP chunk's stated
size): :class:`~treadle.errors.UnsafeInput` naming the bag. A rosbag2 bag in ``file``
compression (each ``.db3``/``.mcap`` zstd-compressed whole) is inflated by rosbags to a
temporary file when opened: that stream stops past :data:`FILE_FACTOR` times
``max_episode_bytes`` (a file holds the topics an import leaves out too), and rosbags then
removes its temporary folder. rosbags' decompressors are module globals: they are swapped
only while some thread reads a bag and put back by the last one out; a thread without a cap
meanwhile gets rosbags' own behaviour through them.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from treadle.errors import UnsafeInput
from treadle.fork_locks import renew_lock_in_child
from treadle.importers._inflate import cap_stream, inflate_streams

#: (where, limit) of the bag being read in this thread, else None
_CAP: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "treadle_bag_cap", default=None
)
#: a file-compressed bag's storage file inflates to at most this times max_episode_bytes
FILE_FACTOR = 4
_lock = threading.Lock()


def _bounded(new: Callable[[], Any], data: bytes, stated: int | None, fmt: str) -> bytes:
    """``data`` inflated by ``new()`` decompressors, refused past the cap or ``stated``."""
    where, limit = _CAP.get()  # type: ignore[misc]
    most = limit if stated is None else min(limit, stated)
    out = inflate_streams(new, bytes(data), most)
    if len(out) > most:
        what = "max_episode_bytes" if most == limit else f"its stated {stated:,} bytes"
        raise UnsafeInput(
            f"{where}: {fmt} inflates past {what} ({most:,} bytes; a decompression "
            "bomb, or raise max_episode_bytes if the bag is real)"
        )
    return out


def _wrap(original: Callable[..., bytes], new: Callable[[], Any], fmt: str) -> Callable[..., Any]:
    def decompress(data: bytes, stated: int | None = None) -> bytes:
        if _CAP.get() is None:
            return original(data) if stated is None else original(data, stated)
        return _bounded(new, data, stated, fmt)

    return decompress


class _Zstd:
    """rosbag2 reader's ``zstd`` module, its ``decompress`` capped (the rest as it is)."""

    def __init__(self, module: Any):
        self._module = module
        self.decompress = _wrap(
            module.decompress, module.ZstdDecompressor, "a zstd-compressed message"
        )

    def open(self, file: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        """``zstd.open``; reading a bag's file (within :func:`capped`), capped."""
        inner = self._module.open(file, mode, *args, **kwargs)
        cap = _CAP.get()
        if cap is None or "r" not in mode:
            return inner
        where, limit = cap
        most = FILE_FACTOR * limit
        name = Path(str(getattr(file, "name", file))).name
        return cap_stream(inner, most, (
            f"{where}: its file {name} inflates past {FILE_FACTOR} x max_episode_bytes "
            f"({most:,} bytes; a decompression bomb, or raise max_episode_bytes if the bag is "
            "real)"))  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


_users = 0  # threads inside capped(): the last one out puts rosbags' own functions back
#: while installed: (table or module, key, rosbags' function, treadle's capped one)
_swapped: list[tuple[Any, str, Any, Any]] = []


def _get(owner: Any, key: str) -> Any:
    return owner[key] if isinstance(owner, dict) else getattr(owner, key)


def _put(owner: Any, key: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[key] = value
    else:
        setattr(owner, key, value)


def _install() -> None:
    """Swap rosbags' decompressors for capped ones: each wraps the function rosbags (or the
    process) has at this moment, so a decompressor swapped in since an earlier import is
    capped too. Called under ``_lock`` by the first thread into :func:`capped`."""
    import bz2

    from lz4.frame import LZ4FrameDecompressor
    from rosbags.rosbag1 import reader as bag1
    from rosbags.rosbag2 import reader as bag2
    from rosbags.rosbag2 import storage_mcap as mcap

    zstd = bag2.zstd
    _swapped.clear()  # (left over if an earlier install failed half way)
    for table, kind, news in (
        (mcap.DECOMPRESSORS, "an MCAP", {"zstd": zstd.ZstdDecompressor}),
        (bag1.decompressors, "a ROS 1", {"bz2": bz2.BZ2Decompressor}),
    ):
        for name, new in {**news, "lz4": LZ4FrameDecompressor}.items():
            _swapped.append(
                (table, name, table[name], _wrap(table[name], new, f"{kind} {name} chunk"))
            )
    _swapped.append((bag2, "zstd", zstd, _Zstd(zstd)))
    for owner, key, _, capped_fn in _swapped:
        _put(owner, key, capped_fn)


def _uninstall() -> None:
    """Put rosbags' functions back (under ``_lock``, by the last thread out of :func:`capped`);
    one that something else replaced in the meantime stays as that left it."""
    for owner, key, original, capped_fn in _swapped:
        if _get(owner, key) is capped_fn:
            _put(owner, key, original)
    _swapped.clear()


@contextlib.contextmanager
def capped(where: str, limit: int) -> Iterator[None]:
    """Within: rosbags inflates at most ``limit`` bytes per chunk (``where`` names the bag).

    rosbags' decompressors are module globals, one per process: they are swapped for capped
    ones only while some thread is inside, and put back by the last one out. A thread outside
    (no cap in its context) meanwhile gets rosbags' own behaviour through them."""
    global _users
    with _lock:
        if _users == 0:
            _install()
        _users += 1
    token = _CAP.set((where, int(limit)))
    try:
        yield
    finally:
        _CAP.reset(token)
        with _lock:
            _users -= 1
            if _users == 0:
                _uninstall()


renew_lock_in_child(sys.modules[__name__], "_lock")

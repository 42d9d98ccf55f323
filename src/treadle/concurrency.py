"""How much treadle does at once, in one place (as Grain's ``ReadOptions``).

Every thread count and look-ahead a module uses when its caller does not give one is a
field of :data:`CONCURRENCY`; a module never spells its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Concurrency:
    """Thread counts and look-ahead (defaults: what the benchmarks settled on)."""

    take_threads: int = 4
    """Row takes in flight at once in a sample reader (this batch's and the next one's)."""
    episode_index_threads: int = 8
    """Stored episode-index objects fetched at once (an object store answers each in ~ms)."""
    cloud_read_ahead: int = 8
    """Batches a sample reader on an object store reads ahead (a local one reads one): a
    request to a cloud store takes tens of ms however small, and one batch of small rows or
    short windows takes a few ms to assemble, so one batch ahead left the loader waiting."""
    lookahead_read_ahead: int = 2
    """Batches a loader's sample reader (workers=0) reads ahead while its ``lookahead`` stage
    fetches the rows and windows into the chunk cache (local reads by then; when the stage
    stops, ``cloud_read_ahead`` again): the stage's window runs ``lookahead`` steps past the
    batch handed out, so each batch the reader holds ahead is a step less to hide a fetch
    behind (issue 48's bench, lookahead 16: 8 batches ahead 7,100-7,200 samples/s, 2 batches
    8,400-8,600)."""
    read_ahead_threads: int = 32
    """Row takes in flight at most when a reader reads many batches ahead."""
    read_ahead_bytes: int = 256 << 20
    """What the batches read ahead may hold at most (row values and compressed window
    bytes, measured on the last batch): fewer batches ahead when one batch holds more."""
    cache_part_bytes: int = 8 << 20
    """Bytes per GET when an object is copied into the local object cache
    (:mod:`treadle.storage.filecache`)."""
    cache_parts_in_flight: int = 8
    """GETs in flight at once while an object is copied into the local object cache."""
    footers_in_flight: int = 16
    """Lance data file footers read at once when a loader's chunk cache first needs rows of
    several data files (:mod:`treadle.read.chunk_rows`)."""
    nvdec_streams: int = 4
    """NVDEC sessions (worker threads, each with its CUDA stream) of a GPU video reader."""
    max_threads: int = 8
    """Parallel work when the caller does not say: one thread per core, at most this."""
    encode_threads: int = 4
    """Slice threads of an H.264 encode (``td.VideoFrames``, a re-encoded ``td.VideoFile``):
    a fixed number, never the core count, since it is the number of slices per frame and
    so part of the bytes (``video/x264.py``); frames too short for it get fewer."""
    max_video_threads: int = 4
    """Decode threads of a loader without worker processes: one per core, at most this
    (PyAV decodes without the GIL); a worker process decodes on one."""

    def default_threads(self) -> int:
        return max(1, min(self.max_threads, os.cpu_count() or 1))

    def video_threads(self, workers: int) -> int:
        return 1 if workers else min(self.max_video_threads, os.cpu_count() or 1)


CONCURRENCY = Concurrency()


def submit(pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(fn, *args)``, or once the interpreter is exiting, ``fn(*args)`` run on
    this thread as a finished future (its result or its exception).

    When the main thread has ended, Python shuts every ``concurrent.futures`` pool down
    before it waits for the non-daemon threads still running, which may run for long (a
    training thread): their pools' ``submit`` raised "cannot schedule new futures after
    shutdown". A pool shut down otherwise (its reader closed) still raises."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError:
        if not _exiting():
            raise
    done: Future[T] = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as e:  # raised where the caller takes the result, as from a pool
        done.set_exception(e)
    return done


def _exiting() -> bool:
    """Whether the interpreter's exit has begun (its pools refuse work)."""
    from concurrent.futures import thread

    return bool(getattr(thread, "_shutdown", False)) or not threading.main_thread().is_alive()

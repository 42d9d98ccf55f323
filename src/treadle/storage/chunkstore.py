"""A node-shared cache of fixed-size chunks of immutable objects, evicted by next use.

The object cache (:mod:`treadle.storage.filecache`) copies whole data files: past its bound a
table is read with a GET per row. This cache holds **chunks** of objects (``chunk_bytes``), so
what is kept follows the plan: every chunk carries the step that next needs it, and room is
made by evicting the one needed farthest ahead (never again: first), Belady's optimal policy
over chunks of one size (:func:`treadle.plan.simcache.belady`, for ``treadle simulate``).

- **Where**: ``<object cache folder>/chunk-slots``. Per object (named by a hash of root URL,
  key and size, then its size and the chunk size: stores of other chunk sizes share the folder
  and its bound), ``<name>.state``: per chunk a state word (absent, fetching or present, and a
  generation that counts evictions), the step that next needs it, the process fetching it (id
  and start time) and its slot. The bytes of every object's chunks of one size are in slots of
  one file (:mod:`~treadle.storage.slotfile`): an evicted chunk's slot is written over by the
  next fetch. Every process of the node maps the same files (ranks of one node never fetch
  a chunk twice). A process keeps
  the objects it reads mapped (one store per process, :func:`chunk_store`); other processes'
  objects are read (a copy of their state words) to make room, and mapped only to evict
  their chunks (at most :data:`MAX_FOREIGN` of those stay mapped between scans).
- **Index**: an object's files exist only while it holds chunks (or until the next scan after
  it was opened or emptied): a scan removes those that hold none, so it visits only objects
  that hold bytes and the folder's files stay bounded (:mod:`~treadle.storage.chunkfolder`).
  The invariant: every present or fetching chunk is in a file the folder lists, because a
  removal marks the object's state words :data:`~treadle.storage.chunkfolder.REMOVED` before
  it unlinks them (under the lock, only where no chunk is present or being fetched), and every
  process re-opens an object so marked before it counts, reserves or reads through it.
- **Bound**: present and fetching chunks never sum to more than ``max_bytes``. Room is made
  under the folder's ``flock`` before a fetch; a chunk is cached only when a cached one is
  needed later than it (else it is fetched for this read and not kept). A chunk whose next use
  is before the store's ``now`` is known to nobody: it goes first.
- **Safe**: a chunk's bytes are written before its state says present, so a reader never
  sees a partial chunk; flushed to disk first only where the machine has no boot id, as a
  folder of another boot is emptied before use (:func:`~treadle.storage.chunkfiles.same_boot`).
  Bytes are written into a slot under the slot's lock, and the chunk marked present under
  the folder's, each only while its words still say this process fetches it
  (:mod:`~treadle.storage.chunkwrite`). An eviction first marks the chunk absent with a new
  generation, then frees its slot (written over in the same reservation, or punched); a
  reader checks the state words before and after it copies bytes out, and uses them only
  when nothing changed. A chunk needed by a step in the window is never evicted for one
  needed later. A fetch of a process that died is reclaimed by the next one that makes room
  or needs the chunk (which fetches it again).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from treadle import fastpaths
from treadle.fork_locks import renew_lock_in_child
from treadle.storage.chunkfiles import (
    DEFAULT_CHUNK_BYTES,
    NO_BOOT_ID,
    NOT_EVICTED,
    chunk_bytes_for,
    dead_fetch,
    fetcher_id,
    same_boot,
    shared_file_system,
)
from treadle.storage.chunkfiles import evict as _evict
from treadle.storage.chunkfolder import (
    ABSENT,
    FETCHING,
    LEGACY_FOLDER,
    NEVER,
    ChunkFolder,
    ObjectFiles,
    SeenObject,
    remove_legacy,
)
from treadle.storage.chunkfolder import STATE_MASK as _STATE_MASK
from treadle.storage.chunkobject import ObjectChunks
from treadle.storage.chunkroom import Room
from treadle.storage.chunkstats import ChunkStats
from treadle.storage.chunkwrite import (
    chunk_views,
    get_ranges,
    give_back,
    mark_present,
    range_requests,
    write_chunks,
)
from treadle.storage.coalesce import coalesced
from treadle.storage.filecache import copy_name
from treadle.storage.fileio import RANGE_LOCKS
from treadle.storage.folderlock import folder_lock

if TYPE_CHECKING:
    from treadle.storage.store import Store

__all__ = ["CHUNK_BYTES", "NEVER", "ChunkStore", "ChunkStats", "ObjectChunks"]

CHUNK_BYTES = DEFAULT_CHUNK_BYTES
MAX_FOREIGN = 128
"""Objects of other processes a store keeps mapped between scans of the folder."""


class ChunkStore:
    """Chunks of immutable objects in ``directory``, at most ``max_bytes`` of them."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int,
                 chunk_bytes: int = CHUNK_BYTES):  # fmt: skip
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stats = ChunkStats()
        self._folder = ChunkFolder(self.directory, self.chunk_bytes, MAX_FOREIGN)
        self._objects = self._folder.objects  # by name: this process's mappings
        self._foreign = self._folder.foreign  # other processes', mapped to evict their chunks
        self._lock = threading.Lock()
        self._folder_lock = folder_lock(self.directory)  # the node's processes', held open
        with self._folder_lock:
            self._flush = not same_boot(self.directory, self._folder.forget)
            self._slots = self._folder.slots(self.chunk_bytes)
        if self._flush:
            fastpaths.off("unflushed chunks", NO_BOOT_ID)

    def __repr__(self) -> str:
        return f"ChunkStore({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def object(self, store: Store, key: str, size: int, media: bool = False) -> ObjectChunks:
        """The chunks of object ``key`` of ``store`` (``size`` bytes: data files never change);
        ``media``: a video stream, counted apart."""
        name = self._name(store, key, size)
        with self._lock:
            hit = self._objects.get(name)
            if hit is None:
                with self._folder_lock:
                    if (seen := self._foreign.pop(name, None)) is not None:
                        seen.close()  # mapped to evict: mapped again as this process's
                    hit = ObjectChunks(self.directory, name, key, size, self.chunk_bytes,
                                       self._slots)  # fmt: skip
                    self._objects[name] = hit
            hit.key = key  # one first seen in the folder (another process's) has none yet
            hit.media = hit.media or media
        return hit

    def existing(self, store: Store, key: str, size: int, media: bool = False
                 ) -> ObjectChunks | None:  # fmt: skip
        """:meth:`object`, only where some process of the node made it (a reader asks
        without making files for objects nothing fetches)."""
        name = self._name(store, key, size)
        if name not in self._objects and not (self.directory / f"{name}.state").exists():
            return None
        return self.object(store, key, size, media)

    def _name(self, store: Store, key: str, size: int) -> str:
        """An object's state file's name: the name of its copies (a hash of its place, key and
        size: :func:`~treadle.storage.filecache.copy_name`), then its size and this store's
        chunk size (:func:`~treadle.storage.chunkfolder.chunk_of`): one object's state words
        never count chunks of two sizes, nor two servers' objects of one URL and key."""
        return f"{copy_name(store, key, size)}_{size}_{self.chunk_bytes}"

    def used(self) -> int:
        """Bytes of present and fetching chunks of every object in the folder (all processes)."""
        with self._folder_lock:
            used = sum(int(sizes.sum()) for _, _, sizes in self._scan())
            self._folder.let_go()
            return used

    def fetch(self, store: Store, obj: ObjectChunks, chunks: Sequence[int],
              next_uses: Sequence[int], now: int, at: int | None = None) -> list[int]:  # fmt: skip
        """:meth:`fetch_many` of one object: the chunks not kept."""
        return self.fetch_many(store, [(obj, chunks, next_uses)], now, at)[0]

    def fetch_many(self, store: Store, wanted: Sequence[tuple[ObjectChunks, Sequence[int],
                   Sequence[int]]], now: int, at: int | None = None) -> list[list[int]]:  # fmt: skip
        """Make the chunks of each ``(object, chunks, next_uses)`` present. ``now`` is the
        earliest step not yet read; ``next_uses[i]`` is the step that needs chunk ``i``
        after this use (:data:`NEVER`: none known). Missing chunks are fetched, one coalesced
        range request per run of consecutive chunks, where room can be made by evicting
        chunks needed later than they are (farthest first). Returns, per object, the chunks
        not kept: no cached chunk is needed later than they are, so they are not fetched (a
        reader reads them another way).

        ``at=None``: the chunks are used as they are fetched (Belady's model, the
        simulator's): each takes its next use at once. ``at=step``: they are read at that
        step (lookahead): held until :meth:`release` (``at``), then their next use counts."""
        reserved, skipped = self.reserve(wanted, now, at)
        self.download(store, [(obj, got) for (obj, _, _), got in zip(wanted, reserved)])
        return skipped

    def reserve(self, wanted: Sequence[tuple[ObjectChunks, Sequence[int], Sequence[int]]],
                now: int, at: int | None = None, defer: bool = False
                ) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
        """:meth:`fetch_many`'s bookkeeping without the download: per object, the chunks
        reserved (now being fetched: :meth:`download` them) and those not kept (``defer``:
        not counted yet: asked for again later, or counted by :meth:`unserved`)."""
        with self._folder_lock:
            reserved, skipped = self._reserve(wanted, now, at, defer)
        if not defer:
            self.stats.bypassed += sum(map(len, skipped))
        return [sorted(r) for r in reserved], [sorted(k) for k in skipped]

    def unserved(self, obj: ObjectChunks, count: int) -> None:
        """Count ``count`` chunks of ``obj`` that :meth:`reserve` deferred and never kept."""
        self.stats.misses += count
        self.stats.media_misses += count * obj.media
        self.stats.bypassed += count

    def _reserve(self, wanted: Sequence[tuple[ObjectChunks, Sequence[int], Sequence[int]]],
                 now: int, at: int | None, defer: bool = False
                 ) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
        """Under the folder's lock: count hits and record their next use, then reserve room
        for the misses, nearest next use first; per object, (reserved, not kept)."""
        misses: list[tuple[int, int, int]] = []
        unusable: set[int] = set()  # objects whose files could not be made anew (a full disk)
        for i, (obj, chunks, nexts) in enumerate(wanted):
            if not obj.renew():  # removed (it held no chunk), or deleted by hand: made anew
                unusable.add(i)
            for c, n in zip(map(int, chunks), np.asarray(nexts, np.int64).tolist()):
                w = obj.words[c]
                if i in unusable:
                    misses.append((n, i, c))
                    continue
                if dead_fetch(w):  # never present: fetched again (its room reused), unless
                    _evict(obj, c)  # its writer holds its slot (alive: a hit, as it is)
                if int(w[0]) & _STATE_MASK == ABSENT:
                    misses.append((n, i, c))
                    continue
                self.stats.hits += 1
                self.stats.media_hits += obj.media
                _need(w, now, n if at is None else at, now if at is None else at)
        reserved: list[list[int]] = [[] for _ in wanted]
        skipped: list[list[int]] = [[] for _ in wanted]
        spares: dict[int, list[int]] = {}  # per chunk size: slots freed to make room
        room = self._room(now, spares)
        for n, i, c in sorted(misses):  # nearest first: each keeps what Belady keeps
            obj = wanted[i][0]
            kept = i not in unusable and room.make(obj.chunk_size(c), n)
            if kept and obj.removed() and not obj.reopen():  # by that scan: it held nothing
                unusable.add(i)
            slot = obj.slots.take(spares.get(obj.chunk)) if kept and i not in unusable else -1
            if kept and slot < 0:  # made anew on a full disk, or no slot (the table full)
                room.used -= obj.chunk_size(c)
                kept = False
            if kept:
                w = obj.words[c]
                w[3] = slot
                w[0], w[2] = (int(w[0]) & ~_STATE_MASK) | FETCHING, fetcher_id()
                w[1] = n if at is None else at
            (reserved if kept else skipped)[i].append(c)
            if kept or not defer:  # deferred: asked for again, or counted by unserved()
                self.stats.misses += 1
                self.stats.media_misses += obj.media
        for chunk, slots in spares.items():
            self._folder.slots(chunk).settle(slots)
        if room.scanned:
            self._folder.let_go()
        return reserved, skipped

    def _room(self, now: int, spares: dict[int, list[int]]) -> Room:
        """Under the folder's lock: room for one reservation's misses (one scan at most);
        the slots of present chunks evicted are kept in ``spares``, to be written over."""

        def evict(o: ObjectFiles | SeenObject, c: int) -> bool:
            if (slot := _evict(self._folder.mapped(o), c, keep=True)) >= 0:
                spares.setdefault(o.chunk, []).append(slot)
            return slot != NOT_EVICTED

        return Room(self._scan, self.max_bytes, now, evict)

    def release(self, obj: ObjectChunks, chunks: Sequence[int], at: int,
                next_uses: Sequence[int]) -> None:  # fmt: skip
        """Step ``at`` has read ``chunks``: each is next needed at ``next_uses[i]``."""
        self.release_many([(obj, chunks, at, next_uses)])

    def release_many(self, released: Sequence[tuple[ObjectChunks, Sequence[int], int,
                                                      Sequence[int]]]) -> None:  # fmt: skip
        """:meth:`release` of each ``(object, chunks, step, next uses)``, in order, under one
        lock of the folder (a lock costs more than the releases of a step)."""
        if not released:
            return
        with self._folder_lock:
            for obj, chunks, at, next_uses in released:
                if obj.removed() and not obj.reopen(create=False):
                    continue  # no process holds a chunk of it
                for c, n in zip(map(int, chunks), np.asarray(next_uses, np.int64).tolist()):
                    w = obj.words[c]
                    if int(w[0]) & _STATE_MASK != ABSENT:
                        _need(w, at, n, at)

    def read(self, obj: ObjectChunks, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of the object when every chunk they touch is present (and
        stays so while they are copied), else None."""
        return obj.read(start, end)

    def download(self, store: Store, reserved: Sequence[tuple[ObjectChunks, list[int]]]) -> None:
        """Fetch reserved chunks of objects of ``store``, all at once (runs of consecutive
        ones: one range each), write them into their slots and mark them present
        (:mod:`~treadle.storage.chunkwrite`); on failure, give their room back."""
        reqs, where = range_requests(reserved)
        if not reqs:
            return
        maps = [obj.words for obj, _ in reserved]  # the files the chunks were reserved in
        marks = [obj.words[list(chunks), 0].tolist() for obj, chunks in reserved]  # their words
        try:
            bufs = get_ranges(store, reqs, where)
            dones = []
            with contextlib.nullcontext() if RANGE_LOCKS else self._folder_lock:
                for (obj, chunks), words, before in zip(reserved, maps, marks):
                    mine = [k for k, o in enumerate(where) if o is obj]
                    data = chunk_views(obj, [reqs[k] for k in mine], [bufs[k] for k in mine])
                    dones.append(write_chunks(obj, chunks, words, before, data))
            if self._flush and any(dones):  # else the folder is of this boot only (same_boot)
                os.fdatasync(self._slots.fd)
            with self._folder_lock:
                for (obj, _), words, done in zip(reserved, maps, dones):
                    mark_present(obj, words, done, store)
        except BaseException:
            self.abandon(reserved)
            raise
        for obj in {id(o): o for o in where}.values():  # obstore merges ranges of one call
            sent = coalesced([(r.start, r.end) for o, r in zip(where, reqs)
                              if o is obj and r.end > r.start])  # fmt: skip
            sent_bytes = sum(b - a for a, b in sent)
            with self._lock:  # rounds download on several threads
                self.stats.requests += len(sent)
                self.stats.fetched_bytes += sent_bytes
                if obj.media:
                    self.stats.media_requests += len(sent)
                    self.stats.media_fetched_bytes += sent_bytes

    def abandon(self, reserved: Sequence[tuple[ObjectChunks, list[int]]]) -> None:
        """Give back the room of reserved chunks that will not be downloaded."""
        with self._folder_lock:
            for obj, chunks in reserved:
                give_back(obj, chunks)

    def _scan(self) -> list[tuple[ObjectFiles | SeenObject, np.ndarray, np.ndarray]]:
        """Under the folder's lock: every object of the folder that holds chunks (objects
        that hold none are removed: :mod:`~treadle.storage.chunkfolder`): (object, states,
        bytes held). Other processes' objects come as copies of their state words."""
        out = []
        for obj, states in self._folder.scan():
            sizes = np.full(obj.count, obj.chunk, np.int64)
            sizes[-1] = obj.size - (obj.count - 1) * obj.chunk
            out.append((obj, states, np.where(states != ABSENT, sizes, 0)))
        return out


def _need(w: np.ndarray, now: int, step: int, done: int) -> None:
    """Record that a chunk is needed at ``step``: its next use becomes ``step`` where the one
    it holds is stale (before ``now``) or the use at ``done`` (this one), else the nearer."""
    held = int(w[1])
    w[1] = step if held < now or held == done else min(held, step)


def chunk_store(max_bytes: int | None = None, chunk_bytes: int | None = None) -> ChunkStore | str:
    """The node's chunk store: ``<object cache folder>/chunk-slots``, bounded by ``max_bytes``
    (default ``$TREADLE_CHUNK_CACHE_BYTES``, else the object cache's bound), of chunks of
    ``$TREADLE_CHUNK_BYTES`` (default ``chunk_bytes``, else
    :func:`~treadle.storage.chunkfiles.default_chunk_bytes` of the bound); or why there is
    none."""
    from treadle.storage.filecache import default_dir, file_cache, parse_bytes

    bound_from = "max_bytes"
    if max_bytes is None:
        bound_from = "TREADLE_CHUNK_CACHE_BYTES"
        raw = os.environ.get("TREADLE_CHUNK_CACHE_BYTES")
        if raw is None:
            cache = file_cache()
            if isinstance(cache, str):
                return cache
            max_bytes, bound_from = cache.max_bytes, "TREADLE_CACHE_BYTES"
        else:
            max_bytes = parse_bytes(raw, "TREADLE_CHUNK_CACHE_BYTES")
    if max_bytes <= 0:
        return "the chunk cache is off (TREADLE_CHUNK_CACHE_BYTES=0)"
    chunk_bytes, chunk_from = chunk_bytes_for(max_bytes, chunk_bytes)
    if max_bytes < chunk_bytes:  # it would fetch nothing, every row a Lance take, silently
        return (f"the chunk cache's bound ({max_bytes:,} bytes, {bound_from}) is less than one "
                f"chunk ({chunk_bytes:,} bytes, {chunk_from})")  # fmt: skip
    key = (str(default_dir() / "chunk-slots"), max_bytes, chunk_bytes)
    if kind := shared_file_system(default_dir()):  # other machines' words: bytes in no order
        return (f"the chunk cache folder {key[0]!r} is on {kind}, which other machines may "
                "share (set TREADLE_CACHE_DIR to a local disk)")  # fmt: skip
    with _STORES_LOCK:  # one per configuration and process: its objects stay mapped once
        try:
            if key not in _STORES:
                remove_legacy(default_dir() / LEGACY_FOLDER)
                _STORES[key] = ChunkStore(key[0], max_bytes, chunk_bytes)
        except OSError as e:
            return f"the chunk cache folder {key[0]!r} is not usable ({e.strerror}: {e.filename})"
        return _STORES[key]


_STORES: dict[tuple[str, int, int], ChunkStore] = {}
_STORES_LOCK = threading.Lock()
renew_lock_in_child(sys.modules[__name__], "_STORES_LOCK")

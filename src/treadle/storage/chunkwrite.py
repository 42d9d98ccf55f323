"""Fetched chunks written into their slots (:mod:`treadle.storage.chunkstore`), and reserved
chunks given back.

A chunk's bytes are written into its slot under the slot's lock, only while its state words
still say this process fetches it, as they said when it was reserved
(:meth:`~treadle.storage.slotfile.SlotFile.write`); it is marked present after, under the
folder's lock, where the words are still those. A slot a fetch may be writing changes hands
only under the slot's lock, so no write lands in a slot after it changed hands: not even one
of a process taken for dead while it still ran (another pid namespace: ``chunkfiles.alive``
cannot see it), whose late bytes would be read as another object's. No folder lock is held
while bytes are written (the stage's reservations and the reader's releases go on).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from treadle.storage.chunkfiles import fetcher_id
from treadle.storage.chunkfolder import ABSENT, FETCHING, PRESENT, STATE_MASK
from treadle.storage.store import RangeRequest
from treadle.storage.store_errors import ChangedObject

if TYPE_CHECKING:
    from treadle.storage.chunkobject import ObjectChunks
    from treadle.storage.store import Store

__all__ = [
    "chunk_views",
    "get_ranges",
    "give_back",
    "mark_present",
    "range_requests",
    "write_chunks",
]


def range_requests(reserved: Sequence[tuple[ObjectChunks, list[int]]]
                   ) -> tuple[list[RangeRequest], list[ObjectChunks]]:  # fmt: skip
    """One range request per run of consecutive reserved chunks of an object, of the version
    its chunks are of (where a fetch recorded it), and the object of each."""
    reqs: list[RangeRequest] = []
    where: list[ObjectChunks] = []
    for obj, chunks in reserved:
        etag = None if obj.removed() else obj.etag()  # removed: marked present by no fetch
        runs: list[tuple[int, int]] = []
        for c in sorted(chunks):
            if runs and runs[-1][1] == c:
                runs[-1] = (runs[-1][0], c + 1)
            else:
                runs.append((c, c + 1))
        for a, b in runs:
            end = min(obj.size, b * obj.chunk)
            reqs.append(RangeRequest(obj.key, a * obj.chunk, end, etag))
            where.append(obj)
    return reqs, where


def get_ranges(store: Store, reqs: Sequence[RangeRequest], where: Sequence[ObjectChunks]
               ) -> list[object]:  # fmt: skip
    """Each range's bytes (no copy); one of no bytes (a zero-byte object's) is not sent: the
    store refuses it. A range of a version recorded pins the store's reads of its object to
    it first (:meth:`~treadle.storage.ranged.RangedReads.pin`: what :func:`mark_present`
    compares); a store that cannot be pinned (no ETags) is not checked."""
    try:
        if (pin := getattr(store, "pin", None)) is not None:
            for key, etag in {(r.key, r.etag) for r in reqs if r.etag is not None}:
                pin(key, etag)
        sent = [r for r in reqs if r.end > r.start]
        got = iter(store.get_ranges(sent, copy=False) if sent else [])
    except ChangedObject as e:
        if not any(r.key == e.key and r.etag is not None for r in reqs):
            raise  # not a version the cache recorded: the store's own check
        raise _cached(e, where[0].directory) from None
    return [next(got) if r.end > r.start else b"" for r in reqs]


def _cached(e: ChangedObject, directory: Path) -> ChangedObject:
    """``e``, saying that the node's chunk cache holds chunks of the version first read."""
    return ChangedObject(
        f"{e} (the node's chunk cache, {directory}, holds chunks of the version its first "
        "fetch saw: restored, the object is read again; else, with no loader running, "
        "remove that folder's files to read the new one)",
        e.key,
        e.first,
        e.now,
    )


def chunk_views(obj: ObjectChunks, reqs: Sequence[RangeRequest], bufs: Sequence[object]
                ) -> dict[int, memoryview]:  # fmt: skip
    """Each chunk's bytes within the fetched ranges ``reqs`` of ``obj`` (views, no copy)."""
    out: dict[int, memoryview] = {}
    for r, buf in zip(reqs, bufs):
        view = memoryview(buf).cast("B")  # type: ignore[arg-type]
        if len(view) != r.end - r.start:
            raise OSError(f"a range of {obj.key!r} came back with {len(view)} of "
                          f"{r.end - r.start} bytes")  # fmt: skip
        first = r.start // obj.chunk  # a range of no bytes: a zero-byte object's chunk
        for c in range(first, max(first + 1, -(-r.end // obj.chunk))):
            lo = c * obj.chunk - r.start
            out[c] = view[lo : lo + obj.chunk_size(c)]
    return out


def write_chunks(obj: ObjectChunks, chunks: Sequence[int], words: np.ndarray,
                 marks: Sequence[int], data: dict[int, memoryview]) -> list[tuple[int, int]]:  # fmt: skip
    """Write each chunk's bytes into its slot where its words in ``words`` (``obj``'s mapping
    when reserved) are still ``marks`` and this process's fetch; the ``(chunk, mark)`` of
    those written (:func:`mark_present` them)."""
    me, done = fetcher_id(), []
    for c, mark in zip(map(int, chunks), marks):
        slot = int(words[c, 3])

        def still(c: int = c, mark: int = mark, slot: int = slot) -> bool:
            w = int(words[c, 0])
            return (
                w == mark
                and w & STATE_MASK == FETCHING
                and int(words[c, 2]) == me
                and (int(words[c, 3]) == slot)
                and obj.linked()  # its state file deleted: its slot may be another's now
            )

        if slot >= 0 and obj.slots.write(slot, data[c], obj.tag, still):
            done.append((c, mark))
    return done


def mark_present(obj: ObjectChunks, words: np.ndarray, done: Sequence[tuple[int, int]],
                 store: Store) -> None:  # fmt: skip
    """Under the folder's lock: chunks written (:func:`write_chunks`) are present, where
    ``obj`` still maps ``words`` and their words are still the marks they were written under
    (else evicted as a dead fetch since, or removed: a purge, a folder emptied). They were
    fetched of the version ``store``'s reads of the object are pinned to: the first such
    fetch records it (:data:`~treadle.storage.chunkstate.ETAG_BYTES`); one of another version
    than the one recorded (the object replaced since another process's fetch) is
    :class:`~treadle.storage.store_errors.ChangedObject`, never chunks of two objects."""
    if obj.removed() or obj.words is not words or not obj.linked():
        return
    pinned = getattr(store, "pinned", None)
    if done and pinned is not None and (version := pinned(obj.key)) is not None:
        try:
            store.pin(obj.key, obj.record_etag(version))  # another version recorded: raises
        except ChangedObject as e:
            raise _cached(e, obj.directory) from None
    me = fetcher_id()
    for c, mark in done:
        if int(words[c, 0]) == mark and int(words[c, 2]) == me:
            words[c, 0] = (mark & ~STATE_MASK) | PRESENT
            words[c, 2] = 0


def give_back(obj: ObjectChunks, chunks: Sequence[int]) -> None:
    """Under the folder's lock: the chunks this process still fetches are absent again, their
    slots freed and punched (a fetch that failed, or was written only in part)."""
    if obj.removed():
        return
    me = fetcher_id()
    for c in map(int, chunks):
        w = int(obj.words[c, 0])
        if w & STATE_MASK != FETCHING or int(obj.words[c, 2]) != me:
            continue  # reserved in files since removed, or evicted as a dead fetch
        slot = int(obj.words[c, 3])
        obj.words[c, 0] = (w & ~STATE_MASK) | ABSENT
        obj.words[c, 2] = 0
        obj.words[c, 3] = -1
        if slot >= 0:  # this process's own fetch: none of its writes is under way
            obj.slots.empty(slot)

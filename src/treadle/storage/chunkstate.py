"""One object's state words in the chunk folder (:mod:`treadle.storage.chunkfolder`): per
chunk :data:`WORDS` words (its state and generation, its next use, the process fetching it,
its slot), then the version (ETag) its chunks are of (:data:`ETAG_BYTES`), mapped from
``<name>.state`` by every process that uses the object (:class:`ObjectFiles`), or copied by
a scan (:class:`SeenObject`)."""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np

from treadle.storage.fileio import write_at
from treadle.storage.slotfile import SlotFile, tag_of

__all__ = ["ABSENT", "ETAG_BYTES", "FETCHING", "NEVER", "PRESENT", "REMOVED", "STATE_MASK",
           "WORDS", "ObjectFiles", "SeenObject", "state_bytes"]  # fmt: skip

STATE_MASK = 3
ABSENT, FETCHING, PRESENT = 0, 1, 2
NEVER = 1 << 62
"""The next use of a chunk no known step needs."""
REMOVED = 3
"""The state of every chunk of an object whose files were removed: re-open it."""


WORDS = 4
"""State words per chunk: its state (and generation), its next use, the process fetching it,
its slot (:mod:`~treadle.storage.slotfile`; -1: none)."""

ETAG_BYTES = 256
"""Bytes after an object's state words: the version (ETag) of the object every chunk marked
present is of, recorded by its first fetch (a word: its length, 0 before; then its UTF-8).
Every later fetch of its chunks, by any process, asks the store for that version
(:mod:`~treadle.storage.chunkwrite`): an object replaced by another of its size is an error,
never chunks of two objects. It lives as long as the state file (made anew with every chunk
absent)."""


def state_bytes(count: int) -> int:
    """The size of the state file of an object of ``count`` chunks."""
    return count * WORDS * 8 + ETAG_BYTES


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _marked_removed(fd: int) -> bool:
    head = os.pread(fd, 8, 0)
    return len(head) == 8 and int(np.frombuffer(head, np.int64)[0]) & STATE_MASK == REMOVED


def _fresh_words(count: int) -> bytes:
    words = np.zeros((count, WORDS), np.int64)
    words[:, 3] = -1
    return words.tobytes() + bytes(ETAG_BYTES)


class ObjectFiles:
    """One object's state words in the folder, mapped; its chunks' bytes are in ``slots``."""

    def __init__(self, directory: Path, name: str, key: str, size: int, chunk: int,
                 slots: SlotFile) -> None:  # fmt: skip
        self.directory, self.name, self.key, self.size, self.chunk = (
            directory,
            name,
            key,
            size,
            chunk,
        )
        self.slots, self.tag = slots, tag_of(name)
        self.media = False  # a video stream (counted apart in ChunkStats' media_* fields)
        self.count = max(1, -(-size // chunk))
        self.words = self._open()

    def chunk_size(self, index: int) -> int:
        return min(self.chunk, self.size - index * self.chunk)

    def _open(self) -> np.ndarray:
        """Under the folder's lock: the state words, mapped; made (every chunk absent)
        where missing, torn, or left by a removal that did not finish. A word written through
        the mapping into a hole of a full disk kills the process with ``SIGBUS``, so a new
        file's blocks are written first (``OSError`` here)."""
        state = self.directory / f"{self.name}.state"
        want = state_bytes(self.count)
        self.slots.follow()  # words of the folder's now name slots of the files there now
        while True:
            fd = os.open(state, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not _marked_removed(fd):
                    if os.fstat(fd).st_size != want:  # new or torn (its slots: SlotFile.repair)
                        write_at(fd, _fresh_words(self.count), 0)
                        os.ftruncate(fd, want)
                    self.inode = os.fstat(fd).st_ino  # the file mapped (:meth:`linked`)
                    # the file opened (not its path again: deleted or replaced in between, it
                    # would be another); a plain array: a memmap's indexing is several times slower
                    mapped = mmap.mmap(fd, want)
                    self._etag = np.frombuffer(mapped, np.uint8, offset=want - ETAG_BYTES)
                    words = np.frombuffer(mapped, np.int64, self.count * WORDS)
                    return words.reshape(self.count, WORDS)
            finally:
                os.close(fd)
            _unlink(state)  # a removal cut short: finished, then made anew

    def etag(self) -> str | None:
        """The version (ETag) of the object its chunks are of, once a fetch recorded it (see
        :data:`ETAG_BYTES`; read before a fetch without the lock: :meth:`record_etag` writes
        the length last)."""
        n = int(self._etag[:8].view(np.int64)[0])
        if not 0 < n <= ETAG_BYTES - 8:
            return None
        return bytes(self._etag[8 : 8 + n]).decode("utf-8", "surrogateescape")

    def record_etag(self, etag: str) -> str:
        """Under the folder's lock, before chunks fetched of version ``etag`` are marked
        present: the version recorded (``etag``, where none was). One too long to keep is
        not recorded (its chunks are then checked only within a process)."""
        if (had := self.etag()) is not None:
            return had
        raw = etag.encode("utf-8", "surrogateescape")
        if len(raw) <= ETAG_BYTES - 8:
            self._etag[8 : 8 + len(raw)] = np.frombuffer(raw, np.uint8)
            self._etag[:8].view(np.int64)[0] = len(raw)  # last: a reader sees it whole
        return etag

    def linked(self) -> bool:
        """Whether the state file mapped is still the folder's: not deleted (or replaced)
        by hand, after which the next scan frees the slots its words name, and another
        fetch may write them. Asked after bytes are copied, and before they are written."""
        try:
            return os.stat(self.directory / f"{self.name}.state").st_ino == self.inode
        except FileNotFoundError:
            return False

    def let_go(self) -> None:
        """Under the folder's lock, where the words mapped are no longer the folder's (their
        file deleted, or the slot files theirs name): mark them removed and naming no slot,
        so every process that maps them re-opens the object before any use."""
        self.words[:, 0] = (self.words[:, 0] & ~STATE_MASK) | REMOVED
        self.words[:, 3] = -1

    def renew(self, create: bool = True) -> bool:
        """Under the folder's lock: the folder's state words of this object mapped (its files
        deleted by hand: let go of first; removed: re-opened, made where ``create``); whether
        they are."""
        if not self.removed() and not self.linked():
            self.let_go()
        return not self.removed() or self.reopen(create)

    def removed(self) -> bool:
        """Whether the files mapped were removed (then :meth:`reopen` before any use)."""
        return int(self.words[0, 0]) & STATE_MASK == REMOVED

    def reopen(self, create: bool = True) -> bool:
        """Under the folder's lock: map the object's state words anew (made empty where none,
        or only where some process made them: ``create=False``); whether they are mapped."""
        if not create and not (self.directory / f"{self.name}.state").exists():
            return False
        try:
            self.words = self._open()
        except OSError:  # a full disk: it stays removed (read and fetched another way)
            return False
        return True

    def close(self) -> None:
        """Let the words go (an object of another process, mapped to evict its chunks)."""
        self.words = self._etag = None  # type: ignore[assignment]  # closes with its last view


class SeenObject:
    """Another process's object as a scan saw it: a copy of its state words, no file kept
    open (:meth:`ChunkFolder.mapped` maps it to evict its chunks)."""

    def __init__(self, name: str, size: int, chunk: int, words: np.ndarray):
        self.name, self.key, self.size, self.chunk = name, "", size, chunk
        self.count, self.words, self.media = len(words), words, False

    def chunk_size(self, index: int) -> int:
        return min(self.chunk, self.size - index * self.chunk)

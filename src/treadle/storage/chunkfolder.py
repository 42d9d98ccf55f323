"""The chunk store's folder (:mod:`treadle.storage.chunkstore`): which objects hold chunks, and
the removal of those that hold none.

The folder is its own index: an object's two files (``<name>.state``, ``<name>.data``) exist
only while it holds chunks, or until the next scan after it was opened or emptied. A scan
lists the folder and visits only those objects, so its cost follows the objects that hold
bytes, not every object the node ever read, and the folder's file count stays bounded.

**Removal**, under the folder's ``flock``, of an object whose every chunk is absent (none
present, none being fetched: no process has it reserved): its state words are marked
:data:`REMOVED` (in the file every process maps), then its data file and its state file are
unlinked. A process that still maps the old files sees :data:`REMOVED` and re-opens the object
(:meth:`ObjectFiles.reopen`, under the lock) before it counts, reserves or reads; it never
writes into removed files, so every present or fetching chunk is in a file the folder lists
and the bound counts it. An old mapping never says present again, so a reader never takes
bytes from it. A removal cut short by a crash leaves a state file marked removed (or one
without its data file): the next scan or open finishes it.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from treadle.storage.fileio import write_at

__all__ = ["REMOVED", "ChunkFolder", "ObjectFiles", "SeenObject", "chunk_of", "remove_named"]

STATE_MASK = 3
ABSENT, FETCHING, PRESENT = 0, 1, 2
NEVER = 1 << 62
"""The next use of a chunk no known step needs."""
REMOVED = 3
"""The state of every chunk of an object whose files were removed: re-open it."""


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _marked_removed(fd: int) -> bool:
    head = os.pread(fd, 8, 0)
    return len(head) == 8 and int(np.frombuffer(head, np.int64)[0]) & STATE_MASK == REMOVED


def chunk_of(name: str) -> int | None:
    """The chunk size an object's name ends with (``<hash>_<chunk bytes>``: processes of a
    node with other ``$TREADLE_CHUNK_BYTES`` keep other files, and every store of the folder
    counts them all in its bound), or None for a name made before names held it."""
    tail = name.rpartition("_")[2]
    ok = "_" in name and tail.isascii() and tail.isdigit()
    return int(tail) if ok and int(tail) > 0 else None


class ObjectFiles:
    """One object's files in the folder: its sparse data file and mapped state words."""

    def __init__(self, directory: Path, name: str, key: str, size: int, chunk: int):
        self.directory, self.name, self.key, self.size, self.chunk = (
            directory,
            name,
            key,
            size,
            chunk,
        )
        self.media = False  # a video stream (counted apart in ChunkStats' media_* fields)
        self.count = max(1, -(-size // chunk))
        self.words, self.fd = self._open()

    def chunk_size(self, index: int) -> int:
        return min(self.chunk, self.size - index * self.chunk)

    def _open(self) -> tuple[np.ndarray, int]:
        """Under the folder's lock: the state words, mapped, and the data file, made (every
        chunk absent) where missing or left by a removal that did not finish."""
        state = self.directory / f"{self.name}.state"
        data = self.directory / f"{self.name}.data"
        while True:
            fd = os.open(state, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not _marked_removed(fd):
                    return self._open_files(fd, state, data)
            finally:
                os.close(fd)
            _unlink(data)  # a removal cut short: finished, then made anew
            _unlink(state)

    def _open_files(self, state_fd: int, state: Path, data: Path) -> tuple[np.ndarray, int]:
        """:meth:`_open` of the state file ``state`` (open: ``state_fd``, not removed). A
        state file of the wrong size (new, or torn) or one whose data file is not the
        object's size (lost, or cut: a hole's zeros where its words say present) is made
        anew: every chunk absent, its blocks written (a word written through the mapping
        into a hole of a full disk kills the process with ``SIGBUS``; ``OSError`` here)."""
        want = self.count * 3 * 8
        fd = os.open(data, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(state_fd).st_size != want or os.fstat(fd).st_size != self.size:
                write_at(state_fd, bytes(want), 0)
                os.ftruncate(state_fd, want)
                os.ftruncate(fd, 0)  # no bytes left that no chunk counts
                os.ftruncate(fd, self.size)  # sparse: no bytes until chunks are written
            # a plain array over the mapping: a memmap's indexing is several times slower
            words = np.memmap(state, np.int64, "r+", shape=(self.count, 3)).view(np.ndarray)
        except BaseException:
            os.close(fd)
            raise
        return words, fd

    def removed(self) -> bool:
        """Whether the files mapped were removed (then :meth:`reopen` before any use)."""
        return int(self.words[0, 0]) & STATE_MASK == REMOVED

    def reopen(self, create: bool = True) -> bool:
        """Under the folder's lock: map the object's files anew (made empty where none, or
        only where some process made them: ``create=False``); whether they are mapped. The
        data descriptor keeps its number, switched before the words: a reader in another
        thread that sees the new words reads the new file, one that sees the old words
        sees them removed."""
        if not create and not (self.directory / f"{self.name}.state").exists():
            return False
        try:
            words, fd = self._open()
        except OSError:  # a full disk: it stays removed (read and fetched another way)
            return False
        os.dup2(fd, self.fd, inheritable=False)  # as os.open makes it
        os.close(fd)
        self.words = words
        return True

    def close(self) -> None:
        """Let the files go (an object of another process, mapped to evict its chunks)."""
        self.words = None  # type: ignore[assignment]  # its mapping closes with its last view
        fd, self.fd = self.fd, -1  # closed once: a second close would hit a reused number
        if fd >= 0:
            os.close(fd)


class SeenObject:
    """Another process's object as a scan saw it: a copy of its state words, no file kept
    open (:meth:`ChunkFolder.mapped` maps it to evict its chunks)."""

    def __init__(self, name: str, size: int, chunk: int, words: np.ndarray):
        self.name, self.key, self.size, self.chunk = name, "", size, chunk
        self.count, self.words, self.media = len(words), words, False

    def chunk_size(self, index: int) -> int:
        return min(self.chunk, self.size - index * self.chunk)


class ChunkFolder:
    """The objects of one chunk folder this process maps: its own (``objects``, kept) and
    other processes' (``foreign``, mapped to evict, at most ``max_foreign`` kept)."""

    def __init__(self, directory: Path, chunk: int, max_foreign: int):
        self.directory, self.chunk, self.max_foreign = directory, chunk, max_foreign
        self.objects: dict[str, ObjectFiles] = {}  # by name: this process's mappings
        self.foreign: OrderedDict[str, ObjectFiles] = OrderedDict()  # least recent first
        self.scanned = 0  # objects the last scan visited (those holding chunks)

    def scan(self) -> list[tuple[ObjectFiles | SeenObject, np.ndarray]]:
        """Under the folder's lock: every object that holds chunks, with its states;
        objects that hold none are removed (see the module's docstring)."""
        out = []
        for e in os.scandir(self.directory):
            if not e.name.endswith(".state"):
                continue
            obj = self._view(e.name.removesuffix(".state"))
            if obj is None:
                continue
            states = np.asarray(obj.words[:, 0]) & STATE_MASK
            if not np.any(states != ABSENT):
                self._remove(obj)
                continue
            out.append((obj, states))
        self.scanned = len(out)
        return out

    def forget(self) -> None:
        """Under the folder's lock: remove every object's files whatever its chunks' states
        (a folder written in another boot of the machine: ``chunkfiles.same_boot``)."""
        for e in list(os.scandir(self.directory)):
            if e.name.endswith(".state") and (obj := self._view(e.name[:-6])) is not None:
                self._remove(obj)
        for e in list(os.scandir(self.directory)):  # a data file whose state file is gone
            if e.name.endswith(".data") and not os.path.exists(e.path[:-5] + ".state"):
                _unlink(Path(e.path))  # (a crash between their removals): bytes nobody counts
        self.objects.clear()
        for obj in self.foreign.values():
            obj.close()
        self.foreign.clear()

    def _view(self, name: str) -> ObjectFiles | SeenObject | None:
        """Object ``name`` as mapped here (re-opened where removed), else a copy of its
        state words; None where its files are left by a removal or creation cut short, or
        by a treadle before names held the chunk size (then removed)."""
        obj = self.objects.get(name)
        if obj is not None and (not obj.removed() or obj.reopen(create=False)):
            return obj
        hit = self.foreign.get(name)
        if hit is not None:
            if not hit.removed():
                self.foreign.move_to_end(name)
                return hit
            self.foreign.pop(name).close()
        state = self.directory / f"{name}.state"
        try:
            fd = os.open(state, os.O_RDONLY)
            try:
                # read-only: evictions write through a mapping (ChunkFolder.mapped)
                raw = os.pread(fd, os.fstat(fd).st_size, 0)
                words = np.frombuffer(raw[: len(raw) // 24 * 24], np.int64)  # torn: cut
            finally:
                os.close(fd)
            size = os.stat(self.directory / f"{name}.data").st_size
        except FileNotFoundError:
            _unlink(state)  # no data file: made or removed when a process died
            return None
        chunk = chunk_of(name)
        if chunk is None or len(words) != 3 * max(1, -(-size // chunk)):
            # a treadle before names held the chunk size made it (nothing reads it now), or
            # a torn file: its bytes would stay on disk outside every bound
            self._remove(SeenObject(name, size, self.chunk, words))
            return None
        words = words.reshape(-1, 3)
        if words[0, 0] & STATE_MASK == REMOVED:
            self._remove(SeenObject(name, size, chunk, words))
            return None
        return SeenObject(name, size, chunk, words)

    def _remove(self, obj: ObjectFiles | SeenObject) -> None:
        state = self.directory / f"{obj.name}.state"
        marked = np.array(obj.words, np.int64).reshape(-1, 3)
        marked[:, 0] = (marked[:, 0] & ~STATE_MASK) | REMOVED
        fd = os.open(state, os.O_WRONLY)
        try:  # every mapping of the file sees it (one page cache)
            os.pwrite(fd, marked.tobytes(), 0)
        finally:
            os.close(fd)
        _unlink(self.directory / f"{obj.name}.data")
        _unlink(state)

    def mapped(self, obj: ObjectFiles | SeenObject) -> ObjectFiles:
        """Under the folder's lock, in the scan's round: ``obj`` mapped, to evict chunks."""
        if isinstance(obj, ObjectFiles):
            return obj
        hit = self.foreign.get(obj.name)
        if hit is None:
            hit = ObjectFiles(self.directory, obj.name, "", obj.size, obj.chunk)
            self.foreign[obj.name] = hit
        return hit

    def let_go(self) -> None:
        """Under the folder's lock, after a scan's use: close the least recently scanned
        objects of other processes beyond ``max_foreign`` (no reader holds them)."""
        while len(self.foreign) > self.max_foreign:
            self.foreign.popitem(last=False)[1].close()


def remove_named(directory: Path, stem: str) -> None:
    """Under the folder's lock: remove the files of the objects named ``stem`` whatever
    their chunks' states (a purge's data files: every chunk size's, and a name without
    one), each marked removed first, as a scan does: a process that maps them opens them
    anew instead of fetching into files no scan lists."""
    folder = ChunkFolder(directory, 1, 0)
    for state in [*directory.glob(f"{stem}_*.state"), directory / f"{stem}.state"]:
        try:
            raw = state.read_bytes()
        except FileNotFoundError:
            continue
        words = np.frombuffer(raw[: len(raw) // 24 * 24], np.int64).reshape(-1, 3)
        folder._remove(SeenObject(state.name.removesuffix(".state"), 0, 1, words))
    for data in [*directory.glob(f"{stem}_*.data"), directory / f"{stem}.data"]:
        _unlink(data)

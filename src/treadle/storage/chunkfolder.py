"""The chunk store's folder (:mod:`treadle.storage.chunkstore`): which objects hold chunks,
where their bytes are, and the removal of objects that hold none.

Per object, ``<name>.state`` holds :data:`WORDS` words a chunk; a chunk's bytes are in a slot
of the folder's slot file for its chunk size (:mod:`~treadle.storage.slotfile`), which its
words name. The folder is its own index: an object's state file exists only while it holds
chunks, or until the next scan after it was opened or emptied. A scan lists the folder and
visits only those objects, so its cost follows the objects that hold bytes, not every object
the node ever read, and the folder's file count stays bounded.

**Removal**, under the folder's ``flock``, of an object whose every chunk is absent (none
present, none being fetched: no process has it reserved): its state words are marked
:data:`REMOVED` (in the file every process maps), then its state file is unlinked. A process
that still maps the old file sees :data:`REMOVED` and re-opens the object
(:meth:`ObjectFiles.reopen`, under the lock) before it counts, reserves or reads; it never
reserves through removed words, so every present or fetching chunk is in a file the folder
lists and the bound counts it. An old mapping never says present again, so a reader never
takes bytes through it. A removal cut short by a crash leaves a state file marked removed:
the next scan or open finishes it.

**State files deleted by hand** (a cache cleared in part): the next scan of any process frees
the slots only their words named, and another fetch may take them, while a process still maps
the deleted words. So a reader checks that its state file is still the folder's after it
copies bytes, a writer before it writes a slot (:meth:`ObjectFiles.linked`), and a scan or
reservation that finds a mapping not the folder's lets go of it (:meth:`ObjectFiles.let_go`)
and maps the file listed.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from treadle.storage.chunkstate import (
    ABSENT,
    FETCHING,
    NEVER,
    PRESENT,
    REMOVED,
    STATE_MASK,
    WORDS,
    ObjectFiles,
    SeenObject,
    _unlink,
    state_bytes,
)
from treadle.storage.slotfile import SlotFile, tag_of

__all__ = [
    "ABSENT",
    "FETCHING",
    "NEVER",
    "PRESENT",
    "STATE_MASK",
    "LEGACY_FOLDER",
    "REMOVED",
    "WORDS",
    "ChunkFolder",
    "ObjectFiles",
    "SeenObject",
    "chunk_of",
    "remove_legacy",
    "remove_named",
]


def _tail_number(part: str) -> int | None:
    return int(part) if part.isascii() and part.isdigit() and int(part) > 0 else None


def _numbers(name: str) -> tuple[int, int] | None:
    """The object size and chunk size an object's name holds, or None for another name."""
    parts = name.split("_")
    if len(parts) != 3:
        return None
    size, chunk = _tail_number(parts[1]), _tail_number(parts[2])
    return None if size is None or chunk is None else (size, chunk)


def chunk_of(name: str) -> int | None:
    """The chunk size an object's name ends with (``<hash>_<size>_<chunk bytes>``: processes
    of a node with other ``$TREADLE_CHUNK_BYTES`` keep other files, and every store of the
    folder counts them all in its bound), or None for a name not made so."""
    got = _numbers(name)
    return None if got is None else got[1]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


class ChunkFolder:
    """The objects of one chunk folder this process maps: its own (``objects``, kept) and
    other processes' (``foreign``, mapped to evict, at most ``max_foreign`` kept), and the
    folder's slot files (one per chunk size, opened when first needed)."""

    def __init__(self, directory: Path, chunk: int, max_foreign: int):
        self.directory, self.chunk, self.max_foreign = directory, chunk, max_foreign
        self.objects: dict[str, ObjectFiles] = {}  # by name: this process's mappings
        self.foreign: OrderedDict[str, ObjectFiles] = OrderedDict()  # least recent first
        self.slot_files: dict[int, SlotFile] = {}  # by chunk size
        self.scanned = 0  # objects the last scan visited (those holding chunks)

    def slots(self, chunk: int) -> SlotFile:
        """Under the folder's lock (or before any other thread sees the folder): the slot
        file of chunk size ``chunk``."""
        got = self.slot_files.get(chunk)
        if got is None:
            got = self.slot_files[chunk] = SlotFile(self.directory, chunk, self._moved,
                                                    self._made)  # fmt: skip
            if got.made:
                self._made(got)
        return got

    def _moved(self, slots: SlotFile) -> None:
        """Under the folder's lock: the slot files of ``slots.chunk`` this process had open
        are no longer the folder's (removed, made anew): the words it maps of that chunk
        size name their slots, so they are marked removed (re-opened before any use, as
        after a removal; their files may be gone, or listed and removed by :meth:`_made`)."""
        for obj in [*self.objects.values(), *self.foreign.values()]:
            if obj.chunk == slots.chunk and obj.words is not None and not obj.removed():
                obj.let_go()

    def _made(self, slots: SlotFile) -> None:
        """Under the folder's lock: the slot files of ``slots.chunk`` were made here, so no
        chunk in the folder's words of that chunk size has its bytes in them: those objects
        are removed, and the files emptied (one of the two may have been left)."""
        for e in list(os.scandir(self.directory)):
            name = e.name.removesuffix(".state")
            if name != e.name and chunk_of(name) == slots.chunk:
                if (obj := self._view(name)) is not None:
                    self._remove(obj)
        slots.forget()

    def _slot_sizes(self) -> list[int]:
        """The chunk sizes that have slot files in the folder."""
        out = []
        for e in os.scandir(self.directory):
            if e.name.startswith("slots_") and e.name.endswith(".table"):
                chunk = _tail_number(e.name[6:-6])
                if chunk is not None:
                    out.append(chunk)
        return out

    def scan(self) -> list[tuple[ObjectFiles | SeenObject, np.ndarray]]:
        """Under the folder's lock: every object that holds chunks, with its states;
        objects that hold none are removed (see the module's docstring), and slots no
        object's words name are freed (:meth:`SlotFile.repair`)."""
        out = []
        for slots in list(self.slot_files.values()):
            slots.follow()  # removed or made anew since: the words this process maps let go
        held: dict[int, list[np.ndarray]] = {c: [] for c in self._slot_sizes()}
        listed: dict[str, int] = {}
        for e in os.scandir(self.directory):
            if not e.name.endswith(".state"):
                continue
            listed[e.name.removesuffix(".state")] = e.inode()
            obj = self._view(e.name.removesuffix(".state"), e.inode())
            if obj is None:
                continue
            states = np.asarray(obj.words[:, 0]) & STATE_MASK
            if not np.any(states != ABSENT):
                self._remove(obj)
                continue
            held.setdefault(obj.chunk, []).append(np.asarray(obj.words[states != ABSENT, 3]))
            out.append((obj, states))
        self._let_go_unlisted(listed)  # their slots are freed now: named by no file listed
        for chunk, slots in held.items():
            if not self.slots(chunk).repair(_joined(slots)):  # slot file cut, table cut
                self.forget()  # its chunks' words would say present over other bytes
                out = []
                break
        self.scanned = len(out)
        return out

    def _let_go_unlisted(self, listed: dict[str, int]) -> None:
        """Under the folder's lock, in a scan: the objects this process maps whose state
        files are not those ``listed`` (name: inode; deleted or replaced by hand) are let go
        of (:meth:`ObjectFiles.let_go`; re-opened before any use), mapped or not."""
        for obj in self.objects.values():
            if listed.get(obj.name) != obj.inode and not obj.removed():
                obj.let_go()
        for name in [n for n, obj in self.foreign.items() if listed.get(n) != obj.inode]:
            obj = self.foreign.pop(name)
            if not obj.removed():
                obj.let_go()
            obj.close()

    def forget(self) -> None:
        """Under the folder's lock: remove every object's files and empty every slot,
        whatever the chunks' states (a folder written in another boot of the machine:
        ``chunkfiles.same_boot``)."""
        for e in list(os.scandir(self.directory)):
            if e.name.endswith(".state") and (obj := self._view(e.name[:-6])) is not None:
                self._remove(obj)
        for chunk in self._slot_sizes():
            self.slots(chunk).forget()
        self.objects.clear()
        for obj in self.foreign.values():
            obj.close()
        self.foreign.clear()

    def _view(self, name: str, inode: int | None = None) -> ObjectFiles | SeenObject | None:
        """Object ``name`` as mapped here (re-opened where removed, or where its file is no
        longer the one listed, of ``inode``), else a copy of its state words; None where its
        file is torn, or not named as this treadle names them (then removed)."""
        obj = self.objects.get(name)
        if obj is not None and inode is not None and obj.inode != inode and not obj.removed():
            obj.let_go()  # its file deleted or replaced by hand: the one listed is mapped
        if obj is not None and (not obj.removed() or obj.reopen(create=False)):
            return obj
        hit = self.foreign.get(name)
        if hit is not None:
            if not hit.removed() and (inode is None or hit.inode == inode):
                self.foreign.move_to_end(name)
                return hit
            if not hit.removed():
                hit.let_go()
            self.foreign.pop(name).close()
        state = self.directory / f"{name}.state"
        try:
            with open(state, "rb") as f:  # read-only: evictions write through a mapping
                raw = f.read()
        except FileNotFoundError:
            return None
        numbers = _numbers(name)
        size, chunk = numbers if numbers is not None else (0, 0)
        count = max(1, -(-size // chunk)) if numbers is not None else 0
        if numbers is None or len(raw) != state_bytes(count):
            # torn, or not a name of this layout: its slots are freed by SlotFile.repair
            _unlink(state)
            return None
        words = np.frombuffer(raw, np.int64, count * WORDS).reshape(-1, WORDS)
        if words[0, 0] & STATE_MASK == REMOVED:
            self._remove(SeenObject(name, size, chunk, words))
            return None
        return SeenObject(name, size, chunk, words)

    def _remove(self, obj: ObjectFiles | SeenObject) -> None:
        """Under the folder's lock: mark ``obj``'s words removed (every mapping sees it: one
        page cache) and naming no slot, then free its chunks' slots (their bytes punched)
        and unlink its state file. Cut short after the mark, its slots are freed by the next
        scan's :meth:`SlotFile.repair`; never freed twice (the words no longer name them)."""
        state = self.directory / f"{obj.name}.state"
        words = np.array(obj.words, np.int64).reshape(-1, WORDS)
        held = words[(words[:, 0] & STATE_MASK != ABSENT) & (words[:, 0] & STATE_MASK
                                                              != REMOVED), 3]  # fmt: skip
        words[:, 0] = (words[:, 0] & ~STATE_MASK) | REMOVED
        words[:, 3] = -1
        try:
            fd = os.open(state, os.O_WRONLY)
        except FileNotFoundError:
            return
        try:
            os.pwrite(fd, words.tobytes(), 0)
        finally:
            os.close(fd)
        slots = self.slots(obj.chunk)
        for s in held.tolist():
            with slots.fenced(int(s)):  # a fetch writing it ends first (its words now removed)
                slots.empty(int(s))
        _unlink(state)

    def mapped(self, obj: ObjectFiles | SeenObject) -> ObjectFiles:
        """Under the folder's lock, in the scan's round: ``obj`` mapped, to evict chunks."""
        if isinstance(obj, ObjectFiles):
            return obj
        hit = self.foreign.get(obj.name)
        if hit is None:
            hit = ObjectFiles(self.directory, obj.name, "", obj.size, obj.chunk,
                              self.slots(obj.chunk))  # fmt: skip
            self.foreign[obj.name] = hit
        return hit

    def let_go(self) -> None:
        """Under the folder's lock, after a scan's use: close the least recently scanned
        objects of other processes beyond ``max_foreign`` (no reader holds them)."""
        while len(self.foreign) > self.max_foreign:
            self.foreign.popitem(last=False)[1].close()

    def close(self) -> None:
        """Close the slot files opened (a folder used for one task: :func:`remove_named`)."""
        for slots in self.slot_files.values():
            slots.close()
        self.slot_files.clear()


def remove_named(directory: Path, stem: str) -> None:
    """Under the folder's lock: remove the files of the objects named ``stem`` (a purge's
    data files, of every chunk size) whatever their chunks' states, each marked removed
    first, as a scan does (a process that maps them opens them anew instead of fetching
    into slots no word names), and punch every slot that holds their bytes, also slots
    freed or taken for another object's fetch since."""
    folder = ChunkFolder(directory, 1, 0)
    try:
        for state in directory.glob(f"{stem}_*.state"):
            name = state.name.removesuffix(".state")
            obj = folder._view(name)  # torn or unnamed: unlinked (its slots punched below)
            if isinstance(obj, SeenObject):
                folder._remove(obj)
        for chunk in folder._slot_sizes():
            folder.slots(chunk).purge(tag_of(stem))
    finally:
        folder.close()


LEGACY_FOLDER = "chunks"
"""The chunk folder of treadle before slots (a sparse ``.data`` file per object), beside
``chunk-slots`` in the object cache folder."""


def remove_legacy(directory: Path, stem: str = "") -> None:
    """Remove the files of the chunk folder before slots (``directory``: its path), of the
    objects named ``stem`` (a purge), or all of them (``""``: a store of this treadle opened
    on the node). A process of that treadle still running goes on with the files it holds."""
    if not directory.is_dir():
        return
    from treadle.storage.folderlock import folder_lock

    with folder_lock(directory):
        for e in list(os.scandir(directory)):
            if e.name.startswith(stem) and e.name.endswith((".state", ".data")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)

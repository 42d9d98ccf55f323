"""The slots of one chunk size in the chunk folder (:mod:`treadle.storage.chunkstore`).

Every chunk of that size, of any object, is kept in a **slot** of one shared file,
``slots_<chunk>.data``: slot ``s`` is bytes ``[s * chunk, (s + 1) * chunk)``. An evicted
chunk's slot is written over in place by the next chunk fetched, so the fetch's bytes go into
pages the page cache already holds: writing into a freshly punched hole (the layout before,
a sparse file per object) allocates new pages, which costs about 2.5 times the copy on the
machines measured (issue 48, ``docs/scale.md``).

``slots_<chunk>.table`` holds two words a slot, mapped by every process of the node and read
or written under the folder's lock (a fetch's writer sets its slot's tag under the slot's
lock, :meth:`SlotFile.write`):

- **held**: 1 while a chunk's state words name the slot (fetching or present), else 0;
- **tag**: whose bytes the slot holds (:func:`tag_of` of an object's name), 0 where it holds
  none (never written, or punched). A slot taken for another object keeps the old tag until
  the new bytes are written, so a purge (:func:`treadle.storage.chunkfolder.remove_named`)
  finds every slot that still holds an object's bytes, held or free.

A free slot holds no bytes between reservations: a slot freed to make room is taken again in
the same reservation, or punched (:meth:`SlotFile.settle`). So the disk holds the bytes the
bound counts (the tail of a short last chunk is punched as well), and a block per mark.

**Marks**: the slots come in regions (``_MIN_SLOTS`` slots, then as many again, doubling: the
table's sizes), and the last slot of each region is held by no chunk: its last bytes are a
mark, written once, when the table grows into the region. A slot file cut (``truncate``)
loses the mark of every region it cuts into, and nothing writes it again but a
:meth:`SlotFile.forget` (after the words naming its slots were let go): writers write only
the slots of chunks, which another process's fetch may write into a file cut under it,
regrowing it with holes between. So a reader that finds its slot's region marked after it
copied the bytes copied them before any cut (:meth:`SlotFile.marked`), and a scan that finds
the files not as this layout leaves them empties the folder's chunks of the size
(:meth:`SlotFile.repair`).

The files a process has open stay the folder's: removed under it (a cache cleared by hand)
and made anew by another process, they are opened again at its next scan or object opened
(:meth:`SlotFile.follow`), the words it mapped let go first; else two processes would
name slots of two files in the same words. A forked child opens them anew: a slot's lock
is held by the open file, which it would share with its parent.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from treadle.storage.fileio import RANGE_LOCKS, punch, range_lock, range_unlock, write_at

__all__ = ["SlotFile", "tag_of"]

_MIN_SLOTS = 64
"""The first region's slots (:func:`_region_end`): the table's least size."""
_MARK = bytes.fromhex("a5747265646c6501")  # nonzero: a cut file reads zeros where it was
_MARK_TAG = -1
"""The tag of a region's mark slot: held by no chunk, never freed, never punched."""


def _region_end(s: int) -> int:
    """The table size that covers slot ``s``: ``_MIN_SLOTS`` doubled until it is past ``s``
    (its last slot is the region's mark)."""
    end = _MIN_SLOTS
    while end <= s:
        end *= 2
    return end


def _mark_slots(start: int, end: int) -> list[int]:
    """The mark slots in ``[start, end)``."""
    out, m = [], _MIN_SLOTS
    while m <= end:
        if m - 1 >= start:
            out.append(m - 1)
        m *= 2
    return out


def tag_of(name: str) -> int:
    """An object's tag in the slot tables: its name's hash (hex), as a nonzero int64."""
    return (int(name[:15], 16) & ((1 << 60) - 1)) + 1


def _none(_: SlotFile) -> None:
    pass


class SlotFile:
    """The slot file and slot table of chunk size ``chunk`` in ``directory``."""

    def __init__(self, directory: Path, chunk: int, moved: Callable[[SlotFile], None] = _none,
                 made: Callable[[SlotFile], None] = _none) -> None:  # fmt: skip
        self.directory, self.chunk = Path(directory), int(chunk)
        self.moved, self.on_made = moved, made  # told of files replaced (:meth:`follow`)
        self._gone: list[int] = []  # files no longer at their paths: a writer may hold one
        self.table = np.zeros((0, 2), np.int64)
        self._map = (-1, self.table)  # (bytes mapped, table): one assignment, as threads read it
        self._hint = 0  # slots before it were held when this process last looked
        self.made = self._open_files()
        _OPEN.add(self)

    def _paths(self) -> tuple[Path, Path]:
        return (self.directory / f"slots_{self.chunk}.data",
                self.directory / f"slots_{self.chunk}.table")  # fmt: skip

    def _open_files(self) -> bool:
        """Open the slot file and table at their paths; whether either was made here (then
        no state words name a slot of it: :meth:`follow`)."""
        made, fds = False, []
        for path in self._paths():
            while True:
                try:
                    fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
                    made = True
                except FileExistsError:
                    try:
                        fds.append(os.open(path, os.O_RDWR))
                    except FileNotFoundError:
                        continue  # removed in between: made here
                break
        self.fd, self._table_fd = fds
        self.table, self._hint = np.zeros((0, 2), np.int64), 0
        self._map = (-1, self.table)
        self._sound = 0 if made else -1  # the table size last found sound (take: no less)
        return made

    def follow(self) -> bool:
        """Under the folder's lock: where the files at the slot paths are no longer those
        open (removed, or made anew by another process), open them; whether this made them.
        ``moved`` is told first, once no writer writes the old files (the words this process
        mapped name their slots: a slot of one file read in the other is another chunk's
        bytes); ``made`` after, where this made them (the folder's words of this chunk size
        name slots of files gone)."""
        try:
            same = all(os.stat(p).st_ino == os.fstat(fd).st_ino
                       for p, fd in zip(self._paths(), (self.fd, self._table_fd)))  # fmt: skip
        except FileNotFoundError:
            same = False
        if same:
            return False
        with self.fenced(None):  # a writer of the old files ends first (its words: removed)
            self.moved(self)
            self._gone += [self.fd, self._table_fd]
            made = self._open_files()
        if made:
            self.on_made(self)
        return made

    def refresh(self) -> np.ndarray:
        """Under the folder's lock (or a slot's, :meth:`write`): the table, mapped anew where
        another process grew it (or emptied it: :meth:`forget`, under every slot's lock). The
        one this call mapped: a writer's thread may map an older size meanwhile (it read the
        size before this one grew the table)."""
        size = os.fstat(self._table_fd).st_size // 16 * 16
        mapped, table = self._map
        if size != mapped:
            if size:
                table = np.frombuffer(mmap.mmap(self._table_fd, size), np.int64).reshape(-1, 2)
            else:
                table = np.zeros((0, 2), np.int64)
            self._map, self.table = (size, table), table
        return table

    def take(self, spares: list[int] | None = None) -> int:
        """Under the folder's lock: a slot for a chunk, now held (its tag kept: the bytes there
        are still another object's until the new ones are written): one of ``spares`` (freed
        to make room in this reservation: its pages written over, no new page, no hole), else
        the lowest free one this process knows of. The search starts where the last one ended
        (a table of a terabyte's slots is not read whole per chunk), from the start again
        before the table grows; -1 where it cannot grow (a full disk), or where the table is
        shorter than the last scan found it (cut since: its held slots would be taken again)."""
        table = self.refresh()
        if len(table) < self._sound or self._sound < 0:
            return -1
        if spares:
            s = spares.pop()
            table[s, 0] = 1
            return s
        free = np.flatnonzero(table[self._hint :, 0] == 0)[:1] + self._hint
        if not len(free):
            free = np.flatnonzero(table[: self._hint, 0] == 0)[:1]
        if not len(free):
            have = len(table)
            try:
                table = self._grow(max(_MIN_SLOTS, 2 * have))
            except OSError:  # its chunk is not kept: read as without the cache
                return -1
            free = np.array([have])
        s = int(free[0])
        table[s, 0] = 1
        self._hint = s + 1
        return s

    def write(self, s: int, data: memoryview, tag: int, still: Callable[[], bool]) -> bool:
        """Write a chunk's bytes ``data`` at the start of slot ``s`` (the rest of the slot
        punched: a short last chunk leaves no other object's bytes behind it) and tag the
        slot as object ``tag``'s, where ``still()``, asked under the slot's lock, says the
        chunk's words still name this fetch; whether it did. No folder lock is held: a
        slot changes hands while a fetch may write it only under its lock
        (:meth:`fenced`), so no byte lands in a slot another chunk took."""
        at, fd = s * self.chunk, self.fd  # the file the slot was taken in (follow: no other)
        range_lock(fd, at, self.chunk)
        try:
            if not still() or s >= len(self.refresh()):  # the table cut: its scan forgets
                return False
            write_at(fd, data, at)  # all of it, or an error
            if len(data) < self.chunk:
                punch(fd, at + len(data), self.chunk - len(data))
            table = self.refresh()
            if s < len(table):
                table[s, 1] = tag  # a purge takes the slot's lock to read it
        finally:
            range_unlock(fd, at, self.chunk)
        return True

    @contextlib.contextmanager
    def fenced(self, s: int | None, wait: bool = True) -> Iterator[bool]:
        """Slot ``s`` (None: every slot) locked against every writer, this process's
        threads too (an open of its own), while a chunk that may be fetching into it is
        taken from it; yields whether no writer held it (``wait=False``: a fetch of a
        process taken for dead that writes still, alive in another pid namespace)."""
        if not RANGE_LOCKS:  # then fetches write under the folder's lock (chunkstore)
            yield True
            return
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDWR)  # the file writers lock, anew
        try:  # closing the file lets the lock go
            yield range_lock(fd, 0 if s is None else s * self.chunk,
                             0 if s is None else self.chunk, wait)  # fmt: skip
        finally:
            os.close(fd)

    def free(self, s: int) -> None:
        """Under the folder's lock: slot ``s`` is free (its bytes kept: :meth:`clean` them,
        or let the same reservation write over them, :meth:`settle`)."""
        table = self.refresh()
        if 0 <= s < len(table):
            table[s, 0] = 0
            self._hint = min(self._hint, s)

    def empty(self, s: int) -> None:
        """Under the folder's lock: :meth:`free` slot ``s`` and :meth:`clean` it (its chunk
        gone, its bytes with it)."""
        self.free(s)
        self.clean(s)

    def clean(self, s: int) -> None:
        """Under the folder's lock: punch slot ``s``'s bytes (it then holds none); where a
        fetch may be writing it, under :meth:`fenced`."""
        punch(self.fd, s * self.chunk, self.chunk)
        table = self.refresh()
        if s < len(table):
            table[s, 1] = 0

    def settle(self, spares: list[int]) -> None:
        """Under the folder's lock, at the end of a reservation: punch the slots freed to
        make room that it did not take again."""
        table = self.refresh()
        for s in spares:
            if s < len(table) and table[s, 0] == 0 and table[s, 1] != 0:  # (not cut since)
                self.clean(s)

    def repair(self, held: np.ndarray) -> bool:
        """Under the folder's lock, after a scan of every object: ``held`` are the slots some
        chunk's state words name (fetching or present); any other slot held or holding bytes
        (left by a process killed between its table and its state words, or named by state
        files deleted since) is freed and punched, once no fetch writes it. False where the
        files are not as this layout leaves them (a slot file cut or regrown, a table cut,
        files of another layout: :meth:`sound`), or a slot named is not in the table: then
        nothing is done (the caller empties the folder's chunks of this size)."""
        table = self.refresh()
        if not self.sound() or (len(held) and int(held.max()) >= len(table)):
            return False
        want = np.zeros(len(table), bool)
        want[held[held >= 0]] = True
        want[_mark_slots(0, len(table))] = True
        for s in np.flatnonzero(~want & ((table[:, 0] != 0) | (table[:, 1] != 0))).tolist():
            with self.fenced(s):  # a fetch through deleted state words writes it no more
                table[s, 0] = 0
                self.clean(s)
        table[want, 0] = 1
        self._hint, self._sound = 0, len(table)
        return True

    def sound(self) -> bool:
        """Under the folder's lock: whether the files are as this layout leaves them: the
        table a whole number of regions, the data file as long as its slots, and each
        region's mark slot held and its mark in the data file."""
        table = self.refresh()
        n = len(table)
        if os.fstat(self.fd).st_size != n * self.chunk or (n and _region_end(n - 1) != n):
            return False
        marks = _mark_slots(0, n)
        return all(table[m, 1] == _MARK_TAG and table[m, 0] == 1 and self.marked(m, self.fd)
                   for m in marks)  # fmt: skip

    def marked(self, s: int, fd: int) -> bool:
        """Whether the mark of slot ``s``'s region is in the slot file open as ``fd``: read
        after a slot's bytes were copied, the file was not cut under them before (a cut
        loses the marks past it; no one writes one again while words name its slots)."""
        m = _region_end(s) - 1
        size = min(len(_MARK), self.chunk)
        return os.pread(fd, size, (m + 1) * self.chunk - size) == _MARK[:size]

    def forget(self) -> None:
        """Under the folder's lock: every slot free and empty (a folder of another boot, or
        a slot file cut), once no fetch writes any."""
        with self.fenced(None):
            os.ftruncate(self.fd, 0)
            os.ftruncate(self._table_fd, 0)
        self._hint, self._sound = 0, 0
        self.refresh()

    def purge(self, tag: int) -> None:
        """Under the folder's lock: punch every slot holding bytes of object ``tag``, held or
        free. A slot taken for another object's fetch is punched only before that fetch
        writes it (its writer tags the slot under the slot's lock, which this takes)."""
        for s in np.flatnonzero(self.refresh()[:, 1] == tag).tolist():
            with self.fenced(s):
                table = self.refresh()
                if s < len(table) and table[s, 1] == tag:
                    self.clean(s)

    def _grow(self, slots: int) -> np.ndarray:
        """Under the folder's lock: room in the table for ``slots`` slots, to the end of their
        region (new ones free and empty; the data file grows as slots are written), and the
        table. The marks of the regions entered are written first, past the data file's end
        (``OSError`` where it does not end with the table's slots: cut, or the table cut). The
        table's blocks are written, not left a hole: a word written through the mapping into
        a hole of a full disk kills the process with ``SIGBUS``, where this raises
        ``OSError``."""
        have = os.fstat(self._table_fd).st_size // 16
        end = _region_end(slots - 1)
        if end <= have:
            return self.refresh()
        if os.fstat(self.fd).st_size != have * self.chunk:
            raise OSError(f"the slot file {self._paths()[0]} is not as long as its table")
        size = min(len(_MARK), self.chunk)
        for m in _mark_slots(have, end):
            write_at(self.fd, _MARK[:size], (m + 1) * self.chunk - size)
        write_at(self._table_fd, bytes((end - have) * 16), have * 16)
        table = self.refresh()
        for m in _mark_slots(have, end):
            table[m] = (1, _MARK_TAG)
        return table

    def close(self) -> None:
        self.table = np.zeros((0, 2), np.int64)
        self._map = (-1, self.table)
        for fd in (self.fd, self._table_fd, *self._gone):
            if fd >= 0:
                os.close(fd)
        self.fd = self._table_fd = -1
        self._gone = []


_OPEN: weakref.WeakSet[SlotFile] = weakref.WeakSet()


def _own_files_in_child() -> None:
    """In a forked child: each slot file opened anew under its number. A slot's lock is
    held by the open file, which a child forked while a fetch wrote shares with its parent:
    the parent killed, the child would hold the slot locked, and every removal of a chunk
    fetching into it, under the folder's lock, would wait for the child to end."""
    for slots in list(_OPEN):
        for fd in (slots.fd, *slots._gone):
            if fd < 0:
                continue
            try:
                own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
            except OSError:  # no /proc (no slot locks either: fileio.RANGE_LOCKS)
                continue
            os.dup2(own, fd, inheritable=False)
            os.close(own)


os.register_at_fork(after_in_child=_own_files_in_child)

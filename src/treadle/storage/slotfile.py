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
bound counts (the tail of a short last chunk is punched as well), and nothing else.

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
        before the table grows; -1 where it cannot grow (a full disk)."""
        table = self.refresh()
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
            if not still():
                return False
            write_at(fd, data, at)  # all of it, or an error
            if len(data) < self.chunk:
                punch(fd, at + len(data), self.chunk - len(data))
            self.refresh()[s, 1] = tag  # a purge takes the slot's lock to read it
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
            if table[s, 0] == 0 and table[s, 1] != 0:
                self.clean(s)

    def repair(self, held: np.ndarray, present: np.ndarray) -> bool:
        """Under the folder's lock, after a scan of every object: ``held`` are the slots some
        chunk's state words name (``present``: of present chunks); any other slot held or
        holding bytes (left by a process killed between its table and its state words) is
        freed and punched. False where the slot file does not reach every present chunk's
        slot (removed or cut: then nothing is done)."""
        if len(present) and os.fstat(self.fd).st_size <= int(present.max()) * self.chunk:
            return False
        table = self.refresh()
        if len(held) and int(held.max()) >= len(table):  # the table lost or cut
            table = self._grow(int(held.max()) + 1)
        want = np.zeros(len(table), bool)
        held = held[(held >= 0) & (held < len(table))]
        want[held] = True
        for s in np.flatnonzero(~want & ((table[:, 0] != 0) | (table[:, 1] != 0))).tolist():
            table[s, 0] = 0
            self.clean(s)  # no words name it: no fetch writes it
        table[want, 0] = 1
        self._hint = 0
        return True

    def forget(self) -> None:
        """Under the folder's lock: every slot free and empty (a folder of another boot, or
        a slot file cut), once no fetch writes any."""
        with self.fenced(None):
            os.ftruncate(self.fd, 0)
            os.ftruncate(self._table_fd, 0)
        self._hint = 0
        self.refresh()

    def purge(self, tag: int) -> None:
        """Under the folder's lock: punch every slot holding bytes of object ``tag``, held or
        free. A slot taken for another object's fetch is punched only before that fetch
        writes it (its writer tags the slot under the slot's lock, which this takes)."""
        for s in np.flatnonzero(self.refresh()[:, 1] == tag).tolist():
            with self.fenced(s):
                if self.refresh()[s, 1] == tag:
                    self.clean(s)

    def _grow(self, slots: int) -> np.ndarray:
        """Under the folder's lock: room in the table for ``slots`` slots (new ones free and
        empty; the data file grows as slots are written), and the table. Its blocks are
        written, not left a hole: a word written through the mapping into a hole of a full
        disk kills the process with ``SIGBUS``, where this raises ``OSError``."""
        have = os.fstat(self._table_fd).st_size
        if slots * 16 > have:
            write_at(self._table_fd, bytes(slots * 16 - have), have)
        return self.refresh()

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

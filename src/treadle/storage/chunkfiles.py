"""File-level helpers of the chunk store (:mod:`treadle.storage.chunkstore`): evicting a
chunk (its slot freed), telling whether a fetching process
still lives, whether the folder's chunks were written since the machine booted, and what
``$TREADLE_CHUNK_BYTES`` says."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from treadle.storage.chunkfolder import ABSENT, FETCHING, PRESENT, STATE_MASK, ObjectFiles
from treadle.storage.filecache import parse_bytes

__all__ = [
    "NOT_EVICTED",
    "alive",
    "boot_id",
    "chunk_bytes_setting",
    "dead_fetch",
    "evict",
    "fetcher_id",
    "same_boot",
    "shared_file_system",
]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""Linux's id of this boot of the machine (containers share their host's)."""

PID_BITS = 22
"""A fetcher's id (a chunk's third state word): its process id in the low ``PID_BITS``
bits (Linux's largest), its start time above them. A process id alone is reused: a
container restarted on the same folder gives its processes the ids its killed ones had."""
_PID_MASK = (1 << PID_BITS) - 1
_ME: tuple[int, int] = (0, 0)  # (process id, fetcher id), made again in a forked child


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None where ``/proc`` does
    not say (not Linux, hidden); -1 where there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    return int(raw.rpartition(b")")[2].split()[19])  # field 22, after the command's name


def fetcher_id() -> int:
    """This process's fetcher id (its start time unknown: its process id alone)."""
    global _ME
    pid = os.getpid()
    if _ME[0] != pid:
        start = _start_time(pid)
        _ME = (pid, (start << PID_BITS | pid) if start is not None and start > 0 else pid)
    return _ME[1]


def alive(ids: np.ndarray) -> np.ndarray:
    """Whether each fetcher id (0: none; :func:`fetcher_id`) is a live process's."""
    out = np.zeros(ids.shape, bool)
    seen: dict[int, bool] = {}
    for i, v in enumerate(ids.tolist()):
        if v:
            if v not in seen:
                seen[v] = _alive(int(v))
            out[i] = seen[v]
    return out


def dead_fetch(w: np.ndarray) -> bool:
    """Whether a chunk's state words say a dead process fetches it (killed: never present)."""
    return int(w[0]) & STATE_MASK == FETCHING and not alive(w[2:])[0]


NOT_EVICTED = -2
"""What :func:`evict` returns for a fetch whose writer holds its slot: alive, though taken
for dead (another pid namespace)."""


def evict(obj: ObjectFiles, c: int, keep: bool = False) -> int:
    """Under the folder's lock: mark chunk ``c`` of ``obj`` absent with a new generation
    (readers that copied it in between see the change), then free its slot. ``keep``: a
    present chunk's bytes stay in the slot, for the same reservation to write over (its
    number is returned; :meth:`~treadle.storage.slotfile.SlotFile.settle` punches it if
    not taken); else, or where the chunk was not present (a fetch cut short), they are
    punched and -1 is returned. A fetch whose writer holds the slot now is left as it is:
    :data:`NOT_EVICTED`."""
    w, slot = int(obj.words[c, 0]), int(obj.words[c, 3])
    if slot < 0 or w & STATE_MASK == PRESENT:  # no fetch writes a present chunk's slot
        _absent(obj, c, w)
        if slot < 0:
            return -1
        if keep:
            obj.slots.free(slot)
            return slot
        obj.slots.empty(slot)
        return -1
    with obj.slots.fenced(slot, wait=False) as free:
        if not free:
            return NOT_EVICTED
        _absent(obj, c, w)
        obj.slots.empty(slot)
    return -1


def _absent(obj: ObjectFiles, c: int, w: int) -> None:
    obj.words[c, 0] = ((w >> 2) + 1) << 2 | ABSENT
    obj.words[c, 2] = 0
    obj.words[c, 3] = -1


def _alive(v: int) -> bool:
    pid, start = v & _PID_MASK, v >> PID_BITS
    if v == fetcher_id():
        return True
    if pid == os.getpid():  # this id, another start: a process before this one
        return False
    if start:
        now = _start_time(pid)
        if now is not None:
            return now == start
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def boot_id() -> str | None:
    """This boot's id, or None where the system has none (not Linux)."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


NO_BOOT_ID = f"this system has no boot id ({BOOT_ID})"


def same_boot(directory: Path, forget: Callable[[], None]) -> bool:
    """Under the folder's lock: whether the folder's chunks need no flush to disk before
    they are marked present. They need none where the machine tells its boots apart: until
    it stops, every process reads a chunk's bytes from the one page cache, and a stop
    (power, a crash of the machine) is a new boot, which could leave state words on disk
    that say present without their bytes. So the folder records its boot (a ``.boot``
    file), and one written in another boot (or before boots were recorded) is ``forget``-ed
    (every object's files removed) before anything reads it. False where there is no boot
    id (not Linux): each fetch is flushed (``fdatasync``) before it is marked present."""
    me = boot_id()
    if me is None:
        return False
    mark = directory / ".boot"
    try:
        theirs = mark.read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):  # none, or not a boot id: another boot
        theirs = None
    if theirs != me:
        forget()
        part = directory / ".boot.part"
        part.write_text(me + "\n")
        os.replace(part, mark)
    return True


MOUNTINFO = Path("/proc/self/mountinfo")
"""Linux's mounts of this process: where each is, and its file system type."""

SHARED_FILE_SYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "beegfs", "glusterfs",
    "ocfs2", "gfs2", "afs", "panfs", "wekafs", "fuse.glusterfs", "fuse.ceph-fuse",
    "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.juicefs", "fuse.rclone", "fuse.goofys",
    "fuse.mountpoint-s3",
})  # fmt: skip
"""File systems that machines share (or an object store's mount): a chunk folder there is
not safe (:func:`shared_file_system`)."""


def shared_file_system(directory: Path) -> str | None:
    """The type of the file system ``directory`` is on where other machines may share it
    (:data:`SHARED_FILE_SYSTEMS`), else None (also where the system does not say). The chunk
    cache relies on one page cache: its state words say present once the bytes are in this
    machine's page cache, unflushed, and other processes read them from there. Over NFS (a
    home folder shared by the nodes of a cluster, ``~/.cache``), another machine sees the
    words and the bytes written back in no order, and reads its own cached pages of a slot
    that another chunk has since taken: another chunk's bytes."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    path, best, kind = os.path.realpath(directory), "", None
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if len(fields) < 5 or not tail:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, tail.split()[0]
    return kind if kind in SHARED_FILE_SYSTEMS else None


MIN_BARE_CHUNK_BYTES = 4096
"""The least ``$TREADLE_CHUNK_BYTES`` written without a unit: ``4`` (meant as ``4M``) made
4-byte chunks, 24 bytes of state each, silently. A smaller chunk needs its unit (``256B``)."""

DEFAULT_CHUNK_BYTES = 1 << 20
"""The chunk size with no ``$TREADLE_CHUNK_BYTES``, for a bound of :data:`MIN_CHUNKS`
such chunks or more."""

MIN_CHUNKS = 16
"""Chunks a bound holds at least when the size is not set (Belady's choice needs several,
and a bound under one chunk would turn the cache off)."""


def default_chunk_bytes(max_bytes: int) -> int:
    """The chunk size of a cache bounded by ``max_bytes`` when ``$TREADLE_CHUNK_BYTES`` is not
    set: :data:`DEFAULT_CHUNK_BYTES`, or under a bound of :data:`MIN_CHUNKS` of those the
    largest power of two of which it holds that many, at least :data:`MIN_BARE_CHUNK_BYTES`.
    Every process of a node with the same bound picks the same size."""
    if max_bytes >= MIN_CHUNKS * DEFAULT_CHUNK_BYTES:
        return DEFAULT_CHUNK_BYTES
    fits = max(1, max_bytes // MIN_CHUNKS)
    return max(MIN_BARE_CHUNK_BYTES, 1 << (fits.bit_length() - 1))


def chunk_bytes_for(max_bytes: int, given: int | None) -> tuple[int, str]:
    """The chunk size of a store bounded by ``max_bytes``, and what set it:
    ``$TREADLE_CHUNK_BYTES``, else ``given``, else :func:`default_chunk_bytes` (a small
    bound gets small chunks, not a cache turned off)."""
    if raw := os.environ.get("TREADLE_CHUNK_BYTES"):
        return chunk_bytes_setting(raw), "TREADLE_CHUNK_BYTES"
    if given is not None:
        return given, "chunk_bytes"
    return default_chunk_bytes(max_bytes), "the least size unset"


def chunk_bytes_setting(raw: str) -> int:
    """``$TREADLE_CHUNK_BYTES`` in bytes; a bare number under :data:`MIN_BARE_CHUNK_BYTES`
    is refused naming the setting (a unit forgotten, most likely)."""
    value = parse_bytes(raw, "TREADLE_CHUNK_BYTES")
    if value < 1:
        raise ValueError(f"TREADLE_CHUNK_BYTES={raw!r} must be at least 1 byte")
    bare = raw.strip().upper()[-1:] not in ("K", "M", "G", "T", "B")
    if bare and value < MIN_BARE_CHUNK_BYTES:
        raise ValueError(
            f"TREADLE_CHUNK_BYTES={raw!r} is {value:,} bytes: without a unit it must be at "
            f"least {MIN_BARE_CHUNK_BYTES} (4K); write {raw.strip()}M for MiB, or "
            f"{raw.strip()}B if {value:,}-byte chunks are meant"
        )
    return value

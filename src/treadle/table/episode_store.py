"""The stored episode index: one small object per Lance data fragment, read in O(episodes).

A table version's rows are its fragments' rows in manifest order, and a fragment's data
files never change, so the episode index of a version is the concatenation of its
fragments' runs. Each fragment's runs are stored once, at
``projects/<p>/episodes/<table>/<data file>[-d<read version>-<deletion id>].json``
(keyed by the fragment's data file, which no other fragment or table version shares):
the commit that writes a fragment stores them (:func:`store_episode_index`), and a
table written before treadle stored them gets each fragment's runs computed from that
fragment's ``episode``/``frame`` columns once, on first read, and stored.

Reading a version then reads the manifest's fragment list and one small object per
fragment (O(log rows) of them after compaction) instead of the whole ``frame`` column.
A stored object is checked before it is used: its checksum, its row count against the
fragment's row count in the manifest, and how its runs join the neighbours'. One that
fails is :class:`~treadle.errors.CorruptData` naming the table and the object (delete
it to have it recomputed): a stored index is never used to make up episode boundaries.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle import layout
from treadle.concurrency import CONCURRENCY, submit
from treadle.errors import CorruptData, NotFound
from treadle.table.episodes import (
    EPISODE,
    FRAME,
    EpisodeIndex,
    EpisodeNames,
    LazyEpisodeNames,
    episode_runs,
    first_repeat,
)
from treadle.table.lanceerror import lance_error

if TYPE_CHECKING:
    from treadle.table.table import Table, TableSource

FORMAT = 1


@dataclass(frozen=True)
class FragmentRuns:
    """The episode runs of one fragment: ``first_frame`` > 0 when its first run is the
    tail of an episode the previous fragment began."""

    file: str  # the fragment's first data file: an object copied to another key fails
    rows: int
    first_frame: int
    names: EpisodeNames  # compact (a list is converted): all fragments' are held at once
    lengths: np.ndarray  # int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", EpisodeNames(self.names))
        object.__setattr__(self, "lengths", np.asarray(self.lengths, np.int64))

    def encode(self) -> bytes:
        d = {"format": FORMAT, "file": self.file, "rows": self.rows,
             "first_frame": self.first_frame, "names": list(self.names),
             "lengths": self.lengths.tolist()}  # fmt: skip
        body = json.dumps(d, separators=(",", ":")).encode()
        return b"%08x\n" % zlib.crc32(body) + body

    @classmethod
    def decode(cls, data: bytes, file: str, where: str) -> FragmentRuns:
        """Parse and check the stored object of the fragment whose first data file is
        ``file``; :class:`CorruptData` naming ``where`` when it is damaged."""
        try:
            crc, body = data[:8], data[9:]
            if data[8:9] != b"\n" or int(crc, 16) != zlib.crc32(body):
                raise ValueError("checksum mismatch")
            d = json.loads(body)
            if d.get("format") != FORMAT:
                raise ValueError(f"format {d.get('format')!r}, this treadle reads {FORMAT}")
            names, rows, first = d["names"], int(d["rows"]), int(d["first_frame"])
            if d.get("file") != file:
                raise ValueError(f"it describes data file {d.get('file')!r}")
            lengths = np.asarray(d["lengths"], np.int64)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("names are not strings")
            if lengths.shape != (len(names),):
                raise ValueError("names and lengths differ")
            if (lengths < 1).any() or int(lengths.sum()) != rows or first < 0:
                raise ValueError("run lengths do not add up to its rows")
            runs = cls(file, rows, first, EpisodeNames(names), lengths)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(
                f"{where} is damaged ({e}); delete it to have it recomputed"
            ) from None
        return runs


def _where(table: Table) -> str:
    return f"table {table.name!r} of project {table.project.name!r} (v{table.version})"


def _file(meta: Any) -> str:
    return str(meta.files[0].path).rsplit("/", 1)[-1]


def fragment_key(prefix: str, table: str, meta: Any) -> str:
    """The stored object of one fragment (its data file, and its deletions if any)."""
    stem = _file(meta)
    dele = meta.deletion_file
    tail = "" if dele is None else f"-d{dele.read_version}-{dele.id}"
    return layout.episodes_key(prefix, table, f"{stem}{tail}")


def scan_fragment(fragment: Any, where: str) -> FragmentRuns:
    """The runs of one fragment, from its ``episode``/``frame`` columns (the only scan)."""
    try:
        cols = fragment.to_table(columns=[EPISODE, FRAME])
    except (OSError, pa.ArrowException) as e:
        raise lance_error(e, f"reading the episodes of {where}") from None
    frames = cols.column(FRAME)
    file = _file(fragment.metadata)
    if len(frames) == 0:
        return FragmentRuns(file, 0, 0, [], np.zeros(0, np.int64))
    first = frames[0].as_py()
    first = first if isinstance(first, int) and first > 0 else 0  # episode_runs names bad ones
    idx = episode_runs(cols.column(EPISODE), frames, where, CorruptData, first_frame=first)
    return FragmentRuns(file, len(frames), first, idx.names, idx.lengths)


def _fetch(project: TableSource, name: str, fragment: Any) -> bytes | None:
    """The stored runs object of one fragment, None when there is none."""
    try:
        return project.store.get(fragment_key(project.prefix, name, fragment.metadata))
    except NotFound:
        return None


def fragment_runs(
    project: TableSource, name: str, fragment: Any, where: str, data: Any = ...
) -> FragmentRuns:
    """The stored runs of one fragment of table ``name`` (checked against the fragment),
    computed from the fragment alone and stored when it has none; ``where`` names the
    table version. ``data``: the stored object, fetched already (None: there is none)."""
    meta = fragment.metadata
    store = project.store
    key = fragment_key(project.prefix, name, meta)
    rows = meta.physical_rows - meta.num_deletions
    obj = f"{where}: episode index {key}"
    try:
        if data is ...:
            data = store.get(key)
        if data is None:
            raise NotFound(key)
        runs = FragmentRuns.decode(data, _file(meta), obj)
    except NotFound:
        runs = scan_fragment(fragment, f"{where}, fragment {meta.id}")
        store.put(key, runs.encode())
    if runs.rows != rows:
        raise CorruptData(
            f"{obj} holds {runs.rows} rows, the fragment {rows}; delete it to have it recomputed"
        )
    return runs


def fragments(ds: Any, where: str) -> list[Any]:
    """The fragments of a Lance version (a failure named by ``where``)."""
    try:
        return ds.get_fragments()
    except (OSError, pa.ArrowException) as e:
        raise lance_error(e, f"listing the fragments of {where}") from None


def _all_runs(table: Table, keep: Callable[[FragmentRuns], Any] = lambda r: r) -> list[Any]:
    """``keep(runs)`` of every fragment's runs, in order (each reduced as it is read)."""
    project, name = table.project, table.name
    return _each_fragment(table, lambda f, w, d: keep(fragment_runs(project, name, f, w, d)))


def _each_fragment(table: Table, one: Callable[[Any, str, Any], Any]) -> list[Any]:
    """``one(fragment, where, stored object or None)`` of every fragment, in order; a
    fragment's missing data file is the table's ExpiredCommit where retention took it."""
    try:
        return _fragments_in_order(table, one)
    except NotFound as e:
        raise table.expired_instead(e) from None


def _fragments_in_order(table: Table, one: Callable[[Any, str, Any], Any]) -> list[Any]:
    where = _where(table)
    frags = fragments(table.dataset, where)
    if len(frags) <= 1:
        return [one(f, where, _fetch(table.project, table.name, f)) for f in frags]
    # the objects are fetched on threads, parsed here: JSON parsed on 8 threads left ~70 MB
    # of freed memory in the threads' malloc arenas at 1M episodes (issue 33)
    get = lambda f: _fetch(table.project, table.name, f)  # noqa: E731
    with ThreadPoolExecutor(
        min(CONCURRENCY.episode_index_threads, len(frags)), thread_name_prefix="treadle-ep"
    ) as pool:
        futures = [submit(pool, get, f) for f in frags]  # (pool.map: no work after exit)
        try:
            return [one(f, where, done.result()) for f, done in zip(frags, futures)]
        finally:
            for done in futures:
                done.cancel()  # after a failure: those not started never run


@dataclass(frozen=True)
class _Edges:
    """What the boundaries need of one fragment's runs: its lengths, first and last name."""

    rows: int
    first_frame: int
    lengths: np.ndarray
    head: str
    tail: str

    @classmethod
    def of(cls, p: FragmentRuns) -> _Edges:
        ends = (p.names[0], p.names[-1]) if p.rows else ("", "")
        return cls(p.rows, p.first_frame, p.lengths, *ends)


def fragment_edges(project: TableSource, name: str, fragment: Any, where: str, data: Any) -> _Edges:
    """One fragment's :class:`_Edges`: from its stored object without decoding its names
    when it is in the layout this treadle writes, else as :func:`fragment_runs` gives."""
    edges = None if data is None else _parse_edges(data, _file(fragment.metadata))
    if edges is None:
        return _Edges.of(fragment_runs(project, name, fragment, where, data))
    meta = fragment.metadata
    rows = meta.physical_rows - meta.num_deletions
    if edges.rows != rows:
        key = fragment_key(project.prefix, name, meta)
        raise CorruptData(
            f"{where}: episode index {key} holds {edges.rows} rows, the fragment {rows}; "
            "delete it to have it recomputed"
        )
    return edges


def _parse_edges(data: bytes, file: str) -> _Edges | None:
    """The lengths, first and last name of a stored object (checksum checked) without a
    Python object per episode: its JSON is ``{..."names":[...],"lengths":[...]}`` as
    :meth:`FragmentRuns.encode` writes it, and ``,"names":[`` / ``,"lengths":[`` can only be
    its structure (a quote inside a JSON string is escaped). None when anything differs:
    the full decode then says what is wrong. The names are checked when read."""
    try:
        body = data[9:]
        if data[8:9] != b"\n" or int(data[:8], 16) != zlib.crc32(body):
            return None
        j, i = body.find(b',"names":['), body.rfind(b',"lengths":[')
        if j < 0 or i < j or not body.endswith(b"]}"):
            return None
        head = json.loads(body[:j] + b"}")
        if head.get("format") != FORMAT or head.get("file") != file:
            return None
        rows, first = int(head["rows"]), int(head["first_frame"])
        text = body[i + 12 : -2]
        lengths = np.fromstring(text, np.int64, sep=",") if text else np.zeros(0, np.int64)
        if len(lengths) != (text.count(b",") + 1 if text else 0) or first < 0:
            return None
        if (lengths < 1).any() or int(lengths.sum()) != rows:
            return None
        ends = _end_names(body[j + 9 : i].decode()) if len(lengths) else ("", "")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return None if ends is None else _Edges(rows, first, lengths, *ends)


def _end_names(names: str) -> tuple[str, str] | None:
    """The first and last string of a JSON array of strings (its text)."""
    dec = json.JSONDecoder()
    head, _ = dec.raw_decode(names, 1)
    k = names.rfind('"', 0, len(names) - 2)  # the last string's opening quote ...
    while k > 0 and (k - len(names[:k].rstrip("\\"))) % 2:  # ... not an escaped one
        k = names.rfind('"', 0, k)
    tail, end = dec.raw_decode(names, k)
    if not (isinstance(head, str) and isinstance(tail, str)) or end != len(names) - 1:
        return None
    if names[k - 1] not in "[,":
        return None
    return head, tail


def join_lengths(parts: list[_Edges], where: str) -> np.ndarray:
    """The episodes' lengths from the fragments', in order: a fragment's continued first
    run joins the previous episode (same name, frames go on)."""
    lengths: list[np.ndarray] = []
    last: tuple[str, int] | None = None
    for p in parts:
        if p.rows == 0:
            continue
        ln, k = p.lengths, 0
        if p.first_frame:
            if last is None or last[0] != p.head or last[1] != p.first_frame:
                prev = repr(last[0]) if last else "nothing"
                raise CorruptData(
                    f"{where}: a fragment starts inside episode {p.head!r} at frame "
                    f"{p.first_frame}, after {prev}; frames must run 0, 1, ..., len-1"
                )
            lengths[-1] = lengths[-1].copy()
            lengths[-1][-1] += ln[0]
            k = 1
        if len(ln) > k:
            lengths.append(ln[k:])
        last = (p.tail, int(lengths[-1][-1]))
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)


def _joined_names(table: Table) -> EpisodeNames:
    """The names of a table version's episodes, read again from the stored runs (a
    continued first run is the previous fragment's episode); :class:`CorruptData` when a
    name is used twice."""
    where = _where(table)
    parts = _all_runs(table, lambda p: (p.first_frame, p.names.array) if p.rows else None)
    arrays = [a.slice(1 if first else 0) for first, a in filter(None, parts)]
    names = EpisodeNames(pa.concat_arrays(arrays) if arrays else pa.array([], pa.string()))
    twice = first_repeat(names)
    if twice is not None:
        raise CorruptData(
            f"{where}: episode {names[twice[1]]!r} (column {EPISODE!r}) is used for two "
            "episodes; episode names must be unique in a table"
        )
    return names


def stored_episode_index(table: Table) -> EpisodeIndex:
    """The episode index of a time-indexed pinned table, from its stored fragments' runs
    (the runs of a fragment without them are computed once, from it alone, and stored).
    Its names are read when first used (:class:`LazyEpisodeNames`): a plan and its
    readers hold 16 bytes per episode, not ~30 (issue 33)."""
    project, name = table.project, table.name
    one = lambda f, w, d: fragment_edges(project, name, f, w, d)  # noqa: E731
    ln = join_lengths(_each_fragment(table, one), _where(table))
    starts = np.zeros(len(ln), np.int64)
    np.cumsum(ln[:-1], out=starts[1:])
    names = LazyEpisodeNames(len(ln), lambda: _joined_names(table), _where(table))
    return EpisodeIndex(names, starts, ln)


def compute_episode_index(table: Table) -> EpisodeIndex:
    """The episode index of a pinned table (one episode, the table, when not time-indexed),
    read from its stored form in O(episodes)."""
    if not table.is_time_indexed:
        n = table.num_moments
        return EpisodeIndex([table.name], np.zeros(1, np.int64), np.array([n], np.int64))
    return stored_episode_index(table)


def store_episode_index(
    project: TableSource, name: str, version: int, base: int | None
) -> dict[str, FragmentRuns]:
    """Store the runs of the fragments of table ``name`` at ``version`` that its ``base``
    version lacks (a commit's new and compacted fragments; scanned from those fragments
    alone): a later read of this version scans nothing. Cost: O(what the commit wrote).
    Returns what it stored, by object key."""
    ds = project.open_dataset(name, version)
    if EPISODE not in ds.schema.names or FRAME not in ds.schema.names:
        return {}
    where = f"table {name!r} of project {project.name!r} (v{version})"
    prefix = project.prefix
    known = set()
    if base is not None:
        known = {
            fragment_key(prefix, name, f.metadata)
            for f in fragments(project.open_dataset(name, base), where)
        }
    store = project.store
    stored: dict[str, FragmentRuns] = {}
    for f in fragments(ds, where):
        key = fragment_key(prefix, name, f.metadata)
        if key not in known:
            stored[key] = scan_fragment(f, f"{where}, fragment {f.metadata.id}")
            store.put(key, stored[key].encode())
    return stored

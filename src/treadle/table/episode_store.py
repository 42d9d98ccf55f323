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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle import layout
from treadle.concurrency import CONCURRENCY
from treadle.errors import CorruptData, NotFound
from treadle.table.episodes import EPISODE, FRAME, EpisodeIndex, episode_runs
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
    names: list[str]
    lengths: list[int]

    def encode(self) -> bytes:
        fields = ("file", "rows", "first_frame", "names", "lengths")
        d = {"format": FORMAT, **{k: getattr(self, k) for k in fields}}
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
            runs = cls(file, int(d["rows"]), int(d["first_frame"]), d["names"], d["lengths"])
            if d.get("file") != file:
                raise ValueError(f"it describes data file {d.get('file')!r}")
            lengths = np.asarray(runs.lengths, np.int64)
            if not isinstance(runs.names, list) or not all(isinstance(n, str) for n in runs.names):
                raise ValueError("names are not strings")
            if lengths.shape != (len(runs.names),):
                raise ValueError("names and lengths differ")
            if (lengths < 1).any() or int(lengths.sum()) != runs.rows or runs.first_frame < 0:
                raise ValueError("run lengths do not add up to its rows")
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
        return FragmentRuns(file, 0, 0, [], [])
    first = frames[0].as_py()
    first = first if isinstance(first, int) and first > 0 else 0  # episode_runs names bad ones
    idx = episode_runs(cols.column(EPISODE), frames, where, CorruptData, first_frame=first)
    return FragmentRuns(file, len(frames), first, idx.names, idx.lengths.tolist())


def fragment_runs(project: TableSource, name: str, fragment: Any, where: str) -> FragmentRuns:
    """The stored runs of one fragment of table ``name`` (checked against the fragment),
    computed from the fragment alone and stored when it has none; ``where`` names the
    table version."""
    meta = fragment.metadata
    store = project.store
    key = fragment_key(project.prefix, name, meta)
    rows = meta.physical_rows - meta.num_deletions
    obj = f"{where}: episode index {key}"
    try:
        runs = FragmentRuns.decode(store.get(key), _file(meta), obj)
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


def _all_runs(table: Table) -> list[FragmentRuns]:
    where = _where(table)
    frags = fragments(table.dataset, where)
    if len(frags) <= 1:
        return [fragment_runs(table.project, table.name, f, where) for f in frags]
    with ThreadPoolExecutor(
        min(CONCURRENCY.episode_index_threads, len(frags)), thread_name_prefix="treadle-ep"
    ) as pool:
        return list(pool.map(lambda f: fragment_runs(table.project, table.name, f, where), frags))


def join_runs(parts: list[FragmentRuns], where: str) -> EpisodeIndex:
    """One episode index from the fragments' runs, in order: a fragment's continued first
    run joins the previous episode (same name, frames go on); names stay unique."""
    names: list[str] = []
    lengths: list[int] = []
    for p in parts:
        if p.rows == 0:
            continue
        k = 0
        if p.first_frame:
            if not names or names[-1] != p.names[0] or lengths[-1] != p.first_frame:
                prev = repr(names[-1]) if names else "nothing"
                raise CorruptData(
                    f"{where}: a fragment starts inside episode {p.names[0]!r} at frame "
                    f"{p.first_frame}, after {prev}; frames must run 0, 1, ..., len-1"
                )
            lengths[-1] += p.lengths[0]
            k = 1
        names.extend(p.names[k:])
        lengths.extend(p.lengths[k:])
    if len(set(names)) != len(names):
        seen: set[str] = set()
        twice = next(n for n in names if n in seen or seen.add(n))
        raise CorruptData(
            f"{where}: episode {twice!r} (column {EPISODE!r}) is used for two episodes; "
            "episode names must be unique in a table"
        )
    ln = np.asarray(lengths, np.int64)
    starts = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(ln) else ln
    return EpisodeIndex(names, starts, ln)


def stored_episode_index(table: Table) -> EpisodeIndex:
    """The episode index of a time-indexed pinned table, from its stored fragments' runs
    (the runs of a fragment without them are computed once, from it alone, and stored)."""
    return join_runs(_all_runs(table), _where(table))


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

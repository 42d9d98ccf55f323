"""Column statistics for normalisation: ``table.stats(...)`` -> ``{column: ColumnStats}``.

- **Numeric and tensor columns**: every selected row, read in batches of at most
  ``READ_VALUES`` values (so memory is bounded at any table size); per element, in float64:
  count, mean and population std (Chan's parallel merge of per-batch sums), min, max.
  These are exact up to float64 rounding (the order of additions differs from numpy's
  pairwise sum: agreement to ~1e-12 relative). min and max of an integer column are its
  values, in its dtype (exact past ``2**53``: nanosecond timestamps); mean, std and
  quantiles are float64 (of integers past ``2**53``, rounded as float64 rounds them).
- **Quantiles** ``q01``/``q99`` (numpy's default, linear interpolation): exact while a
  column has at most ``2k`` values per element (``k = max(64, SKETCH_VALUES // elements)``);
  beyond that a deterministic compactor sketch (KLL-style, no randomness) of at most
  ``6k`` items per element whatever the row count (``2k`` per level up to 3 levels, then
  ``6k / levels``: :mod:`treadle.stats.moments`). Its rank error is at most
  :func:`rank_error_bound` ``= ceil(C n / c) + 2^C`` for ``C`` compacted levels and level
  capacity ``c`` (e.g. elements=7: n=1e7, 5e-5 of n; n=1e9, 2.5e-4 of n); the bound is
  stored in ``ColumnStats.rank_error``.
- **Video columns**: per channel over ``frames`` moments sampled without replacement (a
  pure function of ``seed``; all when fewer), decoded by the batch reader's video path;
  uint8 values go into a 256-bin histogram per channel, so every statistic (quantiles
  included) is exact over the sampled frames.

With ``executor`` (``td.RayExecutor()``), numeric and tensor columns are read by its tasks,
consecutive fragments of about ``TASK_VALUES`` values each, every task opening the pinned
version from the project's root; their partial states (moments, sketches) are merged here
by the same ``merge`` that merges batches: count, min, max and exact quantiles equal one
process's, mean and std to ~1e-12 relative. Video columns are sampled in this process.

Each column's result is kept in the project, keyed by table, version (and that version's
manifest fingerprint), column, ``where`` and, for video, ``frames``/``seed``: a second
call on the same version reads it back instead of scanning.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from treadle import layout
from treadle.errors import NotFound, PlanError
from treadle.stats.column_stats import ColumnStats
from treadle.stats.image_stats import first_is_image, image_histogram
from treadle.stats.moments import Moments as _Moments
from treadle.stats.moments import Sketch as _Sketch
from treadle.stats.moments import histogram_moments, rank_error_bound
from treadle.table.image_sizes import is_binary, recorded_images
from treadle.table.tensors import batch_kind, tensor_shape, to_numpy

if TYPE_CHECKING:
    from treadle.table.table import Table

READ_VALUES = 1 << 20  # values (rows x elements) per read batch
SKETCH_VALUES = 1 << 20  # quantile sketch items per level, over all elements of a column
TASK_VALUES = 1 << 26  # values (rows x elements) an executor task reads, about
_ALGO = 5  # bump when a statistic's definition changes: old cached results are ignored
# (4: shifted means, exact std far from 0; NaN quantiles of a compacted sketch; 5: integer
# min/max exact, in the column's dtype)
_QS = (0.01, 0.99)


class TablesAt(Protocol):
    def table_at(self, name: str, version: int, commit_id: str | None = None) -> Table: ...


class Address(Protocol):
    """How an executor's task opens the table's project in its own process (picklable, its
    repr without credentials: a :class:`treadle.catalog.client.ProjectAddress`)."""

    def open(self) -> TablesAt: ...


def _finish(mom: _Moments, qs: list[np.ndarray], shape: tuple[int, ...], err: int) -> ColumnStats:
    def r(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, np.float64).reshape(shape)

    def exact(a: np.ndarray) -> np.ndarray:  # integer min/max stay in their dtype
        a = np.asarray(a)
        return a.reshape(shape) if a.dtype.kind in "iu" else r(a)

    std = np.sqrt(np.maximum(mom.m2 / mom.n, 0.0))
    # a NaN value (min is NaN): NaN quantiles, as numpy's exact ones (a compacted sketch
    # sorts NaN to its end and would give finite ones)
    qs = [np.where(np.isnan(mom.lo), np.nan, q) for q in qs]
    return ColumnStats(np.asarray(mom.n, np.int64), r(mom.mean), r(std), exact(mom.lo), exact(mom.hi),
                       r(qs[0]), r(qs[1]), rank_error=err)  # fmt: skip


# -- the public entry ---------------------------------------------------------------------
def table_stats(
    table: Table,
    columns: Sequence[str] | None = None,
    *,
    where: str | None = None,
    frames: int = 10_000,
    seed: int = 0,
    executor: Any = None,
    address: Address | None = None,
) -> dict[str, ColumnStats]:
    """Statistics of ``columns`` (default: every column that has them) of one pinned table;
    numeric and tensor columns on ``executor`` (e.g. ``td.RayExecutor()``) when given, its
    tasks opening the table's project from ``address`` (the project passes its own)."""
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise PlanError(f"stats: frames must be an integer >= 1, got {frames!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PlanError(f"stats: seed must be an integer, got {seed!r}")
    schema = table.schema
    kinds = {f.name: batch_kind(f) for f in schema}
    for name in recorded_images(schema):  # binary columns of images: cameras, pixel units
        kinds[name] = "video" if kinds.get(name) is None else kinds[name]
    for name in [columns] if isinstance(columns, str) else columns or ():
        if name in kinds and kinds[name] is None and is_binary(schema.field(name).type):
            kinds[name] = "video" if first_is_image(table, name) else None
    if columns is None:
        names = [n for n, k in kinds.items() if k is not None and n not in ("episode", "frame")]
    else:
        names = [columns] if isinstance(columns, str) else list(columns)
        unknown = [c for c in names if c not in kinds]
        if unknown:
            raise NotFound(
                f"table {table.name!r} has no column(s) {unknown}; columns: {schema.names}"
            )
        none = [c for c in names if kinds[c] is None]
        if none:
            raise PlanError(
                f"table {table.name!r}: column(s) {none} have no statistics (not numbers, "
                "tensors or video)"
            )
    if where is not None:
        _check_where(table, names, where)
    cache = _Cache(table)
    out: dict[str, ColumnStats] = {}
    todo: list[str] = []
    for c in names:
        key = cache.key(c, where, (frames, seed) if kinds[c] == "video" else None)
        got = cache.get(key)
        if got is not None:
            out[c] = got
        else:
            todo.append(c)
    plain = [c for c in todo if kinds[c] != "video"]
    computed = _compute_rows(table, plain, where, executor, address) if plain else {}
    for c in todo:
        if kinds[c] == "video":
            computed[c] = _compute_video(table, c, where, frames, seed)
        cache.put(cache.key(c, where, (frames, seed) if kinds[c] == "video" else None), computed[c])
        out[c] = computed[c]
    return {c: out[c] for c in names}


def _check_where(table: Table, names: list[str], where: str) -> None:
    """A ``where`` Lance cannot use (unknown column, no parse, not a predicate) as a
    :class:`PlanError` naming it and the table, before any scan (planning reads no rows)."""
    try:
        table.dataset.scanner(columns=names, filter=where).explain_plan()
    except ValueError as e:
        first = str(e).split(", /")[0]  # drop Lance's Rust source location
        raise PlanError(f"where={where!r} on table {table.name!r}: {first}") from None


def _compute_rows(
    table: Table, names: list[str], where: str | None, executor: Any, address: Address | None
) -> dict[str, ColumnStats]:
    """One streamed scan of ``names`` (here, or a task per group of fragments on
    ``executor``), partial states merged with the same ``merge`` as batches are."""
    if executor is None:
        state = _accumulate(table, names, where)
    else:
        if address is None:
            raise PlanError(f"stats of {table!r} on an executor: no address to open it from")
        tasks = _tasks(table, names, where, address)
        state, *rest = executor.map(_accumulate_task, tasks, _what)
        for part in rest:
            for c in names:
                state[c][0].merge(part[c][0])
                state[c][1].merge(part[c][1])
    shapes = {c: tensor_shape(table.schema.field(c)) or () for c in names}
    out = {}
    for c in names:
        mom, sk = state[c]
        if mom.n == 0:
            raise PlanError(
                f"table {table.name!r}: no rows to compute statistics of column {c!r}"
                + (f" (where {where!r})" if where else "")
            )
        err = rank_error_bound(sk.n, sk.k, sk.compacted_levels)
        out[c] = _finish(mom, sk.quantiles(_QS), shapes[c], err)
    return out


_State = dict[str, tuple[_Moments, _Sketch]]


def _accumulate(
    table: Table, names: list[str], where: str | None, fragments: Sequence[int] | None = None
) -> _State:
    """Moments and sketch of every column over the rows (of ``fragments``, default all)."""
    schema = table.schema
    elements = {c: math.prod(tensor_shape(schema.field(c)) or ()) for c in names}
    rows = max(1, READ_VALUES // max(1, sum(elements.values())))
    state = {c: (_Moments(), _Sketch(elements[c], SKETCH_VALUES)) for c in names}
    for batch in scan_batches(table, names, where, rows, fragments):
        for c in names:
            f = schema.field(c)
            col = batch.column(c)
            if col.null_count:  # rows without a value (appended after an added column): none
                col = col.drop_null()
            raw = to_numpy(col, f, f"table {table.name!r}").reshape(len(col), elements[c])
            # column-major float64 in one pass: the moments reduce and the sketch sorts
            # each element's values contiguously (the sketch keeps this array)
            x = raw.T.astype(np.float64, order="C").T
            state[c][0].add(x, raw=raw)  # integers: min/max exact in their dtype
            state[c][1].add(x)
    return state


@dataclass(frozen=True)
class _Task:
    """One executor task: the pinned table (its project opened from its root) and fragments."""

    project: Address
    table: str
    version: int
    commit_id: str | None
    names: tuple[str, ...]
    where: str | None
    fragments: tuple[int, ...]


def _tasks(table: Table, names: list[str], where: str | None, address: Address) -> list[_Task]:
    """Consecutive fragments, about ``TASK_VALUES`` values per task (one fragment at least)."""
    per_row = sum(math.prod(tensor_shape(table.schema.field(c)) or ()) for c in names)
    groups: list[list[int]] = [[]]
    rows = 0
    for frag in table.dataset.get_fragments():
        if groups[-1] and rows * per_row >= TASK_VALUES:
            groups.append([])
            rows = 0
        groups[-1].append(frag.fragment_id)
        rows += frag.metadata.physical_rows - frag.metadata.num_deletions
    spec = (address, table.name, table.version, table.commit_id, tuple(names), where)
    return [_Task(*spec, tuple(g)) for g in groups]


def _what(task: _Task) -> str:
    return f"statistics of table {task.table!r} v{task.version} (fragments {list(task.fragments)})"


def _accumulate_task(task: _Task) -> _State:
    """An executor task: open the pinned version from the root, accumulate its fragments."""
    table = task.project.open().table_at(task.table, task.version, task.commit_id)
    return _accumulate(table, list(task.names), task.where, task.fragments)


# Lance's default read-ahead (several fragments at once) made a stats scan's RSS grow with the
# table: 315/582/787 MB peak for 2M/10M/20M rows; one fragment ahead and 64 MiB of I/O buffer
# keep it at 265/334/340 MB, and no slower on local disk.
SCAN_READ_AHEAD = {"fragment_readahead": 1, "io_buffer_size": 64 << 20}


def scan_batches(
    table: Table, columns: list[str], where: str | None, rows: int, fragments: Any = None
) -> Any:
    """The table's rows (of the fragments with ids ``fragments``, default all) as Arrow
    record batches of at most ``rows`` rows."""
    ds = table.dataset
    frags = None if fragments is None else [ds.get_fragment(i) for i in fragments]
    try:
        # scanner(): pylance 14's to_batches() ignores fragments= (every row, silently)
        scan = ds.scanner(
            columns=columns, filter=where, batch_size=rows, fragments=frags, **SCAN_READ_AHEAD
        )
        for b in scan.to_batches():
            for off in range(0, b.num_rows, rows):  # Lance may hand back larger batches
                yield b.slice(off, rows)
    except OSError as e:
        raise table.read_error(e, f"reading {table!r}") from None
    except ValueError as e:  # Lance's ArrowInvalid: a missing data file is one too
        gone = table.read_error(e, f"reading {table!r}")
        if not isinstance(gone, NotFound):
            raise
        raise gone from None


def _compute_video(
    table: Table, column: str, where: str | None, frames: int, seed: int
) -> ColumnStats:
    """Per channel, over ``frames`` sampled moments: exact uint8 histograms."""
    from treadle.read.columns import moment_columns
    from treadle.read.sample_reader import SampleReader

    if where is None:
        candidates = np.arange(table.num_moments, dtype=np.int64)
    else:
        got = table.dataset.to_table(columns=["_rowoffset"], filter=where)
        candidates = got.column("_rowoffset").to_numpy().astype(np.int64)
    if not len(candidates):
        raise PlanError(f"table {table.name!r}: no rows to sample column {column!r} from")
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(candidates, size=min(frames, len(candidates)), replace=False))
    if column not in table.video_columns:
        return _from_histogram(image_histogram(table, column, pick), len(pick))
    eps = table.episodes()
    episode = np.searchsorted(eps.starts, pick, side="right") - 1
    hist: np.ndarray | None = None
    reader = SampleReader([table], [moment_columns(table, [column])], ids=False)
    try:
        for e in np.unique(episode):  # one stream (one frame size) at a time
            ms = pick[episode == e]
            for i in range(0, len(ms), 64):
                chunk = ms[i : i + 64]
                out = reader.read(np.zeros(len(chunk), np.int64), chunk)
                px = np.asarray(out[column])
                if px.dtype != np.uint8:
                    raise PlanError(f"column {column!r}: video decodes to {px.dtype}, not uint8")
                px = px.reshape(-1, px.shape[-1])
                h = np.stack([np.bincount(px[:, ch], minlength=256) for ch in range(px.shape[1])])
                hist = h if hist is None else hist + h
    finally:
        reader.close()
    return _from_histogram(hist, len(pick))


def _from_histogram(hist: np.ndarray, frames: int) -> ColumnStats:
    """Exact statistics of integer values 0..255 from per-channel counts ``[C, 256]``."""
    n, mean, std, lo, hi = histogram_moments(hist)
    cum = np.cumsum(hist, axis=1)

    def order_stat(rank: np.ndarray) -> np.ndarray:  # value of the 0-based rank-th item
        return np.array([np.searchsorted(cum[c], rank[c], side="right") for c in range(len(n))],
                        np.float64)  # fmt: skip

    qs = []
    for q in _QS:
        h = q * (n - 1)
        a, b = order_stat(np.floor(h)), order_stat(np.ceil(h))
        qs.append(a + (h - np.floor(h)) * (b - a))
    return ColumnStats(n[0].astype(np.int64), mean, std, lo, hi, qs[0], qs[1], video=True,
                       samples=frames)  # fmt: skip


# -- kept in the project ------------------------------------------------------------------
def version_identity(table: Table) -> str:
    """The pinned version's manifest fingerprint (``"unknown"`` without one): a table
    dropped and re-created reuses version numbers, never this."""
    return _Cache(table)._ident


class _Cache:
    """``projects/<p>/stats/<table>/v<version>/<key>.json``: one object per column."""

    def __init__(self, table: Table):
        self.table = table
        self.store = table.project.store
        self.base = layout.stats_folder(table.project.prefix, table.name, table.version)
        self._ident = self._identity()

    def _identity(self) -> str:
        # the version's manifest: a table dropped and re-created reuses version numbers
        manifest = f"_versions/{2**64 - 1 - self.table.version}.manifest"
        try:
            size, token = self.store.fingerprint(
                f"{layout.table_key(self.table.project.prefix, self.table.name)}/{manifest}"
            )
        except NotFound:
            return "unknown"
        return f"{size}:{token}"

    def key(self, column: str, where: str | None, video: tuple[int, int] | None) -> str:
        spec = {"algo": _ALGO, "column": column, "where": where, "video": video, "id": self._ident}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: str) -> ColumnStats | None:
        if self._ident == "unknown":
            return None
        try:
            data = self.store.get(f"{self.base}/{key}.json")
        except NotFound:
            return None
        return ColumnStats.from_dict(json.loads(data))

    def put(self, key: str, stats: ColumnStats) -> None:
        if self._ident == "unknown":
            return  # no identity for this version: never risk reading another's results
        self.store.put(f"{self.base}/{key}.json", json.dumps(stats.to_dict()).encode())

"""A pinned table (:class:`Table`): one Lance version of one table, read by moment id.

A table knows no branches: a branch-relative name (:class:`treadle.TableRef`) resolves to
one of these through the catalog.

Rows are *moments*. A moment's id is its row position in the pinned Lance version,
``0 .. num_moments - 1``. Time-indexed tables carry ``episode`` (string) and
``frame`` (int32, contiguous from 0) columns; an episode's rows are contiguous (the
rules and the episode index are in :mod:`treadle.table.episodes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from treadle.errors import ExpiredCommit, NotFound, TreadleError
from treadle.storage.credsource import advice
from treadle.table.column_meta import column_metadata
from treadle.table.episodes import EPISODE, FRAME, EpisodeIndex
from treadle.table.fps import schema_fps
from treadle.table.lanceerror import lance_error
from treadle.table.source_meta import source_meta
from treadle.table.source_stats import source_stats
from treadle.table.tensors import is_video

__all__ = [
    "EPISODE",
    "FRAME",
    "EpisodeIndex",
    "ScanRequest",
    "Table",
    "TableSource",
]

if TYPE_CHECKING:
    import lance

    from treadle.storage import Store


class TableSource(Protocol):
    """Where a :class:`Table`'s versions come from (a :class:`treadle.Project`): what a
    table and the modules reading it (its stored episode index, statistics, fixed-width
    reads) use of its project, and nothing more. Statistics are asked of it: the project
    computes them (:mod:`treadle.stats`, above this layer) and keeps them."""

    name: str
    prefix: str  # the project's key prefix (treadle.layout.project_prefix)

    @property
    def store(self) -> Store: ...

    def table_uri(self, name: str) -> str: ...

    def open_dataset(
        self, name: str, version: int, commit_id: str | None = None
    ) -> lance.LanceDataset: ...

    def episode_index(self, table: Table) -> EpisodeIndex: ...

    def expired(self, name: str, commit_id: str) -> TreadleError | None:
        """The error of reading table ``name`` at commit ``commit_id`` if retention
        expired that commit (:class:`~treadle.errors.ExpiredCommit`), else None."""
        ...

    def purged(self, name: str, version: int, fresh: bool = False) -> Mapping[str, TreadleError]:
        """``{episode: error}`` of the episodes of table ``name`` at ``version`` that a
        purge removed (:class:`~treadle.errors.Purged`; ``fresh``: the purges read from
        storage now, not as this process last read them); reading them raises it."""
        ...

    def table_stats(
        self, table: Table, columns: Sequence[str] | str | None, *, where: str | None,
        frames: int, seed: int, executor: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """:meth:`Table.stats` (:func:`treadle.stats.table_stats.table_stats`)."""
        ...

    def plan_stats(
        self, plan: Any, columns: Sequence[str] | str | None, *, per_offset: bool,
        derive: Mapping[str, Callable[[dict[str, Any]], Any]] | None, by_component: bool,
        quantiles: Sequence[float], frames: int, steps: Any, derive_version: str | int | None,
    ) -> dict[str, Any]:  # fmt: skip
        """``plan.stats`` of a plan whose first table is this project's
        (:func:`treadle.stats.plan_stats.plan_stats`; a plan is above this layer)."""
        ...


@dataclass(frozen=True)
class ScanRequest:
    """What a :class:`treadle.ScanDataset` reads: columns (and a filter) of one pinned table."""

    table: Table
    columns: tuple[str, ...]
    filter: str | None = None


_WRITES = frozenset({"append", "append_episode", "add_column", "annotate", "update",
                     "rename_columns", "drop_columns", "delete_episodes", "compact"})  # fmt: skip


class Table:
    """One table pinned to one Lance version (immutable; reads never see later commits)."""

    def __init__(self, project: TableSource, name: str, version: int, commit_id: str | None):
        self.project = project
        self.name = name
        self.version = int(version)
        self.commit_id = commit_id

    def __repr__(self) -> str:
        at = self.commit_id[:8] if self.commit_id else "?"
        return f"Table({self.project.name}/{self.name} @ {at} v{self.version})"

    def __getattr__(self, attr: str) -> Any:
        if attr in _WRITES:  # a pinned version never changes: say where changes go
            raise AttributeError(
                f"{self!r} is one pinned version, which never changes (a run pinned to it "
                f"reads it as it is): {attr}() is a change of the table on a branch, "
                f"branch.table({self.name!r}).{attr}(...), a new version"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    @property
    def uri(self) -> str:
        return self.project.table_uri(self.name)

    @property
    def dataset(self) -> lance.LanceDataset:
        return self.project.open_dataset(self.name, self.version, self.commit_id)

    def read_error(self, e: BaseException, where: str) -> TreadleError:
        """A failed read of this version as a treadle error naming ``where``
        (:func:`lance_error`). A missing file is asked of the project only then: the
        handle was opened before gc expired this commit, and the error says so
        (:class:`~treadle.errors.ExpiredCommit`, naming the table and the commit)."""
        store = self.project.store
        return self.expired_instead(lance_error(e, where, advice(store.credentials), store.place))

    def expired_instead(self, err: TreadleError) -> TreadleError:
        """``err``, or the project's :class:`~treadle.errors.ExpiredCommit` where ``err``
        is a missing file of this version and retention expired its commit (or an error
        saying a purge rewrote the version after this process opened it)."""
        if isinstance(err, NotFound) and self.commit_id is not None:
            err = self.project.expired(self.name, self.commit_id) or err
        if isinstance(err, NotFound) and not isinstance(err, ExpiredCommit):
            for gone in self.project.purged(self.name, self.version, True).values():
                return TreadleError(  # a handle opened before a purge replaced the version
                    f"{err}: a purge (commit {getattr(gone, 'commit', '')[:8]}) rewrote "
                    f"{self!r} after this process opened it; open the project again "
                    "(a new td.Client) to read its other episodes"
                )
        return err

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.schema

    @cached_property
    def num_moments(self) -> int:
        return self.dataset.count_rows()

    @property
    def is_time_indexed(self) -> bool:
        names = self.schema.names
        return EPISODE in names and FRAME in names

    @property
    def video_columns(self) -> list[str]:
        return [f.name for f in self.schema if is_video(f)]

    @property
    def fps(self) -> float | None:
        """Frames per second, set by the table's first write that names one; None if none did."""
        return schema_fps(self.schema)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes())

    def episodes(self) -> EpisodeIndex:
        """Episode boundaries (cached per table version)."""
        return self.project.episode_index(self)

    def purged(self, fresh: bool = False) -> Mapping[str, TreadleError]:
        """``{episode: td.Purged}`` of this version's episodes that a purge removed: a plan
        whose anchors reach one, and a read that returns one of their rows, raise it
        (``fresh``: purges read from storage now, as planning does)."""
        return self.project.purged(self.name, self.version, fresh)

    def check_rows(self, rows: np.ndarray) -> None:
        """Raise ``IndexError`` if any of ``rows`` (moment ids) is not a row of this version."""
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_moments):
            raise IndexError(
                f"row ids out of range for table {self.name!r} with {self.num_moments} moments"
            )

    def check_not_purged(self, rows: np.ndarray) -> None:
        """Raise :class:`~treadle.errors.Purged` if any of ``rows`` (moment ids) belongs
        to a purged episode of this version."""
        purged = self.purged()
        if not purged or not len(rows):
            return
        idx, rows = self.episodes(), np.asarray(rows, np.int64)
        for name, err in purged.items():
            if name in idx.names:
                i = idx.names.index(name)
                start, n = int(idx.starts[i]), int(idx.lengths[i])
                if np.any((rows >= start) & (rows < start + n)):
                    raise err

    def _check_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return None
        if isinstance(columns, str):
            columns = [columns]
        unknown = [c for c in columns if c not in self.schema.names]
        if unknown:
            raise NotFound(
                f"table {self.name!r} has no column(s) {unknown}; columns: {self.schema.names}"
            )
        return list(columns)

    def to_arrow(self, columns: Sequence[str] | None = None, filter: str | None = None) -> pa.Table:
        """Every row (optionally some columns / a Lance SQL filter) as an Arrow table."""
        cols = self._check_columns(columns)
        if self.purged():  # which rows a filter keeps: their positions say
            self.check_not_purged(self.matching_rows(filter))
        try:
            return self.dataset.to_table(columns=cols, filter=filter)
        except (OSError, pa.ArrowException) as e:  # a bad filter stays a ValueError
            raise self.read_error(e, f"reading {self!r}") from None

    def take(
        self, rows: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Rows at these moment ids, in the order given."""
        idx = np.asarray(rows, dtype=np.int64)
        self.check_rows(idx)
        cols = self._check_columns(columns)
        self.check_not_purged(idx)
        try:
            return self.dataset.take(idx, columns=cols)
        except (OSError, pa.ArrowException) as e:  # a bad filter stays a ValueError
            raise self.read_error(e, f"reading rows of {self!r}") from None

    def stats(
        self,
        columns: Sequence[str] | None = None,
        *,
        where: str | None = None,
        frames: int = 10_000,
        seed: int = 0,
        executor: Any = None,
    ) -> dict[str, Any]:
        """Normalisation statistics ``{column: td.ColumnStats}`` of this version, computed
        once and kept in the project (:mod:`treadle.stats.table_stats` says how, and how exact).
        ``executor`` (``td.RayExecutor()``): numeric and tensor columns are read by its
        tasks, a group of fragments each, and merged here (video stays in this process).
        A version a purge reached raises :class:`~treadle.errors.Purged`."""
        for err in self.purged(fresh=True).values():
            raise err
        return self.project.table_stats(
            self, columns, where=where, frames=frames, seed=seed, executor=executor
        )

    def source_stats(self) -> dict[str, dict[str, Any]]:
        """Statistics the source of an import shipped for this version (LeRobot's
        ``meta/stats.json``), as given: ``{column: {"mean": array, ..., "source": str}}``."""
        return source_stats(self)

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """What the source of an import said of the whole dataset (an HDF5 file's ``data``
        attributes: robomimic's ``env_args``, LIBERO's ``problem_info``); {} when none."""
        return dict(source_meta(self).get("metadata") or {})

    def episode_sets(self) -> dict[str, list[str]]:
        """Named sets of episodes an import's source defined (robomimic's filter keys
        ``mask/<key>``): ``{name: [episode, ...]}``, only episodes this version has."""
        sets = source_meta(self).get("episode_sets") or {}
        have = set(self.episodes().names)
        return {k: [e for e in v if e in have] for k, v in sets.items()}

    def column_metadata(self, column: str) -> dict[str, Any]:
        """What the writers of ``column`` said of it: ``{name: JSON value}`` given with
        ``append_episode(..., column_metadata=...)`` (a ROS ``JointState`` column's
        ``joint_names``); {} when none (:mod:`treadle.table.column_meta`)."""
        self._check_columns([column])
        return column_metadata(self.schema.field(column))

    def matching_rows(self, filter: str | None) -> np.ndarray:
        """Row positions (moment ids) of the rows a Lance SQL ``filter`` keeps, sorted;
        every row without one."""
        if not filter:
            return np.arange(self.num_moments, dtype=np.int64)
        ds = self.dataset
        starts, pos = {}, 0
        try:
            for frag in ds.get_fragments():
                starts[frag.fragment_id] = pos
                pos += frag.count_rows()
            got = ds.to_table(columns=[], filter=filter, with_row_address=True)
        except (OSError, pa.ArrowException) as e:  # a bad filter stays a ValueError
            raise self.read_error(e, f"filtering {self!r} by {filter!r}") from None
        addr = got.column("_rowaddr").to_numpy().astype(np.uint64)
        frag_ids = (addr >> np.uint64(32)).astype(np.int64)
        offsets = (addr & np.uint64(0xFFFFFFFF)).astype(np.int64)
        base = np.array([starts[f] for f in frag_ids], dtype=np.int64) if len(addr) else frag_ids
        return np.sort(base + offsets)

    def select_runs(self, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows whose own values satisfy the Lance SQL predicate ``where``, as sorted runs
        ``(begin, end)`` of row ids (one streaming scan; memory proportional to the runs).
        A predicate that does not parse, names an unknown column or is not a boolean is a
        :class:`~treadle.errors.PlanError` naming it; a null result does not select."""
        from treadle.errors import PlanError

        begins: list[np.ndarray] = [np.zeros(0, np.int64)]
        ends: list[np.ndarray] = [np.zeros(0, np.int64)]
        base = 0
        try:
            # the row address (computed, never read) makes a constant predicate ("true"),
            # which names no column, a scan Lance accepts
            scanner = self.dataset.scanner(
                columns={"_treadle_where": f"({where})"}, with_row_address=True
            )
            for batch in scanner.to_batches():
                col = batch.column(0)
                if not pa.types.is_boolean(col.type):
                    raise PlanError(
                        f"where={where!r} on table {self.name!r} is {col.type}, not a predicate"
                    )
                sel = col.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int8)
                edges = np.diff(np.concatenate([[0], sel, [0]]))
                begins.append(np.flatnonzero(edges == 1) + base)
                ends.append(np.flatnonzero(edges == -1) + base)
                base += len(sel)
        except PlanError:
            raise
        except ValueError as e:  # Lance: unknown column, a predicate that does not parse
            gone = self.read_error(e, f"evaluating where={where!r} on {self!r}")
            if isinstance(gone, ExpiredCommit):  # not the predicate: a data file gc took
                raise gone from None
            first = str(e).split(", /")[0]
            raise PlanError(f"where={where!r} on table {self.name!r}: {first}") from None
        except (OSError, pa.ArrowException) as e:
            raise self.read_error(e, f"evaluating where={where!r} on {self!r}") from None
        begin = np.concatenate(begins).astype(np.int64)
        end = np.concatenate(ends).astype(np.int64)
        if begin.size < 2:
            return begin, end
        joined = begin[1:] == end[:-1]  # a run that goes on across two scan batches
        return begin[np.concatenate([[True], ~joined])], end[np.concatenate([~joined, [True]])]

    def scan_request(self, columns: Sequence[str], filter: str | None = None) -> ScanRequest:
        """Describe a plain scan of ``columns`` for :class:`treadle.ScanDataset`."""
        cols = self._check_columns(columns) or []
        return ScanRequest(self, tuple(cols), filter)

"""Assemble one step's batch for one rank: plan -> rows + video windows -> arrays.

Stages, each explicit:

1. **Plan.** ``plan.batch(step, rank, world_size)`` gives (component, moment) per slot.
2. **Rows.** For every ``Rows`` window (or every plain column when a component has no
   windows), the rows ``moment + offset`` of all samples of a component are read with
   one Lance ``take`` and reshaped to ``[n, T, ...]``.
3. **Video.** Every ``Video`` window becomes a :class:`~treadle.video.WindowRequest` that
   decodes straight into its slice of the preallocated batch array; all windows of the
   step are fetched together (coalesced byte ranges, many in flight).

The result is a dict of numpy arrays in slot order (strings and variable-length lists as
Python lists), plus ``_component``/``_moment``/``_episode``/``_frame``.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.windows import Rows, Video, Windows, batch_column_kind, default_columns
from treadle.read.rows import IS_PAD, episode_bounds, listed_values, pad_columns, padded_rows
from treadle.read.stream_cache import StreamIndexCache
from treadle.table.tensors import to_numpy

_TAKE_THREADS = 4  # row takes in flight at once (this step's and the next one's)


@dataclass(frozen=True)
class ColumnSpec:
    """How one output column is made for one component."""

    column: str
    spec: Rows | Video | None  # None: the column at the moment itself, no time axis
    video: bool
    at_moment: bool = False  # a video frame at the moment itself: no time axis in the batch
    listed: bool = False  # strings, variable-length lists: a Python list per sample
    name: str = ""  # the batch's name for it (``Component(rename=...)``); "" = ``column``

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.column)


def output_columns(plan: Any) -> list[list[ColumnSpec]]:
    """Per component, the output columns; every component must give the same names."""
    per: list[list[ColumnSpec]] = []
    for c in range(plan.num_components):
        table = plan.table(c)
        windows: Windows | None = plan.windows(c)
        schema = table.schema
        specs: list[ColumnSpec] = []
        if windows is None or not windows.specs:
            specs = moment_columns(table)
        else:
            for col, spec in windows.items():
                kind = batch_column_kind(table, schema.field(col))
                specs.append(ColumnSpec(col, spec, kind == "video", listed=kind == "list"))
        rename = dict(plan.record.components[c].rename or ())
        if rename:
            specs = [dataclasses.replace(cs, name=rename.get(cs.column, cs.column)) for cs in specs]
        per.append(specs)
    names = [sorted(s.name for s in specs) for specs in per]
    for c, n in enumerate(names[1:], start=1):
        if n != names[0]:
            raise PlanError(
                f"components must give the same columns to stack a batch: component 0 gives "
                f"{names[0]}, component {c} gives {n}"
            )
    return per


def squeeze_moment_video(out: dict[str, Any], columns: list[ColumnSpec]) -> None:
    """Drop the length-1 time axis of video columns read at the moment itself."""
    for cs in columns:
        if cs.at_moment and cs.name in out and out[cs.name].ndim >= 2:
            out[cs.name] = out[cs.name][:, 0]


def moment_columns(table: Any, columns: list[str] | None = None) -> list[ColumnSpec]:
    """Columns at the moment itself (no time axis), video columns decoded to one frame.

    ``columns=None`` means :func:`~treadle.plan.windows.default_columns`; a column a batch
    cannot hold is an error naming it, never left out silently.
    """
    wanted = default_columns(table) if columns is None else columns
    out = []
    for f in table.schema:
        if f.name not in wanted:
            continue
        kind = batch_column_kind(table, f)
        if kind == "video":
            out.append(ColumnSpec(f.name, Video([0]), True, at_moment=True))
        else:
            out.append(ColumnSpec(f.name, None, False, listed=kind == "list"))
    return out


class BatchReader:
    """Reads the batches of one plan for one rank. Safe to call from one thread at a time.

    ``plan`` may be None for a reader used only through :meth:`fill` (``ScanDataset``);
    then ``project`` must be given.
    """

    def __init__(
        self, plan: Any, *, video_threads: int = 1, project: Any = None, device: Any = None
    ):
        from treadle.gpu import select_backend

        self.plan = plan
        self.columns = output_columns(plan) if plan is not None else []
        project = project if project is not None else plan.table(0).project
        # CUDA devices decode with NVDEC straight into device tensors when the hardware
        # can (else a one-time warning and the CPU path); everything else decodes on CPU.
        self.backend = select_backend(device)
        self._video = self.backend.video_reader(
            project.client.store, prefix=project.prefix, threads=video_threads
        )
        self.streams = StreamIndexCache()  # the episodes' stream indexes, bounded
        self._pool: ThreadPoolExecutor | None = None
        # plans without video read one step ahead (row takes only; video has its own reader)
        self._rows_only = plan is not None and not any(
            cs.video for specs in self.columns for cs in specs
        )
        self._pads = pad_columns(self.columns)
        self._ahead: tuple[Any, ...] | None = None
        self._last: tuple[int, int, int] | None = None

    def close(self) -> None:
        self._video.close()
        if self._ahead is not None:
            for f in self._ahead[3]:
                f.cancel()
            self._ahead = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def read(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, np.ndarray]:
        """The batch of ``step`` for ``rank``: arrays ``[b, ...]`` in slot order."""
        if self._rows_only:
            return self._read_rows(step, rank, world_size)
        batch = self.plan.batch(step, rank, world_size)
        return self.read_samples(batch.component, batch.moment)

    def read_samples(self, component: np.ndarray, moment: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of these (component, moment) samples, in this order (any plan order)."""
        out: dict[str, Any] = self._start(len(moment))
        requests: list[Any] = []
        jobs: list[tuple[Any, list[ColumnSpec], np.ndarray, np.ndarray]] = []
        for c in np.unique(component):
            slots = np.flatnonzero(component == c)
            table = self.plan.table(int(c))
            reqs, rows = self._split(
                table, self.columns[int(c)], moment[slots], slots, out, len(moment)
            )
            requests += reqs
            jobs += rows
        self._take_rows(jobs, out, len(moment))
        self.decode(requests)
        squeeze_moment_video(out, [cs for specs in self.columns for cs in specs])
        self._ids(component, moment, out)
        return out

    def _read_rows(self, step: int, rank: int, world_size: int) -> dict[str, np.ndarray]:
        """:meth:`read` for plans without video: the takes of the next step this reader will
        be asked for (same stride as the last two calls) start while this one is returned."""
        key = (step, rank, world_size)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == key:
            _, batch, jobs, futures = ahead
        else:
            if ahead is not None:
                for f in ahead[3]:
                    f.cancel()
            batch = self.plan.batch(step, rank, world_size)
            jobs = self._row_jobs(batch)
            futures = [self._executor().submit(self._rows, t, g, m) for t, g, m, _ in jobs]
        last, self._last = self._last, key
        if last is not None and last[1:] == key[1:] and step > last[0]:
            nxt = (2 * step - last[0], rank, world_size)
            nb = self.plan.batch(*nxt)
            nj = self._row_jobs(nb)
            self._ahead = (
                nxt,
                nb,
                nj,
                [self._executor().submit(self._rows, t, g, m) for t, g, m, _ in nj],
            )
        out = self._start(len(batch))
        self._write_rows(jobs, [f.result() for f in futures], out, len(batch))
        self._ids(batch.component, batch.moment, out)
        return out

    def _ids(self, component: np.ndarray, moment: np.ndarray, out: dict[str, Any]) -> None:
        """``_component``, ``_moment``, and the anchor's ``_episode`` (index in its table)
        and ``_frame``: int64 ``[b]``."""
        component = np.asarray(component, np.int64)
        moment = np.asarray(moment, np.int64)
        episode = np.zeros(len(moment), np.int64)
        frame = np.zeros(len(moment), np.int64)
        for c in np.unique(component):
            slots = np.flatnonzero(component == c)
            m = moment[slots]
            e, first = episode_bounds(self.plan.table(int(c)), m)
            episode[slots], frame[slots] = e, m - first
        out["_component"] = component
        out["_moment"] = moment
        out["_episode"] = episode
        out["_frame"] = frame

    def _start(self, b: int) -> dict[str, Any]:
        """A batch's dict, with every ``_is_pad`` column it carries (False where unpadded)."""
        return {k: np.zeros((b, t), np.bool_) for k, t in self._pads.items()}

    def _row_jobs(self, batch: Any) -> list[tuple[Any, list[ColumnSpec], np.ndarray, np.ndarray]]:
        jobs = []
        for c in np.unique(batch.component):
            slots = np.flatnonzero(batch.component == c)
            table = self.plan.table(int(c))
            _, rows = self._split(table, self.columns[int(c)], batch.moment[slots], slots, {}, 0)
            jobs += rows
        return jobs

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=_TAKE_THREADS, thread_name_prefix="treadle-take"
            )
        return self._pool

    def fill(
        self,
        table: Any,
        columns: list[ColumnSpec],
        moments: np.ndarray,
        slots: np.ndarray,
        out: dict[str, Any],
        b: int,
    ) -> list[Any]:
        """Write rows of ``moments`` into ``out[col][slots]``; return the video reads to do."""
        requests, jobs = self._split(table, columns, moments, slots, out, b)
        self._take_rows(jobs, out, b)
        return requests

    def _split(
        self,
        table: Any,
        columns: list[ColumnSpec],
        moments: np.ndarray,
        slots: np.ndarray,
        out: dict[str, Any],
        b: int,
    ) -> tuple[list[Any], list[tuple[Any, list[ColumnSpec], np.ndarray, np.ndarray]]]:
        """Video reads to do, and row takes to do: one per set of rows (same offsets)."""
        requests = []
        groups: dict[tuple[int, ...] | None, list[ColumnSpec]] = {}
        for cs in columns:
            if cs.video:
                requests.extend(self._video_requests(table, cs, moments, slots, out, b))
            else:
                key = None if cs.spec is None else (tuple(cs.spec.offsets), cs.spec.pad)
                groups.setdefault(key, []).append(cs)
        return requests, [(table, group, moments, slots) for group in groups.values()]

    def _take_rows(
        self,
        jobs: list[tuple[Any, list[ColumnSpec], np.ndarray, np.ndarray]],
        out: dict[str, Any],
        b: int,
    ) -> None:
        """Run the row takes (several at once: Lance releases the GIL, and on an object
        store each take waits on requests), then write them into ``out`` in job order."""
        if len(jobs) > 1:
            results = list(self._executor().map(lambda j: self._rows(j[0], j[1], j[2]), jobs))
        else:
            results = [self._rows(j[0], j[1], j[2]) for j in jobs]
        self._write_rows(jobs, results, out, b)

    def _write_rows(
        self,
        jobs: list[tuple[Any, list[ColumnSpec], np.ndarray, np.ndarray]],
        results: list[tuple[list[np.ndarray], np.ndarray | None]],
        out: dict[str, Any],
        b: int,
    ) -> None:
        for (table, group, _, slots), (arrays, pad) in zip(jobs, results):
            for cs, arr in zip(group, arrays):
                if cs.listed:
                    held = out.setdefault(cs.name, [None] * b)
                    for s, v in zip(slots.tolist(), arr):
                        held[s] = v
                    continue
                dest = out.get(cs.name)
                if dest is None:
                    dest = out[cs.name] = np.empty((b, *arr.shape[1:]), arr.dtype)
                _check_shape(dest, arr, cs.column, table.name)
                dest[slots] = arr
            if pad is not None:  # after the shape checks: same window length everywhere
                for cs in group:
                    out[f"{cs.name}{IS_PAD}"][slots] = pad

    def decode(self, requests: list[Any]) -> None:
        """Run the video reads :meth:`fill` returned (one coalesced fetch, then decode)."""
        if requests:
            self._video.read(requests)

    # -- rows ---------------------------------------------------------------------------
    def _rows(
        self, table: Any, group: list[ColumnSpec], moments: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """The rows ``moment + offset`` of every column of ``group`` (same offsets): one take;
        and, for a padded group, where the rows were clamped to the episode."""
        spec = group[0].spec
        offsets = np.asarray(spec.offsets if spec is not None else [0], np.int64)
        pad = None
        if spec is not None and spec.pad:
            grid, pad = padded_rows(table, moments, offsets)
            rows = grid.reshape(-1)
        else:
            rows = (moments[:, None] + offsets[None, :]).reshape(-1)
        uniq, inverse = np.unique(rows, return_inverse=True)
        got = table.take(uniq, [cs.column for cs in group])
        out = []
        same = len(uniq) == len(rows) and np.array_equal(uniq, rows)
        for cs in group:
            if cs.listed:
                out.append(listed_values(got.column(cs.column), inverse, same, spec, len(offsets)))
                continue
            values = to_numpy(
                got.column(cs.column), got.schema.field(cs.column), f"table {table.name!r}"
            )
            if not same:
                values = values[inverse]
            if spec is not None:
                values = values.reshape((len(moments), len(offsets), *values.shape[1:]))
            out.append(values)
        return out, pad

    # -- video --------------------------------------------------------------------------
    def _video_requests(
        self,
        table: Any,
        cs: ColumnSpec,
        moments: np.ndarray,
        slots: np.ndarray,
        out: dict[str, np.ndarray],
        b: int,
    ) -> list[Any]:
        from treadle.video import WindowRequest
        from treadle.video.decode import allocate, output_shape

        episodes = table.episodes()
        spec: Video = cs.spec  # type: ignore[assignment]
        offsets = np.asarray(spec.offsets, np.int64)
        reqs = []
        if spec.pad:
            grid, pad = padded_rows(table, moments, offsets)
            out[f"{cs.name}{IS_PAD}"][slots] = pad
        self.streams.load(table, cs.column, episode_bounds(table, moments)[0])
        for i, (slot, m) in enumerate(zip(slots, moments)):
            e = int(np.searchsorted(episodes.starts, m, side="right") - 1)
            key, index = self._index(table, cs.column, e)
            frame = int(m - episodes.starts[e])
            # padded: the episode's edge frames, repeated (decoded once, copied per slot)
            frames = grid[i] - episodes.starts[e] if spec.pad else frame + offsets
            shape = output_shape(index, spec, len(offsets))
            dest = out.get(cs.name)
            if dest is None:
                one = allocate(index, spec, len(offsets))
                if self.backend.on_device:
                    dtype = (
                        one.dtype if isinstance(one, torch.Tensor) else torch.from_numpy(one).dtype
                    )
                    dest = torch.empty((b, *shape), dtype=dtype, device=self.backend.device)
                elif isinstance(one, np.ndarray):
                    dest = np.empty((b, *shape), one.dtype)
                else:
                    dest = one.new_empty((b, *shape))
                out[cs.name] = dest
            target = dest[slot]
            if tuple(target.shape) != shape:
                raise PlanError(
                    f"column {cs.column!r}: episode {episodes.names[e]!r} of table "
                    f"{table.name!r} decodes to {shape}, the batch holds {tuple(target.shape)}; "
                    "give the Video spec a size=(H, W) to stack streams of different sizes"
                )
            reqs.append(
                WindowRequest(
                    key=key,
                    index=index,
                    frames=frames,
                    spec=spec,
                    where=(table.name, episodes.names[e], cs.column),
                    out=target,
                )
            )
        return reqs

    def _index(self, table: Any, column: str, episode: int) -> tuple[str, Any]:
        return self.streams.get(table, column, episode)


def _check_shape(dest: np.ndarray, arr: np.ndarray, column: str, table: str) -> None:
    if dest.shape[1:] != arr.shape[1:] or dest.dtype != arr.dtype:
        raise PlanError(
            f"column {column!r} of table {table!r} has rows of shape {arr.shape[1:]} "
            f"{arr.dtype}, other components give {dest.shape[1:]} {dest.dtype}"
        )

"""The plan: which moment of which table sits at every global sample position.

Pure after pinning. For the batch of step ``s`` (batch size ``B``, components ``c``):

1. **Counts.** The :class:`~treadle.plan.schedule.Schedule` gives each component's seat count
   in batch ``s`` and its cumulative count ``N_c(s)`` of earlier draws, in O(1).
2. **Canonical order.** The batch's samples, before shuffling, are component 0's draws
   ``N_0(s) .. N_0(s)+k_0-1``, then component 1's, and so on (``B`` items).
3. **Slots.** Slot ``t`` holds item ``pi_s(t)``, where ``pi_s`` is a keyed Feistel bijection
   of ``[0, B)`` keyed by (seed, step) (with ``BlockShuffle(partitions=P > 1)``: by
   partition, :mod:`treadle.plan.arrange`). Rank ``r`` of ``W`` takes slots ``r, r+W, ...``;
   global position ``= s*B + t``.
4. **Draws.** Draw ``j`` of component ``c`` (``N`` eligible moments) is eligible index
   ``order_{c,e}(j mod N)`` of epoch ``e = j div N``: a bijection of ``[0, N)`` keyed by
   (seed, component, epoch), never materialised — the full permutation
   (:mod:`treadle.plan.order_full`) or a block shuffle (:mod:`treadle.plan.order_block`).
5. **Moments.** Eligible index -> anchor run (per episode the moments its unpadded windows
   fit, cut to the component's ``episodes``/``where`` selection) via the runs' prefix sums,
   -> moment row = run start + offset in the run. Memory is proportional to the runs.

Everything is vectorised numpy: a batch costs O(B/W + components) at any step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.arrange import slot_draws
from treadle.plan.batch import Batch, as_int, check_rank
from treadle.plan.exclude import Redraw, exclusion_of
from treadle.plan.permute import SLOT_DOMAIN, Domain, Domains, derive_key
from treadle.plan.record import RunRecord
from treadle.plan.reserved import check_batch_keys
from treadle.plan.schedule import Schedule
from treadle.plan.select import Runs, component_runs
from treadle.plan.shuffle import order_of
from treadle.plan.stack import StackedColumn, component_names, stack_layout
from treadle.plan.stages import StagedSeats
from treadle.plan.windows import Windows

if TYPE_CHECKING:
    from treadle.table.table import Table

_MAX_INT64 = 2**63 - 1


class Plan:
    """A pinned, pure plan: ``batch(step, rank, world_size)`` for any step, with no I/O.

    Build one with ``Recipe.plan()`` or :meth:`from_record`. ``tables`` are the pinned tables,
    aligned with ``record.tables``.
    """

    def __init__(
        self,
        record: RunRecord,
        tables: Sequence[Table],
        *,
        episodes: Sequence[Any] | None = None,
        anchors: Sequence[Runs] | None = None,
    ):
        if not isinstance(record, RunRecord):
            raise PlanError(f"Plan needs a RunRecord, got {type(record).__name__}")
        if len(tables) != len(record.tables):
            raise PlanError(f"run record names {len(record.tables)} tables, got {len(tables)}")
        self._record = record
        self._tables = tuple(tables)
        self._names = component_names(record)
        self._layout = stack_layout(record, self._tables)
        if anchors is None:
            if episodes is None:
                episodes = [t.episodes() for t in self._tables]
            anchors = [
                component_runs(
                    self._tables[c.table],
                    episodes[c.table],
                    c.windows,
                    c.where,
                    c.episodes,
                    f"component {i} (table {record.tables[c.table].name!r})",
                )
                for i, c in enumerate(record.components)
            ]
        self._schedule: Schedule | StagedSeats = (
            Schedule(
                [c.weight_quantised for c in record.components],
                record.weight_denominator,
                record.batch_size,
            )
            if record.schedule is None
            else StagedSeats(record.schedule.pieces(sizes=record.sizes), record.batch_size)
        )
        self._build_index(anchors)
        self._episodes = episodes  # the anchors: as (first, cumulative end), _build_index
        self._seed = seed = record.seed
        # each component's draws -> eligible indices: the full permutation or a block shuffle
        self._order = order_of(record.shuffle, seed, self._elig.tolist())
        self._redraw = [] if record.derived is None else self._redraws()
        self._slots = Domains([Domain.of(record.batch_size)])  # the slots of a batch
        self._slot_base = derive_key(SLOT_DOMAIN, seed)

    def _build_index(self, anchors: Sequence[Runs]) -> None:
        """Concatenate every component's anchor runs; eligible index -> run -> row."""
        firsts, ends, bases, elig = [], [], [], []
        base = 0
        for i, comp in enumerate(self._record.components):
            first, stop = (np.asarray(x, np.int64) for x in anchors[i])
            cnt = stop - first
            total = int(cnt.sum())
            if total != comp.eligible:
                entry = self._record.tables[comp.table]
                raise PlanError(
                    f"component {i} ({entry.name!r} @ version {entry.version}) has {total} "
                    f"eligible moments, but the run record says {comp.eligible}"
                )
            cum = np.cumsum(cnt, out=cnt)  # cnt is not needed again: no second array
            cum += base
            firsts.append(first)
            ends.append(cum)
            bases.append(base)
            elig.append(total)
            base += total
        # 16 bytes per run (issue 33): first row, cumulative end (a begin is the previous end)
        self._first_moment = firsts[0] if len(firsts) == 1 else np.concatenate(firsts)
        self._cum_end = ends[0] if len(ends) == 1 else np.concatenate(ends)
        at = np.cumsum([0] + [len(f) for f in firsts])  # each component's runs: views
        self._runs = [(self._first_moment[a:b], self._cum_end[a:b]) for a, b in zip(at, at[1:])]
        self._base = np.asarray(bases, dtype=np.int64)
        self._elig = np.asarray(elig, dtype=np.int64)

    def _redraws(self) -> list[Redraw]:  # one per exclusion stage, oldest first
        names = [t.name for t in self._record.tables]
        episodes = self._table_episodes()
        # each component's own pinned table: two of one name (branches, versions) differ
        of = [episodes[c.table] for c in self._record.components]
        tables = [names[c.table] for c in self._record.components]
        assert (d := self._record.derived) is not None
        anchors = [self.anchor_runs(c) for c in range(len(tables))]
        near = None if self._record.shuffle is None else self._near  # within the segment
        return [Redraw(d, self._record.seed, tables, of, anchors, stage=k, near=near)
                for k in range(len(d.stages))]  # fmt: skip

    def _near(self, comp: np.ndarray, draw: np.ndarray, attempt: int) -> np.ndarray:
        """Moment rows of an exclusion's ``attempt``-th redraw of draws within their segment."""
        epoch, idx = np.divmod(draw, self._elig[comp])
        e = self._order.eligible(comp, epoch, idx, attempt)
        return self._ordered(self._base[comp] + e)

    def _table_episodes(self) -> Sequence[Any]:
        if self._episodes is None:
            self._episodes = [t.episodes() for t in self._tables]
        return self._episodes

    def exclude(self, episodes: Mapping[str, Sequence[str]], from_step: int) -> Plan:
        """A derived run: this run's batches, except that from ``from_step`` on every slot
        holding a moment of ``episodes={table: [names]}`` is redrawn from the same component
        among its other moments (:mod:`treadle.plan.exclude`). New run record and id. On a
        derived run it composes: that run's batches, with these slots redrawn too."""
        names = [t.name for t in self._record.tables]
        derived = exclusion_of(self.run_id, from_step, episodes, names, self._table_episodes(),
                               self._record.derived, self)  # fmt: skip
        record = replace(self._record, derived=derived)
        anchors = [self.anchor_runs(c) for c in range(len(self._record.components))]
        return Plan(record, self._tables, episodes=self._episodes, anchors=anchors)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_record(cls, record: RunRecord | str | dict[str, Any], client: Any) -> Plan:
        """Rebuild a plan from its run record, re-opening each table at its recorded version.

        Branch heads are not consulted:
        ``client.project(p, create=False).table_at(name, version, commit_id=commit)``.
        """
        if not isinstance(record, RunRecord):
            record = RunRecord.from_json(record)
        project = client.project(record.project, create=False)
        tables = []
        for entry in record.tables:
            table = project.table_at(entry.name, entry.version, commit_id=entry.commit)
            if int(table.num_moments) != entry.num_moments:
                raise PlanError(
                    f"table {entry.name!r} @ version {entry.version} has {table.num_moments} "
                    f"moments, but the run record says {entry.num_moments}"
                )
            tables.append(table)
        for i, c in enumerate(record.components):  # a record from before keys were reserved
            where = f"component {i} (table {record.tables[c.table].name!r})"
            check_batch_keys(tables[c.table], c.windows, c.rename, where)
        return cls(record, tables)

    # -- facts ----------------------------------------------------------------------------

    @property
    def record(self) -> RunRecord:
        """The run record (JSON-serialisable; ``record.run_id``)."""
        return self._record

    @property
    def run_id(self) -> str:
        return self._record.run_id

    @property
    def tables(self) -> tuple[Any, ...]:
        """Pinned tables, aligned with ``record.tables``."""
        return self._tables

    def table(self, component: int) -> Any:
        """The pinned table component ``component`` reads."""
        return self._tables[self._record.components[self._component(component)].table]

    def windows(self, component: int) -> Windows | None:
        """The component's windows; None means every column at the moment itself."""
        return self._record.components[self._component(component)].windows

    def eligible(self, component: int) -> int:
        """Number of eligible moments of a component (its epoch length in draws)."""
        return int(self._elig[self._component(component)])

    def anchor_runs(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        """A component's anchors as sorted runs ``[first, stop)`` of moment rows."""
        c = self._component(component)
        first, cum_end = self._runs[c]
        return first, first + np.diff(cum_end, prepend=self._base[c])

    def kept(self, component: int) -> tuple[int, int]:
        """(anchors kept, moments in the table) of a component (its windows and selection)."""
        c = self._component(component)
        return int(self._elig[c]), self._record.table_of(c).num_moments

    @property
    def components(self) -> list[str]:
        """Each component's name (``Component(name=...)``; default its table's name, made
        unique); ``batch["_component"]`` is the index into this list."""
        return list(self._names)

    @property
    def layout(self) -> dict[str, StackedColumn]:
        """How each batch column stacks over the components (shapes after ``pad_to``,
        which components lack an optional column): :mod:`treadle.plan.stack`."""
        return dict(self._layout)

    def stats(
        self, columns: Sequence[str] | str | None = None, *, per_offset: bool = False,
        derive: dict[str, Callable[[dict[str, Any]], Any]] | None = None,
        by_component: bool = False, quantiles: Sequence[float] = (0.01, 0.10, 0.50, 0.90, 0.99),
        frames: int = 10_000, steps: int | tuple[int, int] | None = None,
        derive_version: str | int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """``{column: ColumnStats}`` of the samples this run draws (derived runs: what they
        draw), kept under the run id in its first table's project (a derive only with
        ``derive_version=``): :mod:`treadle.stats.plan_stats` says what and how."""
        return self.tables[0].project.plan_stats(self, columns, per_offset=per_offset,
            derive=derive, by_component=by_component, quantiles=quantiles, frames=frames,
            steps=steps, derive_version=derive_version)  # fmt: skip

    @property
    def batch_size(self) -> int:
        return self._record.batch_size

    @property
    def seed(self) -> int:
        return self._record.seed

    @property
    def num_components(self) -> int:
        return len(self._record.components)

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """Shares planned (exact fractions): the asked ones when their common denominator is
        at most 10**6, else within 1e-6 of them."""
        return self._record.weights

    @property
    def asked_weights(self) -> tuple[Fraction, ...]:
        """Shares asked for (exact fractions of the decimal weights)."""
        return self._record.asked_weights

    @property
    def schedule(self) -> Schedule | StagedSeats:
        """Seat counts per step: one PD2 schedule, or a weight schedule's pieces."""
        return self._schedule

    def counts(self, step: int) -> np.ndarray:
        """Samples of each component in the global batch of ``step``."""
        return self._schedule.counts(self._step(step))

    def cumulative(self, step: int) -> list[int]:
        """Samples of each component in global batches ``0 .. step-1`` (exact integers)."""
        return self._schedule.cumulative(self._step(step, allow_end=True))

    # -- batches --------------------------------------------------------------------------

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> Batch:
        """The samples of ``step`` that rank ``rank`` of ``world_size`` reads: slots
        ``rank, rank + world_size, ...`` of the global batch."""
        return self.batches([step], rank, world_size)[0]

    def batches(self, steps: Sequence[int], rank: int = 0, world_size: int = 1) -> list[Batch]:
        """:meth:`batch` of each of ``steps``, in order: the same batches, computed together
        (one vectorised pass over all their draws costs about what one step's does)."""
        steps = [self._step(s) for s in steps]
        b = self.batch_size
        rank, world_size = check_rank(rank, world_size, b)
        slots = np.arange(rank, b, world_size, dtype=np.int64)
        return [Batch(step=step, rank=rank, world_size=world_size, component=c, moment=m,
                      position=slots + step * b, draw=d)
                for step, (c, m, d) in zip(steps, self._samples(steps, slots))]  # fmt: skip

    def at(self, position: int) -> tuple[int, int]:
        """(component, moment) of the sample at a global position."""
        position = as_int(position, "position")
        if position < 0:
            raise PlanError(f"position must be >= 0, got {position}")
        step, slot = divmod(position, self.batch_size)
        self._step(step)
        [(c, m, _)] = self._samples([step], np.asarray([slot], dtype=np.int64))
        return int(c[0]), int(m[0])

    def moments(self, component: int, draws: np.ndarray) -> np.ndarray:
        """Moment rows of draws ``draws`` (component-local draw indices) of a component."""
        c = self._component(component)
        draws = np.asarray(draws, dtype=np.int64)
        if draws.size and draws.min() < 0:
            raise PlanError("draw indices must be >= 0")
        return self._moments(np.full(draws.shape, c, dtype=np.int64), draws)

    def _samples(
        self, steps: list[int], slots: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(component, moment, draw) of ``slots`` at each of ``steps``, all of their draws'
        moments in one vectorised pass."""
        if not steps:
            return []
        comp, draw = slot_draws(self._schedule, self._order, self._elig, self._slots,
                                self._slot_base, steps, slots)  # fmt: skip
        moment = self._moments(comp, draw)
        out = []
        for step, c, m, d in zip(steps, *(np.split(a, len(steps)) for a in (comp, moment, draw))):
            for redraw in self._redraw:  # each exclusion stage from its own step, oldest first
                if step >= redraw.from_step:
                    m = redraw.apply(c, m, d)
            out.append((c, m, d))
        return out

    def _moments(self, comp: np.ndarray, draw: np.ndarray) -> np.ndarray:
        epoch, idx = np.divmod(draw, self._elig[comp])
        return self._ordered(self._base[comp] + self._order.eligible(comp, epoch, idx))

    def _ordered(self, g: np.ndarray) -> np.ndarray:
        """Moment rows of global eligible indices (components' eligible moments, in order)."""
        ep = np.searchsorted(self._cum_end, g, side="right")
        begin = np.where(ep > 0, self._cum_end[np.maximum(ep - 1, 0)], 0)
        return self._first_moment[ep] + (g - begin)

    def eligible_moments(self, component: int, index: np.ndarray) -> np.ndarray:
        """Moment rows of eligible indices ``0 .. eligible-1`` of a component, in table order
        (no shuffle): what ``td.EvalLoader`` reads at each position. Pure, vectorised."""
        c = self._component(component)
        idx = np.asarray(index, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._elig[c]):
            raise PlanError(
                f"eligible index out of range 0..{int(self._elig[c]) - 1} of component {c}"
            )
        return self._ordered(self._base[c] + idx)

    # -- checks ---------------------------------------------------------------------------

    def _component(self, component: int) -> int:
        c = as_int(component, "component")
        if not 0 <= c < self.num_components:
            raise PlanError(f"component must be in 0..{self.num_components - 1}, got {c}")
        return c

    def _step(self, step: int, allow_end: bool = False) -> int:
        step = as_int(step, "step")
        if step < 0:
            raise PlanError(f"step must be >= 0, got {step}")
        last = _MAX_INT64 // self.batch_size - (0 if allow_end else 1)
        if step > last:
            raise PlanError(f"step {step} is past the last step {last} (positions are int64)")
        return step

    def __repr__(self) -> str:
        names = [self._record.table_of(i).name for i in range(self.num_components)]
        return (
            f"Plan(run_id={self.run_id!r}, components={names}, "
            f"batch_size={self.batch_size}, seed={self.seed})"
        )

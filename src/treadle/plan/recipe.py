"""What a user declares: components (table, windows, weight), a seed and a batch size.

``Recipe(...).plan()`` pins every table (branch head -> commit and Lance version), checks the
windows against each table, counts eligible moments, realises the weights (exact shares, see
:mod:`treadle.plan.shares`) and returns a pure
:class:`~treadle.plan.plan.Plan`. Every bad input is a :class:`~treadle.errors.PlanError`
(a ``ValueError``) naming the thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.component import Component
from treadle.plan.image_columns import check_video_column
from treadle.plan.plan import Plan
from treadle.plan.record import WEIGH_BY, ComponentEntry, RunRecord, TableEntry
from treadle.plan.reserved import check_batch_keys
from treadle.plan.select import component_runs
from treadle.plan.shares import MAX_COMPONENTS, asked_shares, check_planned, realise_weights
from treadle.plan.shuffle import BlockShuffle, resolve
from treadle.plan.stages import Schedule, check_schedule
from treadle.plan.video_sizes import check_video_sizes
from treadle.plan.windows import Rows, Video, Windows, batch_column_kind, default_columns
from treadle.table.off_grid import recorded_off_grid

if TYPE_CHECKING:
    from treadle.table.table import Table

_MAX_SEED = 2**64 - 1


def check_windows(windows: Windows | None, table: Table, where: str) -> None:
    """Every window column exists; ``Video`` only on video columns and binary columns of
    images (:mod:`treadle.plan.image_columns`), ``Rows`` only on columns a
    batch can hold; without windows, every column but ``episode``/``frame`` must be one a
    batch can hold (none is left out silently)."""
    if windows is None or not windows.specs:
        for col in default_columns(table):
            _batch_kind(table, col, where)
        return
    names = set(table.schema.names)
    video = set(table.video_columns)
    for col, spec in windows.items():
        if col not in names and spec.optional:
            if isinstance(spec, Video) and spec.size is None:
                raise PlanError(
                    f"{where}: optional td.Video column {col!r} is not in table "
                    f"{table.name!r}: give its spec a size=(H, W), the shape of its zeros"
                )
            continue
        if col not in names:
            raise PlanError(
                f"{where}: window column {col!r} is not a column of table {table.name!r} "
                f"(columns: {sorted(names)})"
            )
        if isinstance(spec, Video):
            check_video_column(table, col, spec, where)
        if isinstance(spec, Rows) and col in video:
            raise PlanError(
                f"{where}: td.Rows window on video column {col!r} of table {table.name!r}; "
                f"use td.Video"
            )
        if isinstance(spec, Rows):
            _batch_kind(table, col, where)


def check_rename(
    rename: tuple[tuple[str, str], ...] | None, table: Table, windows: Windows | None, where: str
) -> None:
    """Each renamed column is one the component reads; no new name is a column it keeps."""
    if not rename:
        return
    read = default_columns(table) if windows is None or not windows.specs else windows.columns()
    moved = {col for col, _ in rename}
    for col, new in rename:
        if col not in read:
            raise PlanError(
                f"{where}: rename {col!r} -> {new!r}: {col!r} is not a column this component "
                f"reads (columns: {sorted(read)})"
            )
        if new in read and new not in moved:
            raise PlanError(
                f"{where}: rename {col!r} -> {new!r}: table {table.name!r} already has a "
                f"column {new!r} in the batch"
            )


def _batch_kind(table: Table, col: str, where: str) -> str:
    try:
        return batch_column_kind(table, table.schema.field(col))
    except PlanError as e:
        raise PlanError(f"{where}: {e}") from None


class Recipe:
    """Components, a seed (0..2**64-1) and a global batch size: everything a run is made of.

    ``weigh_by="moments"`` makes each component's share proportional to its weight times its
    eligible moments (after its windows, ``where=`` and ``episodes=``), as OpenVLA's and
    Octo's ``balance_weights``; ``None`` (default): proportional to the weights alone.
    ``shuffle=td.BlockShuffle(...)`` orders each component's draws block by block
    (:mod:`treadle.plan.shuffle`); None (the default) is the full permutation."""

    def __init__(
        self,
        seed: int,
        batch_size: int,
        components: Sequence[Component],
        schedule: Schedule | None = None,
        *,
        weigh_by: str | None = None,
        shuffle: BlockShuffle | None = None,
    ):
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise PlanError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
        if not 0 <= int(seed) <= _MAX_SEED:
            raise PlanError(f"seed must be in 0..2**64-1, got {seed}")
        if isinstance(batch_size, (bool, np.bool_)) or not isinstance(
            batch_size, (int, np.integer)
        ):
            raise PlanError(f"batch_size must be a positive integer, got {batch_size!r}")
        if int(batch_size) < 1:
            raise PlanError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(components, (Component, str, bytes)) or not isinstance(components, Sequence):
            raise PlanError(f"components must be a list of td.Component, got {components!r}")
        if not components:
            raise PlanError("components is empty: a recipe needs at least one td.Component")
        for i, c in enumerate(components):
            if not isinstance(c, Component):
                raise PlanError(f"components[{i}] must be a td.Component, got {c!r}")
        if len(components) > MAX_COMPONENTS:
            raise PlanError(f"{len(components)} components; at most {MAX_COMPONENTS} are supported")
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.components = tuple(components)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise PlanError(f"schedule must be a td.Schedule, got {schedule!r}")
        if schedule is not None and schedule.num_components != len(self.components):
            raise PlanError(
                f"schedule gives {schedule.num_components} weights per stage for "
                f"{len(self.components)} components"
            )
        self.schedule = schedule
        self.weigh_by = _check_weigh_by(weigh_by)
        if shuffle is not None and not isinstance(shuffle, BlockShuffle):
            raise PlanError(f"shuffle must be a td.BlockShuffle or None, got {shuffle!r}")
        self.shuffle = shuffle

    def plan(self) -> Plan:
        """Pin every table now and return the pure plan."""
        per_component = self._pin()
        projects = sorted({t.project.name for t, _ in per_component})
        if len(projects) != 1:
            raise PlanError(f"components come from projects {projects}; a run reads one project")
        # the record names a project, not its store: a resume reads one (a stand-in: None)
        roots = sorted({str(_store_url(t.project)) for t, _ in per_component})
        if len(roots) > 1:
            raise PlanError(
                f"components come from project {projects[0]!r} of {len(roots)} stores "
                f"({', '.join(roots)}); a run reads one project of one store"
            )
        tables, entries, episodes, table_of = _table_entries(per_component)
        comps, anchors = [], []
        for i, (comp, t) in enumerate(zip(self.components, table_of, strict=True)):
            entry, runs = _component_entry(comp, i, t, tables[t], episodes[t])
            comps.append(entry)
            anchors.append(runs)
        on = [tables[t] for t in table_of]
        check_video_sizes(self.components, on, [episodes[t] for t in table_of], anchors)
        weights = [c.weight for c in self.components]
        # weigh_by="moments": each weight times its eligible moments, as exact rationals
        sizes = None if self.weigh_by is None else [c.eligible for c in comps]
        numerators, denominator = realise_weights(weights, self.batch_size, sizes)
        labels = [f"component {i} (table {tables[t].name!r})" for i, t in enumerate(table_of)]
        if self.schedule is None:
            planned = [Fraction(n, denominator) for n in numerators]
            check_planned(asked_shares(weights, sizes), planned, self.batch_size, labels)
        else:
            check_schedule(self.schedule, self.batch_size, labels, sizes)
        comps = [replace(c, weight_quantised=n) for c, n in zip(comps, numerators, strict=True)]
        record = RunRecord(
            project=projects[0],
            seed=self.seed,
            batch_size=self.batch_size,
            weight_denominator=denominator,
            tables=tuple(entries),
            components=tuple(comps),
            schedule=self.schedule,
            weigh_by=self.weigh_by,
            shuffle=resolve(
                self.shuffle, [tables[t] for t in table_of], [c.eligible for c in comps]
            ),  # fmt: skip
        )
        return Plan(record, tables, episodes=episodes, anchors=anchors)

    def _pin(self) -> list[tuple[Any, str | None]]:
        """(pinned table, branch name or None) per component; a ref is pinned once."""
        pinned: dict[Any, tuple[Any, str | None]] = {}
        per_component = []
        for comp in self.components:
            ref = comp.table
            if callable(getattr(ref, "pin", None)):
                key = _ref_key(ref)
                if key not in pinned:
                    pinned[key] = (ref.pin(), ref.branch.name)
                per_component.append(pinned[key])
            else:
                per_component.append((ref, None))
        return per_component

    def __repr__(self) -> str:
        return (
            f"Recipe(seed={self.seed}, batch_size={self.batch_size}, "
            f"components={list(self.components)!r}"
            + ("" if self.weigh_by is None else f", weigh_by={self.weigh_by!r}")
            + ")"
        )


def _check_weigh_by(weigh_by: Any) -> str | None:
    """``None`` or ``"moments"`` (a schedule's stage weights are weighed too)."""
    if weigh_by is None:
        return None
    if not isinstance(weigh_by, str) or weigh_by not in WEIGH_BY:
        raise PlanError(
            f"weigh_by must be None or 'moments' (share ∝ weight × eligible moments), "
            f"got {weigh_by!r}"
        )
    return weigh_by


def _short(names: tuple[str, ...] | None) -> str:
    if names is None:
        return "None"
    more = f", ... ({len(names)})" if len(names) > 5 else ""
    return "[" + ", ".join(repr(n) for n in names[:5]) + more + "]"


def _store_url(project: object) -> str | None:
    """The store a project is in: its root URL and endpoint/account (``Store.place``: one
    bucket name on two servers is two stores); None for a stand-in without a store."""
    store = getattr(project, "store", None)
    return getattr(store, "place", getattr(store, "url", None))


def _ref_key(ref: Any) -> Any:
    """Pin each (store, project, branch, table) once per recipe, so shared refs agree."""
    try:
        branch = ref.branch
        project = branch.project
        return (_store_url(project), getattr(project, "name", None), branch.name, ref.name)
    except AttributeError:
        return id(ref)


def _table_entries(
    per_component: list[tuple[Any, str | None]],
) -> tuple[list[Any], list[TableEntry], list[Any], list[int]]:
    """The distinct pinned tables (one per name, version, commit and branch), their record
    entries and episode indexes, and each component's table number."""
    tables: list[Any] = []
    entries: list[TableEntry] = []
    episodes: list[Any] = []
    index: dict[tuple[str, int, str, str | None], int] = {}
    table_of: list[int] = []
    for table, branch in per_component:
        key = (table.name, int(table.version), table.commit_id, branch)
        if key not in index:
            index[key] = len(tables)
            tables.append(table)
            ep = table.episodes()
            episodes.append(ep)
            entries.append(
                TableEntry(
                    name=table.name,
                    branch=branch,
                    commit=table.commit_id,
                    version=int(table.version),
                    num_moments=int(table.num_moments),
                    num_episodes=len(ep.lengths),
                )
            )
        table_of.append(index[key])
    return tables, entries, episodes, table_of


def _component_entry(
    comp: Component, i: int, t: int, table: Table, episodes: Any
) -> tuple[ComponentEntry, Any]:
    """Component ``i``'s record entry (its ``weight_quantised`` 0 until the shares are
    realised) and anchor runs, its windows and selection checked."""
    where = f"component {i} (table {table.name!r})"
    # seconds -> this table's frame offsets; the record keeps both
    windows = None
    if comp.windows is not None:
        off_grid = recorded_off_grid(getattr(table, "schema", None))
        windows = comp.windows.at_fps(getattr(table, "fps", None), where, off_grid)
    check_windows(windows, table, where)
    check_rename(comp.rename, table, windows, where)
    check_batch_keys(table, windows, comp.rename, where)
    lengths = np.asarray(episodes.lengths, dtype=np.int64)
    runs = component_runs(table, episodes, windows, comp.where, comp.episodes, where)
    eligible = int((runs[1] - runs[0]).sum())
    if eligible == 0 and (comp.where is not None or comp.episodes is not None):
        raise PlanError(
            f"{where} selects no anchors: where={comp.where!r}, episodes="
            f"{_short(comp.episodes)} leave none of its eligible moments"
        )
    if eligible == 0:
        lo, hi = (0, 0) if windows is None else windows.eligible_span()
        longest = int(lengths.max()) if lengths.size else 0
        raise PlanError(
            f"{where} has no eligible moments: its windows span {hi - lo + 1} moments "
            f"(offsets {lo}..{hi}) but the longest of its {lengths.size} episodes has "
            f"{longest}"
        )
    entry = ComponentEntry(
        table=t,
        windows=windows,
        weight=comp.weight,
        weight_quantised=0,
        eligible=eligible,
        where=comp.where,
        episodes=comp.episodes,
        rename=comp.rename,
        name=comp.name,
        pad_to=comp.pad_to,
    )
    return entry, runs

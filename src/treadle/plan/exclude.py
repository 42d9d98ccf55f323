"""Derived runs: a plan with some episodes excluded from a step on (``plan.exclude``).

A derived run's record names its parent run, the step ``from_step`` and the excluded
episodes per table (and how many eligible anchors of the run they hold: ``moments``; an
episode holding none is refused, as the run never draws it). Its batches are the parent's, except
that from ``from_step`` on a slot whose sample is a moment of an excluded episode is redrawn
from the same component, among its moments not excluded: draw ``j`` of component ``c``
(``N'`` moments left) takes index ``perm'_{c,e}(j mod N')`` of epoch ``e = j div N'``, a
keyed bijection of its own domain (``exclude``), so the redraw is pure and O(1) like every
other draw. Every other slot, every share and every draw index are the parent's.

Under ``td.BlockShuffle`` the redraw stays **within the segment**: an excluded draw first takes
the moment at another position of its own segment (the blocks open at that point,
:mod:`treadle.plan.order_block`), the first of :data:`NEAR_TRIES` keyed positions whose moment
no exclusion (up to this stage) leaves out; only when all of them are excluded does it fall
back to the run-wide redraw above. Either way it is a pure function of the draw.

A derived run may be derived again (``derived.exclude(...)``): the record keeps the earlier
exclusions (``earlier``, oldest first) and its batches are the run's it was derived from,
except that from the new ``from_step`` on the slots holding a newly excluded episode are
redrawn among the moments no exclusion so far leaves out (stage ``k`` keys its redraw with
``k``). The stages apply in order, each from its own step, so a step gets exactly the
redraws of the exclusions that started at or before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.permute import Domain, Domains, derive_key, epoch_keys, permute

EXCLUDE_DOMAIN = 0x6578636C  # "excl"
NEAR_TRIES = 32
"""Positions of its own segment an excluded draw tries under a block shuffle."""


@dataclass(frozen=True)
class Exclusion:
    """What a derived run leaves out: ``episodes`` per table name, from ``from_step`` on."""

    parent: str
    from_step: int
    episodes: tuple[tuple[str, tuple[str, ...]], ...]
    moments: int
    earlier: tuple[Exclusion, ...] = ()
    """The exclusions of the run this one was derived from, oldest first (their own
    ``earlier`` empty): written only when set, so a first derivation's record is as before."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "parent": self.parent,
            "from_step": self.from_step,
            "episodes": {t: list(names) for t, names in self.episodes},
            "moments": self.moments,
        }
        if self.earlier:
            out["earlier"] = [e.to_json() for e in self.earlier]
        return out

    @property
    def stages(self) -> tuple[Exclusion, ...]:
        """Every exclusion of the run, oldest first (this one last)."""
        return (*self.earlier, self)

    def cumulative(self, upto: int | None = None) -> dict[str, tuple[str, ...]]:
        """The episodes stages ``0 .. upto`` exclude together (all: ``upto=None``)."""
        out: dict[str, set[str]] = {}
        for st in self.stages[: None if upto is None else upto + 1]:
            for t, names in st.episodes:
                out.setdefault(t, set()).update(names)
        return {t: tuple(sorted(v)) for t, v in sorted(out.items())}

    @classmethod
    def from_json(cls, value: Any) -> Exclusion:
        keys = {"parent", "from_step", "episodes", "moments"}
        if not isinstance(value, dict) or not keys <= set(value) <= keys | {"earlier"}:
            raise PlanError(f"run record field 'derived' must have the keys {sorted(keys)}")
        earlier = value.get("earlier", [])
        if "earlier" in value and (not isinstance(earlier, list) or not earlier):
            raise PlanError("run record field 'derived.earlier' must be a non-empty list")
        stages = tuple(cls.from_json(e) for e in earlier)
        if any(e.earlier for e in stages):
            raise PlanError("run record field 'derived.earlier' must list stages, not chains")
        eps = value["episodes"]
        if not isinstance(eps, dict) or not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v) for v in eps.values()
        ):
            raise PlanError("run record field 'derived.episodes' must map tables to names")
        for key in ("from_step", "moments"):
            if isinstance(value[key], bool) or not isinstance(value[key], int):
                raise PlanError(f"run record field 'derived.{key}' must be an integer")
        if not isinstance(value["parent"], str):
            raise PlanError("run record field 'derived.parent' must be a run id")
        return cls(
            value["parent"],
            value["from_step"],
            tuple(sorted((t, tuple(sorted(v))) for t, v in eps.items())),
            value["moments"],
            stages,
        )

    @property
    def num_episodes(self) -> int:
        """Episodes this exclusion adds (its earlier stages' not counted)."""
        return sum(len(names) for _, names in self.episodes)


def exclusion_of(
    parent: str,
    from_step: int,
    episodes: Any,
    table_names: Sequence[str],
    episode_index: Sequence[Any],
    earlier: Exclusion | None = None,
    plan: Any = None,
) -> Exclusion:
    """Check ``episodes={table: [names]}`` against the pinned tables; count the anchors they
    remove (:func:`anchors_in`: the eligible anchors of ``plan``, the run derived from, in
    each episode; no ``plan``: every row is one). An episode the
    run never draws (outside ``episodes=``, no row matching ``where=``, shorter than the
    windows) is an error, as one already excluded is. ``earlier``: the exclusion of the run
    this one derives from (names it already excludes from ``from_step`` or before are left
    out of the new stage; naming only those is an error; one it excludes only from a later
    step is this stage's too, so it goes from ``from_step``)."""
    if isinstance(from_step, bool) or not isinstance(from_step, (int, np.integer)):
        raise PlanError(f"from_step must be an integer >= 0, got {from_step!r}")
    if from_step < 0:
        raise PlanError(f"from_step must be >= 0, got {from_step}")
    if not isinstance(episodes, Mapping) or not episodes:
        raise PlanError(f"episodes must be {{table: [episode names]}}, got {episodes!r}")
    out, moments = [], 0
    before = {} if earlier is None else excluded_since(earlier)
    for table, names in episodes.items():
        if table not in table_names:
            raise PlanError(f"exclude: table {table!r} is not read by this run ({table_names})")
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
            raise PlanError(f"exclude: episodes of {table!r} must be a list of names")
        # a name pinned twice (two branches or versions): the episode goes from each of them
        pinned = [i for i, t in enumerate(table_names) if t == table]
        known = [{n: e for e, n in enumerate(episode_index[i].names)} for i in pinned]
        new = []
        for n in dict.fromkeys(names):  # an episode named twice is excluded (and counted) once
            if not any(n in k for k in known):
                raise PlanError(f"exclude: table {table!r} has no episode {n!r}")
            if before.get((table, n), from_step + 1) > from_step:  # not yet excluded by then
                drawn = 0
                for i, k in zip(pinned, known):
                    if n in k:
                        lo = int(episode_index[i].starts[k[n]])
                        hi = lo + int(episode_index[i].lengths[k[n]])
                        drawn += hi - lo if plan is None else anchors_in(plan, i, lo, hi)
                if not drawn:
                    raise PlanError(
                        f"exclude: episode {n!r} of table {table!r}: run {parent} never draws "
                        "it (outside its episodes=, no row matching its where=, or shorter "
                        "than its windows), so excluding it would change nothing"
                    )
                moments += drawn
                new.append(n)
        if new:
            out.append((table, tuple(sorted(new))))
    if not out:
        raise PlanError(f"exclude: run {parent} already excludes every episode named")
    # flat: each earlier stage once, without its own earlier ones (a chain does not read back)
    stages = () if earlier is None else tuple(replace(e, earlier=()) for e in earlier.stages)
    return Exclusion(parent, int(from_step), tuple(sorted(out)), moments, stages)


def excluded_since(exclusion: Exclusion) -> dict[tuple[str, str], int]:
    """(table, episode) -> the first step from which a stage of ``exclusion`` excludes it."""
    out: dict[tuple[str, str], int] = {}
    for st in exclusion.stages:
        for t, names in st.episodes:
            for n in names:
                out[(t, n)] = min(out.get((t, n), st.from_step), st.from_step)
    return out


def anchors_in(plan: Any, table: int, lo: int, hi: int) -> int:
    """Moments among rows ``lo .. hi-1`` of the run's ``table``-th pinned table that are an
    eligible anchor of some component of ``plan`` reading it (each counted once): what
    excluding them removes."""
    firsts, stops = [], []
    for c, comp in enumerate(plan.record.components):
        if comp.table == table:
            first, stop = plan.anchor_runs(c)
            i0 = max(int(np.searchsorted(first, lo, side="right")) - 1, 0)
            i1 = int(np.searchsorted(first, hi, side="left"))
            firsts.append(np.maximum(first[i0:i1], lo))
            stops.append(np.minimum(stop[i0:i1], hi))
    first, stop = np.concatenate(firsts), np.concatenate(stops)
    order = np.argsort(first, kind="stable")
    first, stop = first[order], stop[order]
    before = np.maximum.accumulate(np.concatenate([[lo], stop[:-1]]))  # covered up to here
    return int(np.clip(stop - np.maximum(first, before), 0, None).sum())


class Redraw:
    """The redraw of excluded slots for one derived run (see the module docstring)."""

    def __init__(
        self,
        exclusion: Exclusion,
        seed: int,
        component_tables: Sequence[str],
        component_episodes: Sequence[Any],
        anchors: Sequence[tuple[np.ndarray, np.ndarray]],
        stage: int = 0,
        near: Callable[[np.ndarray, np.ndarray, int], np.ndarray] | None = None,
    ):
        """Stage ``stage`` of ``exclusion.stages``: from its step, the slots holding its own
        episodes are redrawn among the moments no stage up to it excludes (an earlier
        stage's slots are the earlier stage's to redraw, from its own step)."""
        self.from_step = exclusion.stages[stage].from_step
        own = dict(exclusion.stages[stage].episodes)
        self.hits = _ranges(component_tables, component_episodes, own)
        ranges = _ranges(component_tables, component_episodes, exclusion.cumulative(stage))
        self._out, self._near = ranges, near  # near(comp, draw, attempt): a block shuffle's
        firsts, begins, ends, kept = [], [], [], []
        base = 0
        for c, table in enumerate(component_tables):
            first, stop = (np.asarray(x, np.int64) for x in anchors[c])
            if c in ranges:
                keep = ~_inside(ranges[c], first)
                first, stop = first[keep], stop[keep]
            cnt = stop - first
            total = int(cnt.sum())
            if total == 0:
                raise PlanError(
                    f"exclude: component {c} (table {table!r}) has no moments left to draw"
                )
            cum = np.cumsum(cnt)
            firsts.append(first)
            begins.append(base + cum - cnt)
            ends.append(base + cum)
            kept.append(total)
            base += total
        self._first = np.concatenate(firsts)
        self._begin = np.concatenate(begins)
        self._end = np.concatenate(ends)
        self._kept = np.asarray(kept, np.int64)
        self._base = np.concatenate([[0], np.cumsum(self._kept)[:-1]]).astype(np.int64)
        self._domains = Domains([Domain.of(int(n)) for n in kept])
        extra = (stage,) if stage else ()  # stage 0: the key a first derivation always had
        self._keys = np.asarray(
            [derive_key(EXCLUDE_DOMAIN, seed, c, *extra) for c in range(len(kept))], np.uint64
        )

    def apply(self, comp: np.ndarray, moment: np.ndarray, draw: np.ndarray) -> np.ndarray:
        """``moment`` with every excluded sample redrawn (a new array when any is)."""
        bad = np.zeros(moment.shape, bool)
        for c, ranges in self.hits.items():
            at = comp == c
            bad[at] = _inside(ranges, moment[at])
        if not bad.any():
            return moment
        out = moment.copy()
        if self._near is not None:
            todo = np.flatnonzero(bad)
            for attempt in range(NEAR_TRIES):
                got = self._near(comp[todo], draw[todo], attempt)
                ok = ~self._excluded(comp[todo], got)
                out[todo[ok]] = got[ok]
                todo = todo[~ok]
                if not todo.size:
                    return out
            bad = np.zeros(moment.shape, bool)
            bad[todo] = True
        c, j = comp[bad], draw[bad]
        epoch, idx = np.divmod(j, self._kept[c])
        e = permute(idx.astype(np.uint64), c, self._domains, epoch_keys(self._keys[c], epoch))
        g = self._base[c] + e.astype(np.int64)
        run = np.searchsorted(self._end, g, side="right")
        out[bad] = self._first[run] + (g - self._begin[run])
        return out

    def _excluded(self, comp: np.ndarray, moment: np.ndarray) -> np.ndarray:
        """Whether each moment is in an episode some stage up to this one excludes."""
        out = np.zeros(moment.shape, bool)
        for c, ranges in self._out.items():
            at = comp == c
            out[at] = _inside(ranges, moment[at])
        return out


Ranges = tuple[np.ndarray, np.ndarray]


def _ranges(
    component_tables: Sequence[str], component_episodes: Sequence[Any], names: Mapping[str, Any]
) -> dict[int, Ranges]:
    """Per component reading a table of ``names``, the rows of those of its episodes that its
    own pinned table has (a name pinned twice may have an episode in one only), as sorted
    ranges."""
    out = {}
    for c, table in enumerate(component_tables):
        if table in names:
            idx = component_episodes[c]
            pos = {n: i for i, n in enumerate(idx.names)}
            rows = [pos[n] for n in names[table] if n in pos]
            if not rows:
                continue
            lo = np.asarray(idx.starts, np.int64)[rows]
            hi = lo + np.asarray(idx.lengths, np.int64)[rows]
            order = np.argsort(lo)
            out[c] = (lo[order], hi[order])
    return out


def _inside(ranges: Ranges, moment: np.ndarray) -> np.ndarray:
    lo, hi = ranges
    i = np.searchsorted(lo, moment, side="right") - 1
    return (i >= 0) & (moment < hi[np.maximum(i, 0)])


class KeptView:
    """A derived plan as the distribution it draws from its ``from_step`` on (what
    ``plan.stats`` describes): each component's anchors without those of the excluded
    episodes, every other fact the plan's. Anchor runs never cross an episode, so a run
    is kept or dropped whole."""

    def __init__(self, plan: Any):
        assert plan.record.derived is not None
        self._plan = plan
        names = plan.record.derived.cumulative()  # every stage's, from the last step on
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        for c in range(plan.num_components):
            first, stop = (np.asarray(x, np.int64) for x in plan.anchor_runs(c))
            table = plan.record.table_of(c).name
            if table in names:
                eps = plan.table(c).episodes()
                starts = np.asarray(eps.starts, np.int64)
                pos = {n: i for i, n in enumerate(eps.names)}
                out = np.isin(np.searchsorted(starts, first, side="right") - 1,
                              [pos[n] for n in names[table] if n in pos])  # fmt: skip
                first, stop = first[~out], stop[~out]
            self._runs.append((first, stop))

    def __getattr__(self, name: str) -> Any:
        if name == "_plan":  # not set yet (a copy being made): no recursion through here
            raise AttributeError(name)
        return getattr(self._plan, name)

    def anchor_runs(self, component: int) -> tuple[np.ndarray, np.ndarray]:
        return self._runs[component]

    def eligible(self, component: int) -> int:
        first, stop = self._runs[component]
        return int((stop - first).sum())

    def eligible_moments(self, component: int, index: np.ndarray) -> np.ndarray:
        first, stop = self._runs[component]
        end = np.cumsum(stop - first)
        idx = np.asarray(index, np.int64)
        run = np.searchsorted(end, idx, side="right")
        return first[run] + (idx - (end - (stop - first))[run])


def drawn_from(plan: Any) -> Any:
    """``plan`` itself, or for a derived run its :class:`KeptView` (made once per plan)."""
    if plan.record.derived is None:
        return plan
    view = plan.__dict__.get("_kept_view")
    if view is None:
        view = plan.__dict__["_kept_view"] = KeptView(plan)
    return view

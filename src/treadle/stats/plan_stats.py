"""Statistics of what a run trains on: ``plan.stats(...)`` -> ``{column: ColumnStats}``.

**The distribution** is the one the plan draws: each component by its planned share, each
of its eligible anchors equally (after ``where=``/``episodes=``), each window as the batch
delivers it (its offsets, ``seconds=`` converted, ``rename=`` names), with padded entries
left out: window rows a ``pad=True`` spec clamped (``*_is_pad``), the dimensions
``Component(pad_to=...)`` added, and optional columns a component's table lacks. A value
at window offset ``o`` of anchor ``a`` of component ``c`` weighs ``share_c / eligible_c``.
``per_offset=True`` keeps one statistic per window offset (fields ``[T, *D]``; video
``[T, channels]``, each offset's frames of the same sampled anchors);
``by_component=True`` gives each component's own (unweighted) statistics, keyed by name.
``steps=N`` (or ``(start, stop)``) weighs each component by the samples it has in those
steps (``plan.cumulative``) instead of its share: the distribution of that part of the run,
and the only pooled one of a run with a weight schedule (a component without samples there
is left out).

**Exactness.** count, mean, population std, min and max are exact up to float64 rounding
(~1e-12 relative). Quantiles (``quantiles=``, any tuple; ``q01``/``q99`` always) are
numpy's weighted ``inverted_cdf`` (``np.quantile(x, q, weights=w, method="inverted_cdf")``):
exact while no component holds more than ``2k`` rows of one multiplicity (how many windows
take a row: a ``T``-offset window takes most rows ``T`` times) per offset group,
``k = max(64, SKETCH_VALUES // elements)`` (``SKETCH_VALUES = 2**21``: ~600,000 rows of a
7-D column, ~300,000 of a 14-D one); beyond, each keeps the deterministic compactor sketch
of :mod:`treadle.stats.moments`, whose rank error, as a share of its values, bounds the
pooled one; ``ColumnStats.rank_error`` holds it in values (0 = exact). A 7-D column of
1e7 rows taken 10 times each: within 2e-5 of the values; 1e9 rows: 1.1e-4.

**Memory** is bounded whatever the row count: each sketch holds at most ``6k`` items per
element (``6 * 2**21`` values, 96 MiB, a column), one per offset group and row
multiplicity (at most ``T`` of them; the multiplicities below ``T``, rows near an
episode's ends, hold few), plus one read batch (``READ_VALUES``) and the plan's anchor and
episode tables.

**How.** Rows columns are read in one streamed scan per component (batches of at most
``READ_VALUES`` values, never all rows resident): each row enters once, weighted by how many
windows take it unpadded (per offset: whether ``row - offset`` is an anchor of the same
episode), so a 10-offset window costs about one ``table.stats`` scan, not ten. Video
columns are sampled as ``table.stats`` samples them: about ``frames`` frames (anchors drawn
per component by share, a pure function of the plan's seed), decoded to uint8 at the
spec's size, exact per-channel histograms: video statistics are in pixel units (0..255,
before the spec's ``dtype``, ``/ 255`` and ``mean``/``std``, whose input they are). ``derive={name: fn}`` runs ``fn`` on the batches
of every anchor in table order (the batch as delivered, zeros for absent columns); a
derived value ``[b, D...]`` or, with a time axis, ``[b, T, D...]`` (or ``[b, T]`` when a
windowed scalar column it reads is ``[b, T]``) leaves out entries
padded in the ``*_is_pad`` of that window length of a column ``fn`` reads, the samples
whose table lacks a column it reads (``*_is_present``), and the dimensions the
``*_dim_mask`` of its last size of a column it reads marks padded.

**Kept** in the project (``projects/<p>/runstats/<run id>/``), keyed by the run id, each
table version's identity and the arguments: a second call in any process, at any world size
or worker count, reads it back. With ``derive=``, only when ``derive_version=`` is given
(keyed by it and by what :func:`treadle.stats.run_cache.code_key` can see of each function);
without one a derive is computed on every call, since what a function reaches (a module's
functions and attributes, files, C code) cannot all be hashed, and a result computed by
other code is never served.
A dimension whose std is 0 (or below 1e-12 of its scale, or without values) warns, naming
the column and the dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from treadle import reaper
from treadle.errors import NotFound, PlanError
from treadle.plan.exclude import drawn_from
from treadle.plan.windows import Video
from treadle.read.columns import ColumnSpec, camera_column
from treadle.stats.column_stats import ColumnStats
from treadle.stats.derived import derive_parts
from treadle.stats.pooled import HistPart, Part, pool, pool_hist
from treadle.stats.run_cache import RunCache, derive_keys, warn_flat
from treadle.stats.table_stats import READ_VALUES, scan_batches
from treadle.stats.window_rows import Taken, window_values

SKETCH_VALUES = 1 << 21  # quantile items per level and group, over a column's elements
DEFAULT_QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
_ANCHORS = 256  # anchors per read on the batch path (derive=, video)
_ALGO = 4  # bump when a statistic's definition changes: old kept results are ignored
# (3: shifted means, exact std; video's 0 quantile its least value; 4: exact integer min/max)


def plan_stats(
    plan: Any, columns: Sequence[str] | str | None = None, *, per_offset: bool = False,
    derive: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    by_component: bool = False, quantiles: Sequence[float] = DEFAULT_QUANTILES,
    frames: int = 10_000, steps: int | tuple[int, int] | None = None,
    derive_version: str | int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``Plan.stats``: the statistics of the plan's own distribution (module docstring)."""
    for flag, value in (("per_offset", per_offset), ("by_component", by_component)):
        if not isinstance(value, (bool, np.bool_)):
            raise PlanError(f"plan.stats: {flag} must be True or False, got {value!r}")
    if plan.record.schedule is not None and not by_component and steps is None:
        raise PlanError(
            f"plan.stats of run {plan.run_id}: its weight schedule changes the mix with the "
            "step, so no one pooled distribution is the run's; name the steps to pool over, "
            "plan.stats(..., steps=N) or steps=(start, stop) (each component weighed by its "
            "samples there), or use by_component=True (each component's own statistics)"
        )
    shares = _shares(plan, steps)
    plan = drawn_from(plan)  # a derived run's: what it draws from its from_step on
    qs = _check_quantiles(quantiles)
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise PlanError(f"plan.stats: frames must be an integer >= 1, got {frames!r}")
    derived = _check_derive(derive, derive_version)
    kinds = _columns(plan, columns, derived)
    spec = {"algo": _ALGO, "run": plan.run_id, "columns": list(kinds), "kinds": kinds,
            "per_offset": bool(per_offset), "quantiles": list(qs), "frames": frames,
            "derive": derive_keys(derived, derive_version)}  # fmt: skip
    if steps is not None:
        spec["steps"] = [float(x) for x in shares]
    if per_offset and "video" in kinds.values():
        spec["video_per_offset"] = True  # kept results from before were pooled over offsets
    cache = RunCache(plan, spec)
    got = cache.get()
    if got is None:
        got = _compute(plan, kinds, bool(per_offset), derived, qs, frames, shares)
        cache.put(got)
    pooled, per = got
    missing = [n for n in [*kinds, *derived] if n not in pooled]
    if missing and not by_component:
        raise PlanError(f"plan.stats: no component with samples in steps={steps!r} gives {missing}")
    if by_component:
        for name, stats in per.items():
            warn_flat(stats, f"component {name!r}")
        return per
    warn_flat(pooled, "the plan")
    return pooled


def _shares(plan: Any, steps: Any) -> list[Fraction]:
    """Each component's weight, exactly: its planned share, or its part of the samples of
    ``steps`` (exact, so quantiles at ties of the pooled weights are numpy's)."""
    if steps is None:
        return [Fraction(w) for w in plan.weights]
    pair = (0, steps) if isinstance(steps, (int, np.integer)) else steps
    ok = isinstance(pair, (tuple, list)) and len(pair) == 2
    if not ok or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                         for x in pair) or not 0 <= pair[0] < pair[1]:  # fmt: skip
        raise PlanError(
            f"plan.stats: steps must be N >= 1 or (start, stop) with 0 <= start < stop, "
            f"got {steps!r}"
        )
    got = np.asarray(plan.cumulative(int(pair[1])), np.int64)
    got = got - np.asarray(plan.cumulative(int(pair[0])), np.int64)
    return [Fraction(int(x), int(got.sum())) for x in got]


def _check_quantiles(quantiles: Any) -> tuple[float, ...]:
    try:
        qs = [float(q) for q in quantiles]
    except (TypeError, ValueError):
        raise PlanError(f"plan.stats: quantiles must be numbers, got {quantiles!r}") from None
    if not all(0.0 <= q <= 1.0 for q in qs):
        raise PlanError(f"plan.stats: quantiles must be in [0, 1], got {qs}")
    return tuple(sorted(set(qs) | {0.01, 0.99}))


def _check_derive(derive: Any, version: Any) -> dict[str, Callable[[dict[str, Any]], Any]]:
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, (str, int)) or version == ""
    ):
        raise PlanError(
            f"plan.stats: derive_version must be a non-empty string or an integer, got {version!r}"
        )
    if derive is None:
        if version is not None:
            raise PlanError("plan.stats: derive_version versions derive=; no derive was given")
        return {}
    if not isinstance(derive, Mapping) or not all(
        isinstance(k, str) and callable(f) for k, f in derive.items()
    ):
        raise PlanError(f"plan.stats: derive must be a dict of name -> function, got {derive!r}")
    return dict(derive)


def _columns(plan: Any, columns: Any, derived: dict[str, Any]) -> dict[str, str]:
    """Each asked column's kind (``rows`` or ``video``), in the order asked."""
    layout = plan.layout
    kinds = {}
    for name, col in layout.items():
        if col.shape is not None:
            kinds[name] = "rows"
        elif any(p.present and isinstance(p.spec, Video)  # video, or image columns (cameras)
                 for c, p in enumerate(col.placed)):  # fmt: skip
            kinds[name] = "video"
    if columns is None:
        names = [] if derived else list(kinds)
    elif isinstance(columns, str):
        names = [columns]
    elif isinstance(columns, Sequence) and all(isinstance(n, str) for n in columns):
        names = list(columns)
    else:
        raise PlanError(f"plan.stats: columns must be a column name or a list of names, "
                        f"got {columns!r}")  # fmt: skip
    unknown = [n for n in names if n not in layout]
    if unknown:
        raise NotFound(f"plan.stats: the batch has no column(s) {unknown}; it has {list(layout)}")
    none = [n for n in names if n not in kinds]
    if none:
        raise PlanError(f"plan.stats: column(s) {none} have no statistics (not numbers or video)")
    clash = sorted(set(derived) & set(layout))
    if clash:
        raise PlanError(f"plan.stats: derive names {clash} are batch columns; name them apart")
    return {n: kinds[n] for n in names}


def _compute(
    plan: Any, kinds: dict[str, str], per_offset: bool, derived: dict[str, Any],
    qs: tuple[float, ...], frames: int, shares: list[Fraction],
) -> tuple[dict[str, ColumnStats], dict[str, dict[str, ColumnStats]]]:  # fmt: skip
    parts: dict[str, list[tuple[Fraction, Any] | None]] = {}
    for n in [*kinds, *derived]:
        parts[n] = [None] * plan.num_components
    for c in range(plan.num_components):
        a = shares[c] / plan.eligible(c)  # a Fraction: each value's exact weight
        rows = [n for n, k in kinds.items() if k == "rows" and plan.layout[n].placed[c].present]
        for n, part in _scan_rows(plan, c, rows, per_offset).items():
            parts[n][c] = (a, part)
        for n in [n for n, k in kinds.items() if k == "video"]:
            if plan.layout[n].placed[c].present:  # (share 0 in steps=: sampled for by_component)
                take = max(1, round(frames * float(shares[c] or plan.weights[c])))
                hp = _video_part(plan, c, n, take, per_offset)
                parts[n][c] = (shares[c] / hp.anchors, hp)
        if derived:
            for n, part in _derive_parts(plan, c, derived, per_offset).items():
                parts[n][c] = (a, part)
    for n in derived:
        if all(p is None for p in parts[n]):
            raise PlanError(
                f"plan.stats: derive {n!r} has no values: every one is padded or absent"
            )
    live = {n: [p for p in got if p is not None and p[0] > 0] for n, got in parts.items()}
    pooled = {n: _pool(ps, qs) for n, ps in live.items() if ps}  # none: no samples in steps=
    per: dict[str, dict[str, ColumnStats]] = {}
    for c, name in enumerate(plan.components):
        per[name] = {}
        for n, got in parts.items():
            if got[c] is not None:
                own = _own(got[c][1])
                alone = own is got[c][1] and len(live[n]) == 1 and live[n][0] is got[c]
                per[name][n] = pooled[n] if alone else _pool([(Fraction(1), own)], qs)
    return pooled, per


def _own(part: Any) -> Any:
    """A component's part in its own shape: its real dimensions only (before pad_to)."""
    if not isinstance(part, Part) or not part.shape:
        return part
    lead = math.prod(part.shape[:-1])
    shape = (*part.shape[:-1], len(part.index) // lead)
    index = np.arange(len(part.index), dtype=np.int64)
    return Part(shape, index, part.groups, part.per_offset, part.anchors)


def _pool(parts: list[tuple[Fraction, Any]], qs: tuple[float, ...]) -> ColumnStats:
    return pool_hist(parts, qs) if isinstance(parts[0][1], HistPart) else pool(parts, qs)


# -- rows: one scan per component, each row weighted by the windows that take it ------------
def _scan_rows(plan: Any, c: int, names: list[str], per_offset: bool) -> dict[str, Part]:
    if not names:
        return {}
    table, layout = plan.table(c), plan.layout
    first, stop = plan.anchor_runs(c)
    starts = np.asarray(table.episodes().starts, np.int64)
    placed = {n: layout[n].placed[c] for n in names}
    offsets = {n: np.asarray(p.spec.offsets if p.spec is not None else [0], np.int64)
               for n, p in placed.items()}  # fmt: skip
    parts = {}
    for n, p in placed.items():
        groups = len(offsets[n]) if per_offset and p.spec is not None else 1
        parts[n] = Part.new(p.row or (), p.real, groups, SKETCH_VALUES)
        parts[n].per_offset = per_offset and p.spec is not None
        parts[n].anchors = int(stop.sum() - first.sum())  # each anchor's window has its row
    cols = sorted({p.column for p in placed.values()})
    per_row = sum(len(parts[n].index) for n in names)
    every = np.concatenate(list(offsets.values()))
    reach = (int(every.min()), int(every.max()))
    base = 0
    for batch in scan_batches(table, cols, None, max(1, READ_VALUES // max(1, per_row))):
        taken = Taken(base, batch.num_rows, reach, first, stop, starts)
        base += batch.num_rows
        for n, p in placed.items():
            field = table.schema.field(p.column)
            x = window_values(batch.column(p.column), field, taken, offsets[n], table.name)
            if x is None:
                continue  # every row null, and no window of the run takes one
            x = x.reshape(len(x), -1)  # as read: rows are picked before the float64 pass
            if len(parts[n].groups) > 1:
                for g, o in enumerate(offsets[n].tolist()):
                    parts[n].add(g, np.compress(taken.by(o), x, axis=0))
            else:
                parts[n].add(0, x, taken.times(offsets[n]))
    return parts


# -- the batch path: video samples and derived values ---------------------------------------
def _batches(plan: Any, c: int, specs: list[ColumnSpec], moments: np.ndarray) -> Iterator[dict]:
    from treadle.read.sample_reader import SampleReader

    reader = SampleReader([plan.table(c)], [specs], ids=False)
    with reaper.closing(reader.close):  # closed early: on the reaper (maybe a finalizer)
        for i in range(0, len(moments), _ANCHORS):
            chunk = moments[i : i + _ANCHORS]
            yield reader.read(np.zeros(len(chunk), np.int64), chunk)


def _video_part(plan: Any, c: int, name: str, frames: int, per_offset: bool) -> HistPart:
    """Per-channel histograms ``[C, 256]`` (``per_offset``: ``[T, C, 256]``, one per window
    offset) of about ``frames`` frames of ``name`` in component ``c``, padded ones left out."""
    p = plan.layout[name].placed[c]
    spec = p.spec if p.spec is not None else Video([0])
    n = plan.eligible(c)
    want = min(n, max(1, math.ceil(frames / len(spec.offsets))))
    pick = np.random.default_rng([plan.seed, c]).choice(n, size=want, replace=False)
    moments = np.sort(plan.eligible_moments(c, np.sort(pick)))
    u8 = Video(spec.offsets, size=spec.size, pad=spec.pad)
    hist, kept = None, 0
    cs = camera_column(plan.table(c), p.column, u8, "plan.stats")  # video, or images
    for out in _batches(plan, c, [cs], moments):
        px = np.asarray(out[p.column])  # [n, T, H, W, C]
        real = np.ones(px.shape[:2], bool)
        if spec.pad:
            real = ~np.asarray(out[f"{p.column}_is_pad"])
        kept += int(real.sum())
        each = range(px.shape[1]) if per_offset else [slice(None)]
        h = np.stack([_channel_counts(px[:, t][real[:, t]]) for t in each])
        hist = h if hist is None else hist + h
    assert hist is not None
    return HistPart(hist.astype(np.float64) if per_offset else hist[0].astype(np.float64),
                    kept, want)  # fmt: skip


def _channel_counts(px: np.ndarray) -> np.ndarray:
    """``[C, 256]``: how many pixels of each channel hold each value 0..255."""
    px = px.reshape(-1, px.shape[-1])
    return np.stack([np.bincount(px[:, ch], minlength=256) for ch in range(px.shape[1])])


def _derive_parts(plan: Any, c: int, derived: dict[str, Any], per_offset: bool) -> dict[str, Part]:
    return derive_parts(plan, c, derived, per_offset, _batches, SKETCH_VALUES)

"""The run record as a readable card (``treadle plan`` and ``treadle demo`` print it).

:func:`render_card` shows the pinned tables, each component's weight, share and per-batch
count, the windows, what the selection keeps, the seed and the first slots of each rank.
Pure: it reads a :class:`RunRecord` (and optionally its :class:`Plan`), nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord
from treadle.plan.stack import component_names
from treadle.plan.stages import RAMP_PIECES, stage_shares
from treadle.plan.windows import Rows, Spec, Windows


def _offsets_text(offsets: tuple[int, ...]) -> str:
    if len(offsets) > 2 and offsets == tuple(range(offsets[0], offsets[-1] + 1)):
        return f"{offsets[0]}..{offsets[-1]}"
    if len(offsets) > 6:
        return ", ".join(str(o) for o in offsets[:5]) + f", … ({len(offsets)})"
    return ", ".join(str(o) for o in offsets)


def _spec_text(spec: Spec) -> str:
    pad = " pad" if spec.pad else ""
    if isinstance(spec, Rows):
        return f"Rows[{_offsets_text(spec.offsets)}]{pad}"
    extra = ["pad"] if spec.pad else []
    if spec.size:
        extra.append(f"{spec.size[0]}x{spec.size[1]}")
    if spec.layout != "THWC":
        extra.append(spec.layout)
    if spec.dtype != "uint8":
        extra.append(spec.dtype)
    tail = (" " + " ".join(extra)) if extra else ""
    return f"Video[{_offsets_text(spec.offsets)}]{tail}"


def windows_text(windows: Windows | None) -> str:
    """``cam Video[0..89] 224x224, action Rows[0..89]``; ``every column at the moment``."""
    if windows is None:
        return "every column at the moment"
    if not windows.specs:
        return "no columns"
    return ", ".join(f"{col} {_spec_text(spec)}" for col, spec in windows.items())


KEPT_WARNING = 0.9
"""The card warns when a component keeps fewer than this share of its table's moments."""


def kept_text(kept: int, moments: int) -> str:
    """``18 of 24 moments kept (75%)``."""
    pct = 100 * kept / moments if moments else 0.0
    return f"{kept:,} of {moments:,} moments kept ({pct:.0f}%)"


def _weight_text(w: float) -> str:
    return f"{w:.6g}"


def share_text(asked: Fraction, planned: Fraction) -> str:
    """``share 3/10 = 0.3, exact`` or ``share asked 0.0333333333, planned 33333/999999 = ...``."""
    if asked == planned:
        return f"share {planned.numerator}/{planned.denominator} = {float(planned):.9g}, exact"
    return (
        f"share asked {float(asked):.9g}, planned {planned.numerator}/{planned.denominator} "
        f"= {float(planned):.9g} (off by {float(abs(planned - asked)):.2g})"
    )


def render_card(
    record: RunRecord, *, world_size: int = 1, plan: Plan | None = None, slots: int = 3
) -> str:
    """The run record as text: pinned tables, weights and per-batch counts, seed, rank slots.

    With ``plan``, each rank's first slots of step 0 also show which sample they hold
    (``c<component>:<moment>``).
    """
    b = record.batch_size
    width = max(len(t.name) for t in record.tables)
    lines = [
        f"Run record {record.run_id} · {record.project} · {record.algorithm}",
        f"{len(record.tables)} tables · {len(record.components)} components · "
        f"seed {record.seed} · batch {b}",
        *_derived_lines(record),
        "",
        "01 Pin each table to a version.",
        *_table_lines(record, width),
        "",
        f"02 Plan weighted draws{_weigh_by_text(record)}. Each batch of {b} holds, per component:",
    ]
    for i in range(len(record.components)):
        lines += _component_lines(record, i, width)
    lines += schedule_lines(record)
    lines.append(f"   seed = {record.seed}")
    lines += shuffle_lines(record)
    lines += [
        "",
        f"03 Divide the work among ranks ({world_size} rank"
        f"{'s' if world_size != 1 else ''}, {b // world_size if b % world_size == 0 else '?'}"
        " slots each).",
        *_rank_lines(record, world_size, plan, slots),
    ]
    return "\n".join(lines) + "\n"


def _table_lines(record: RunRecord, width: int) -> list[str]:
    """Part 01: each pinned table with its branch, commit, version and counts."""
    lines = []
    for t in record.tables:
        where = (
            f"{t.branch} ({t.commit[:8]})"
            if t.branch and t.commit
            else (t.commit[:8] if t.commit else "pinned")
        )
        lines.append(
            f"   {t.name:<{width}} @ {where} v{t.version} → {t.num_moments:,} moments, "
            f"{t.num_episodes:,} episode{'' if t.num_episodes == 1 else 's'}"
        )
    return lines


def _component_lines(record: RunRecord, i: int, width: int) -> list[str]:
    """Part 02, component ``i``: weight, share, per-batch count, kept moments, windows,
    selection, and a warning when it keeps under :data:`KEPT_WARNING` of its table."""
    b, d = record.batch_size, record.weight_denominator
    c = record.components[i]
    t = record.tables[c.table]
    n = c.weight_quantised
    lo, hi = n * b // d, -(-n * b // d)
    per_batch = f"{lo}" if lo == hi else f"{lo} or {hi}"
    weight = _weight_text(c.weight) + (
        "" if record.weigh_by is None else f" × {c.eligible:,} moments"
    )
    mix = f"weight {weight} → {share_text(record.asked_weights[i], Fraction(n, d))}"
    mix += f"  ·  {per_batch} per batch"
    if record.schedule is not None:
        mix = "share by stage (schedule below)"
    name = component_names(record)[i]
    label = t.name if name == t.name else f"{name} ({t.name})"
    lines = [
        f"   [{i}] {label:<{width}}  {mix}  ·  {kept_text(c.eligible, t.num_moments)}",
        f"       windows: {windows_text(c.windows)}",
    ]
    for key, value in c.selection().items():
        if key == "name":
            continue  # on the component's line
        if key == "episodes" and len(value) > 5:
            value = f"{len(value):,} episodes ({', '.join(value[:5])}, …)"
        lines.append(f"       {key}: {value}")
    if c.eligible < KEPT_WARNING * t.num_moments:
        why = (
            "its where/episodes selection and windows leave the rest"
            if c.selection().keys() & {"where", "episodes"}
            else "windows that reach past an episode's ends drop its first/last moments "
            "(pad=True keeps them)"
        )
        lines.append(
            f"       warning: this recipe keeps {c.eligible / t.num_moments:.0%} of "
            f"table {t.name!r}'s moments as anchors; {why}"
        )
    return lines


def _weigh_by_text(record: RunRecord) -> str:
    """`` by size (weigh_by="moments": share ∝ weight × eligible moments)``, or nothing."""
    if record.weigh_by is None:
        return ""
    return f' by size (weigh_by="{record.weigh_by}": share ∝ weight × eligible moments)'


def _rank_lines(record: RunRecord, world_size: int, plan: Plan | None, slots: int) -> list[str]:
    """Part 03: each rank's first slots (and, with ``plan``, the samples of step 0)."""
    b = record.batch_size
    if b % world_size:
        return [f"   batch size {b} is not divisible by {world_size} ranks"]
    lines = []
    digits = max(4, len(str(b - 1)))
    for r in range(world_size):
        first = list(range(r, b, world_size))[:slots]
        text = ", ".join(f"{s:0{digits}d}" for s in first)
        more = ", …" if b // world_size > slots else ""
        line = f"   rank {r} [{text}{more}]"
        if plan is not None:
            batch = plan.batch(0, r, world_size)
            samples = ", ".join(
                f"c{c}:{m}"
                for c, m in zip(batch.component[:slots].tolist(), batch.moment[:slots].tolist())
            )
            line += f"  step 0: {samples}{more}"
        lines.append(line)
    return lines


def _fraction_text(f: Fraction) -> str:
    return "0" if f == 0 else f"{f.numerator}/{f.denominator}"


def schedule_lines(record: RunRecord) -> list[str]:
    """The weight schedule: each stage's start and each component's share in it (a ramp's
    target, reached over its steps); nothing for a recipe without one."""
    if record.schedule is None:
        return []
    lines = [f"   schedule: {len(record.schedule.stages)} stages (they replace the weights above)"]
    names = component_names(record)
    stages, pieces = record.schedule.stages, record.schedule.pieces(sizes=record.sizes)

    def text(shares: Sequence[Fraction]) -> str:
        return ", ".join(
            f"[{i}] {n} {_fraction_text(f)}" for i, (n, f) in enumerate(zip(names, shares))
        )

    for k, (stage, shares) in enumerate(zip(stages, stage_shares(record.schedule, record.sizes))):
        line = f"     stage {k} from step {stage.start:,}: {text(shares)}"
        if stage.ramp:
            planned = min(stage.ramp, RAMP_PIECES)
            end = stages[k + 1].start if k + 1 < len(stages) else None
            ours = [sh for st, sh in pieces if st >= stage.start and (end is None or st < end)]
            line = f"     stage {k} from step {stage.start:,}: ramp over {stage.ramp:,} steps"
            if len(ours) < planned:  # the next stage starts before the ramp's last piece
                line += (f", cut short at step {end:,} after {len(ours)} of its {planned} "
                         f"pieces, reaching {text(ours[-1])} (of {text(shares)})")  # fmt: skip
            else:
                line += f" ({planned} pieces) to {text(shares)}"
        lines.append(line)
    return lines


def _derived_lines(record: RunRecord) -> list[str]:
    d = record.derived
    if d is None:
        return []
    return [
        f"derived from {st.parent} at step {st.from_step:,}, excluding {st.num_episodes:,} "
        f"episode{'' if st.num_episodes == 1 else 's'} ({st.moments:,} moments)"
        for st in d.stages
    ]


def _bytes_text(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def shuffle_lines(record: RunRecord) -> list[str]:
    """The shuffle the draws walk, and for a block shuffle the cache its open blocks need."""
    sh = record.shuffle
    if sh is None:
        return ["   shuffle: full permutation of each component's eligible moments, per epoch"]
    rows = sorted(set(sh.block_rows))
    rows_text = f"{rows[0]:,}" if len(rows) == 1 else "/".join(f"{r:,}" for r in sh.block_rows)
    parts = f"{sh.partitions} partition{'s' if sh.partitions != 1 else ''}"
    w = sh.window_blocks
    lines = [
        f"   shuffle: {sh.identity()['algorithm']}, blocks of {rows_text} rows, "
        f"at most {w} open at once per {'partition of a ' if sh.partitions > 1 else ''}"
        f"component, {parts}"
    ]
    eligible = [c.eligible for c in record.components]
    whole = [i for i, k in enumerate(sh.blocks(eligible)) if k == 1]
    if whole:  # block_rows past a partition is capped (the same draws): say what it reads
        who = ", ".join(str(i) for i in whole[:6]) + (", …" if len(whole) > 6 else "")
        reads = "shuffles it whole" if w == 1 else f"reads it in {w} parts in table order"
        lines.append(
            f"   component{'s' if len(whole) > 1 else ''} {who}: one block a partition "
            f"(block_rows is capped at a partition's moments: a larger one draws the same); "
            f"an epoch {reads}" + ("" if w == 1 else ", shuffled within each")
        )
    need = sh.cache_needed(eligible)
    if need is not None:  # a segment reads 1/w of each open block; the next is fetched ahead
        lines.append(
            f"   cache needed: {_bytes_text(need)} for two blocks' rows per component (a "
            f"segment reads 1/{w} of each of its {w} open blocks; the next segment is fetched "
            "ahead), per partition a node reads; twice that with the chunks they straddle"
        )
    return lines

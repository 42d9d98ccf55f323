"""Weight schedules: a mix that changes with the step, exactly, in O(1) per step.

``Schedule([(start_step, weights | Ramp(weights, steps=N)), ...])`` is a list of stages; the
first starts at step 0 and the starts increase. A stage's weights replace the components'
own weights from its start step until the next stage starts; a weight of 0 leaves the
component out of that stage.

**Pieces.** The schedule is planned as constant *pieces*. A plain stage is one piece. A
``Ramp`` to ``b`` over ``N`` steps, from the shares ``a`` in force just before it, is
``K = min(N, RAMP_PIECES)`` pieces: piece ``k = 1..K`` starts ``floor((k-1)*N/K)`` steps into
the stage and plans the shares ``a + (b - a)*k/K`` (exact rationals; the last piece, at ``b``,
lasts until the next stage). ``a`` is the previous stage's shares (its target, when it is a
ramp itself), so the denominators stay those of two stages' weights times ``K``. A stage that
starts before the ramp ends cuts it short, and the mix steps to the new stage there. Within a piece the mix is exact as for a recipe without a
schedule: every batch holds floor or ceil of ``share*B`` of each component, and the
running count since the piece's start stays within one sample of ``share*B*steps``
(:mod:`treadle.plan.schedule`, one PD2 seat schedule per distinct piece).

**Draws continue.** ``cumulative(step)`` sums each component's samples over the whole
schedule (every earlier piece's total, exact integers, plus the current piece's count), so a
component's draw indices go on 0, 1, 2, ... across stages, none repeated or skipped.
``counts`` and ``cumulative`` cost O(log pieces + components) at any step. Pieces with the
same shares share one seat table; all of a schedule's tables together are bounded like one
recipe's (64 MiB, e.g. 8 distinct pieces with a 10**6-step period), else a ``PlanError``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from treadle.errors import PlanError, PlanWarning
from treadle.plan.schedule import MAX_SCHEDULE_WORDS
from treadle.plan.schedule import Schedule as Seats
from treadle.plan.shares import check_planned, decimal_weight, printed_float, realise_shares

RAMP_PIECES = 10
"""A ramp is planned as at most this many constant pieces (k/10 keeps decimals decimal)."""
MAX_STAGES = 1000


def _weights(weights: Any, what: str) -> tuple[float, ...]:
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        raise PlanError(f"{what} must be a non-empty list of weights, got {weights!r}")
    out = []
    for w in weights:
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise PlanError(f"{what}: weights must be numbers >= 0, got {w!r}")
        v = printed_float(w)
        if not math.isfinite(v) or v < 0:
            raise PlanError(f"{what}: weights must be finite and >= 0, got {w!r}")
        out.append(v)
    if not any(out):
        raise PlanError(f"{what}: every weight is 0; a stage needs one component to draw from")
    return tuple(out)


def _shares(weights: Sequence[float], sizes: Sequence[int] | None = None) -> tuple[Fraction, ...]:
    """Exact shares of a stage's weights (``sizes``: each times its component's size,
    ``weigh_by="moments"``)."""
    exact = [decimal_weight(w) if w else Fraction(0) for w in weights]
    if sizes is not None:
        exact = [w * n for w, n in zip(exact, sizes, strict=True)]
    total = sum(exact)
    return tuple(w / total for w in exact)


@dataclass(frozen=True)
class Ramp:
    """A linear ramp of the shares to ``weights`` over ``steps`` steps (from the shares in
    force before the stage), planned as :data:`RAMP_PIECES` constant pieces at most."""

    weights: tuple[float, ...]
    steps: int

    def __init__(self, weights: Sequence[float], steps: int):
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise PlanError(f"Ramp steps must be an integer >= 1, got {steps!r}")
        object.__setattr__(self, "weights", _weights(weights, "Ramp weights"))
        object.__setattr__(self, "steps", int(steps))


@dataclass(frozen=True)
class Stage:
    """One stage: from ``start`` on, ``weights`` (reached over ``ramp`` steps; 0: at once)."""

    start: int
    weights: tuple[float, ...]
    ramp: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "weights": list(self.weights)}
        if self.ramp:
            out["ramp"] = self.ramp
        return out


class Schedule:
    """Stages of weights by start step: ``Schedule([(0, [0.9, 0.1]), (1000, [0.5, 0.5]),
    (5000, Ramp([0.2, 0.8], steps=2000))])``."""

    def __init__(self, stages: Sequence[tuple[int, Sequence[float] | Ramp]]):
        if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
            raise PlanError(
                f"Schedule needs a non-empty list of (start_step, weights), got {stages!r}"
            )
        if len(stages) > MAX_STAGES:
            raise PlanError(f"Schedule has {len(stages)} stages; at most {MAX_STAGES}")
        out: list[Stage] = []
        for i, item in enumerate(stages):
            if not isinstance(item, Sequence) or len(item) != 2:
                raise PlanError(f"Schedule stage {i} must be (start_step, weights), got {item!r}")
            start, what = item
            if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
                raise PlanError(f"Schedule stage {i}: start step must be an integer, got {start!r}")
            start = int(start)
            if (i == 0 and start != 0) or (i and start <= out[-1].start):
                raise PlanError(
                    f"Schedule stage {i} starts at step {start}: the first stage starts at 0 "
                    f"and each later one after the one before"
                )
            if isinstance(what, Ramp):
                if i == 0:
                    raise PlanError("Schedule stage 0 is a Ramp: there is nothing to ramp from")
                out.append(Stage(start, what.weights, what.steps))
            else:
                out.append(Stage(start, _weights(what, f"Schedule stage {i}")))
        if len({len(s.weights) for s in out}) != 1:
            raise PlanError(
                f"Schedule stages give {sorted({len(s.weights) for s in out})} "
                f"weights; every stage needs one weight per component"
            )
        self.stages = tuple(out)

    @property
    def num_components(self) -> int:
        return len(self.stages[0].weights)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.stages == other.stages

    def __hash__(self) -> int:
        return hash(self.stages)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.stages]

    @classmethod
    def from_json(cls, value: Any) -> Schedule:
        if not isinstance(value, list):
            raise PlanError(f"run record field 'schedule' must be a list, got {value!r}")
        stages: list[tuple[int, Any]] = []
        for i, s in enumerate(value):
            if not isinstance(s, dict) or not {"start", "weights"} <= s.keys() <= {
                "start",
                "weights",
                "ramp",
            }:
                raise PlanError(f"run record schedule[{i}] must have start, weights (, ramp)")
            w = s["weights"]
            stages.append((s["start"], Ramp(w, s["ramp"]) if "ramp" in s else w))
        return cls(stages)

    def pieces(
        self, last: int | None = None, sizes: Sequence[int] | None = None
    ) -> list[tuple[int, tuple[Fraction, ...]]]:
        """(start step, exact shares) of every constant piece, in order (see the module);
        ``sizes``: each weight times its component's eligible moments (``weigh_by``)."""
        out: list[tuple[int, tuple[Fraction, ...]]] = []
        for i, s in enumerate(self.stages):
            b = _shares(s.weights, sizes)
            if not s.ramp:
                out.append((s.start, b))
                continue
            a = _shares(self.stages[i - 1].weights, sizes)
            nxt = self.stages[i + 1].start if i + 1 < len(self.stages) else None
            k_all = min(s.ramp, RAMP_PIECES)
            for k in range(1, k_all + 1):
                start = s.start + (k - 1) * s.ramp // k_all
                if nxt is not None and start >= nxt:
                    break  # the next stage starts before the ramp ends
                out.append((start, tuple(x + (y - x) * k / k_all for x, y in zip(a, b))))
        return out

    def __repr__(self) -> str:
        return f"Schedule({self.to_json()!r})"


def _period(nums: Sequence[int], den: int, batch_size: int) -> int:
    """The PD2 period of a piece (as :class:`~treadle.plan.schedule.Schedule` computes it)."""
    return den // math.gcd(den, *(n * batch_size % den for n in nums))


def stage_shares(
    schedule: Schedule, sizes: Sequence[int] | None = None
) -> list[tuple[Fraction, ...]]:
    """Each stage's asked shares (a ramp's: those it reaches); ``sizes`` as in ``pieces``."""
    return [_shares(s.weights, sizes) for s in schedule.stages]


class StagedSeats:
    """Seat counts of every step over a schedule's pieces: the interface of
    :class:`treadle.plan.schedule.Schedule` (``counts``, ``cumulative``)."""

    def __init__(self, pieces: Sequence[tuple[int, Sequence[Fraction]]], batch_size: int):
        self.batch_size = int(batch_size)
        self.starts = [p[0] for p in pieces]
        self.shares = [tuple(p[1]) for p in pieces]
        self.seats: list[Seats] = []
        self.planned: list[tuple[Fraction, ...]] = []
        realised = [realise_shares(shares, batch_size) for _, shares in pieces]
        distinct = dict.fromkeys(realised)
        words = sum(_period(n, d, batch_size) * ((len(n) + 63) // 64) for n, d in distinct)
        if words > MAX_SCHEDULE_WORDS:
            raise PlanError(
                f"the schedule's {len(distinct)} distinct pieces repeat so rarely that their "
                f"seat tables need over {MAX_SCHEDULE_WORDS * 8 >> 20} MiB ({words:,} words); "
                f"use weights with smaller common denominators or fewer ramps"
            )
        built = {key: Seats(key[0], key[1], batch_size) for key in distinct}
        for nums, den in realised:
            self.seats.append(built[nums, den])
            self.planned.append(tuple(Fraction(n, den) for n in nums))
        self.before: list[list[int]] = [[0] * len(self.shares[0])]
        for k in range(1, len(pieces)):
            length = self.starts[k] - self.starts[k - 1]
            got = self.seats[k - 1].cumulative(length)
            self.before.append([x + y for x, y in zip(self.before[-1], got, strict=True)])

    @property
    def num_components(self) -> int:
        return len(self.shares[0])

    def piece(self, step: int) -> int:
        """The piece in force at ``step``."""
        return bisect_right(self.starts, step) - 1

    def counts(self, step: int) -> np.ndarray:
        k = self.piece(step)
        return self.seats[k].counts(step - self.starts[k])

    def cumulative(self, step: int) -> list[int]:
        k = self.piece(step)
        got = self.seats[k].cumulative(step - self.starts[k])
        return [x + y for x, y in zip(self.before[k], got, strict=True)]


def check_schedule(
    schedule: Schedule, batch_size: int, labels: Sequence[str], sizes: Sequence[int] | None = None
) -> StagedSeats:
    """The schedule's seats at ``batch_size``; each piece's shares checked as a recipe's are
    (:func:`~treadle.plan.shares.check_planned`: refused when moved more than 1%, else a
    warning when moved at all). ``labels`` name the components. A component at weight 0 in
    every stage is kept but warned of (:class:`~treadle.errors.PlanWarning`): never drawn."""
    if schedule.num_components != len(labels):
        raise PlanError(
            f"schedule gives {schedule.num_components} weights per stage for "
            f"{len(labels)} components"
        )
    never = [x for c, x in enumerate(labels) if not any(s.weights[c] for s in schedule.stages)]
    if never:  # kept (its layout, EvalLoader(only=), by_component stats) but said
        warnings.warn(
            f"{'; '.join(never)}: weight 0 in every stage of the schedule, so never drawn "
            "(it still shapes the batch's columns and can be evaluated with "
            "EvalLoader(plan, only=...)); remove it from the recipe if that is not meant",
            PlanWarning,
            stacklevel=3,
        )
    seats = StagedSeats(schedule.pieces(sizes=sizes), batch_size)
    for start, asked, planned in zip(seats.starts, seats.shares, seats.planned, strict=True):
        check_planned(asked, planned, batch_size, [f"from step {start:,}, {x}" for x in labels])
    return seats

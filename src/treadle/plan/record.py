"""The run record: everything that fixes a run's batches, as JSON, and its ``run_id``.

Layout (``to_json()``; keys sorted)::

    {
      "algorithm": "treadle.plan/2",
      "project": "robotics",
      "seed": 2048, "batch_size": 64, "weight_denominator": 10,
      "tables": [
        {"name": "failed_grasps", "branch": "main", "commit": "01a1a71d...", "version": 7,
         "num_moments": 9412, "num_episodes": 40}, ...
      ],
      "components": [
        {"table": 0, "windows": {...} | null, "weight": 0.3, "weight_quantised": 3,
         "eligible": 8100}, ...
      ],
      "run_id": "3f0c..."
    }

``components[i].table`` indexes ``tables``. A component may also carry ``where`` (a Lance
SQL predicate on the anchor's row), ``episodes`` (names anchors are drawn from) and
``rename`` (table column -> batch name); each is written and hashed only when set. ``windows`` is ``Windows.to_json()``, or null for
"every column at the moment itself". ``weight`` is what the user asked for (its share is its
decimal value over the sum, :func:`~treadle.plan.shares.asked_shares`); the share planned is
``weight_quantised / weight_denominator``, which :func:`~treadle.plan.shares.realise_weights`
derives from the weights and batch size: the asked share exactly when the shares have a common
denominator up to 10**6, else within 1e-6 of it. Parsing re-derives it and refuses a record
whose numerators do not match its weights.

Records of ``treadle.plan/1`` (weights rounded to k/1000, ``weight_denominator`` 1000) are
still read and planned as they were: their numerators are used as recorded, and the schedule
and permutations did not change, so such a run resumes with the same batches and ``run_id``.
``branch`` is null for a
table that was pinned explicitly (``TableRef.at(...)``); ``commit`` is null for a table pinned
by Lance version alone.

A record may also carry ``schedule`` (stages of weights by step,
:class:`~treadle.plan.stages.Schedule`: ``[{"start": 0, "weights": [...]}, {"start": 1000,
"weights": [...], "ramp": 500}]``); it replaces the components' weights and is written and
hashed only when set, so a new schedule is a new run. ``weigh_by: "moments"`` (also written
and hashed only when set; a record without it plans as before) makes each asked share
``weight x eligible`` over their sum, the realised numerators re-derived from those. A derived run
(``plan.exclude``) carries ``derived``: ``{"parent": run_id, "from_step": S, "episodes":
{table: [names]}, "moments": M}``, also hashed; a run derived again adds ``"earlier"``, the
exclusions before it (oldest first). A block-shuffled run carries ``shuffle``
(:mod:`treadle.plan.shuffle`), hashed but for its ``row_bytes``; without it a run walks the
full permutation, as every record before it did.

``run_id`` is the first 16 hex digits of the sha256 of the canonical JSON (sorted keys, no
spaces) of what determines batches: algorithm, project, for each component its table name and
Lance version, windows and quantised weight, the weight denominator, seed and batch size. Commit
ids, branch names, user weights and counts are not part of it: a commit that leaves a table's
version alone (a checkpoint row in another table) does not start a new run. Rank count never
enters a record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from treadle.errors import PlanError
from treadle.plan.entries import ComponentEntry, TableEntry, check_keys, int_field, str_field
from treadle.plan.exclude import Exclusion
from treadle.plan.shares import asked_shares, realise_weights
from treadle.plan.shuffle import BlockPlan
from treadle.plan.stages import Schedule

ALGORITHM = "treadle.plan/2"
LEGACY_ALGORITHM = "treadle.plan/1"
"""Weights rounded to k/1000; read and planned as recorded."""
_LEGACY_DENOMINATOR = 1000
_ALGORITHMS = (ALGORITHM, LEGACY_ALGORITHM)
_MAX_SEED = 2**64 - 1
_TOP_KEYS = {
    "algorithm",
    "project",
    "seed",
    "batch_size",
    "weight_denominator",
    "tables",
    "components",
    "run_id",
    "schedule",
    "derived",
    "weigh_by",
    "shuffle",
}
WEIGH_BY = ("moments",)
"""``weigh_by`` values: ``"moments"``, each share ∝ weight × the component's eligible moments."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII: the form that is hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class RunRecord:
    """What a run reads, and in which order: pinned tables, windows, weights, seed, batch size."""

    project: str
    seed: int
    batch_size: int
    weight_denominator: int
    tables: tuple[TableEntry, ...]
    components: tuple[ComponentEntry, ...]
    algorithm: str = ALGORITHM
    schedule: Schedule | None = None
    derived: Exclusion | None = None
    """Parent run, step and excluded episodes of a derived run (``plan.exclude``)."""
    weigh_by: str | None = None
    """``"moments"``: each asked share ∝ weight × eligible moments. Written and hashed only
    when set."""
    shuffle: BlockPlan | None = None
    """A block shuffle (:mod:`treadle.plan.shuffle`); None: the full permutation. Written
    and hashed only when set, so older records keep their run ids."""
    """Stages of weights by step (:mod:`treadle.plan.stages`); they replace the components'
    weights. Written and hashed only when set."""

    def __post_init__(self) -> None:
        _validate(self)

    # -- identity ---------------------------------------------------------------------------

    def _head(self) -> dict[str, Any]:
        """The top-level scalar fields, shared by :meth:`identity` and :meth:`to_dict`."""
        return {
            "algorithm": self.algorithm,
            "project": self.project,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "weight_denominator": self.weight_denominator,
        }

    def _extra(self, hashed: bool = False) -> dict[str, Any]:
        out = {} if self.schedule is None else {"schedule": self.schedule.to_json()}
        if self.weigh_by is not None:
            out["weigh_by"] = self.weigh_by
        if self.shuffle is not None:
            out["shuffle"] = self.shuffle.identity() if hashed else self.shuffle.to_json()
        return out if self.derived is None else {**out, "derived": self.derived.to_json()}

    def identity(self) -> dict[str, Any]:
        """The part of the record that determines batches (hashed into ``run_id``)."""
        return {
            **self._head(),
            **self._extra(hashed=True),
            "components": [
                {
                    "table": self.tables[c.table].name,
                    "version": self.tables[c.table].version,
                    "windows": None if c.windows is None else c.windows.to_json(),
                    "weight": c.weight_quantised,
                    **c.selection(),
                }
                for c in self.components
            ],
        }

    @property
    def run_id(self) -> str:
        """16 hex digits of sha256 over :meth:`identity` (canonical JSON)."""
        digest = hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()
        return digest[:16]

    # -- convenience ------------------------------------------------------------------------

    @property
    def num_components(self) -> int:
        return len(self.components)

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """Shares planned, exact: ``weight_quantised / weight_denominator``."""
        return tuple(Fraction(c.weight_quantised, self.weight_denominator) for c in self.components)

    @property
    def asked_weights(self) -> tuple[Fraction, ...]:
        """Shares asked for, exact: each decimal ``weight`` over their sum (``weigh_by``:
        each weight times its eligible moments)."""
        return asked_shares([c.weight for c in self.components], self.sizes)

    @property
    def sizes(self) -> tuple[int, ...] | None:
        """What each weight is multiplied by (``weigh_by="moments"``: eligible moments)."""
        return None if self.weigh_by is None else tuple(c.eligible for c in self.components)

    def table_of(self, component: int) -> TableEntry:
        """The pinned table a component reads."""
        return self.tables[self.components[component].table]

    # -- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._head(),
            **self._extra(),
            "tables": [t.to_dict() for t in self.tables],
            "components": [c.to_dict() for c in self.components],
            "run_id": self.run_id,
        }

    def to_json(self, indent: int | None = None) -> str:
        """JSON text (sorted keys); ``indent`` for a human-readable form."""
        if indent is None:
            return canonical_json(self.to_dict())
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls, value: str | bytes | dict[str, Any]) -> RunRecord:
        """Parse and strictly validate a record (text or an already-decoded dict).

        Unknown or missing fields, wrong types, and a ``run_id`` that does not match the
        contents raise :class:`PlanError` naming the field.
        """
        if isinstance(value, (str, bytes, bytearray)):
            try:
                value = json.loads(value)
            except (ValueError, UnicodeDecodeError) as e:
                raise PlanError(f"run record is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise PlanError(f"run record must be a JSON object, got {type(value).__name__}")
        optional = {"run_id", "schedule", "derived", "weigh_by", "shuffle"}
        check_keys(value, _TOP_KEYS - optional, _TOP_KEYS, "run record")
        algorithm = str_field(value, "algorithm", "run record")
        if algorithm not in _ALGORITHMS:
            raise PlanError(
                f"run record field 'algorithm' is {algorithm!r}; this treadle plans "
                f"{ALGORITHM!r} (and reads {LEGACY_ALGORITHM!r})"
            )
        tables_raw = value["tables"]
        if not isinstance(tables_raw, list) or not tables_raw:
            raise PlanError("run record field 'tables' must be a non-empty list")
        tables = [
            TableEntry.from_dict(t, f"run record tables[{i}]") for i, t in enumerate(tables_raw)
        ]
        comps_raw = value["components"]
        if not isinstance(comps_raw, list) or not comps_raw:
            raise PlanError("run record field 'components' must be a non-empty list")
        comps = [
            ComponentEntry.from_dict(c, f"run record components[{i}]")
            for i, c in enumerate(comps_raw)
        ]
        record = cls(
            project=str_field(value, "project", "run record"),
            seed=int_field(value, "seed", "run record"),
            batch_size=int_field(value, "batch_size", "run record"),
            weight_denominator=int_field(value, "weight_denominator", "run record"),
            tables=tuple(tables),
            components=tuple(comps),
            algorithm=algorithm,
            schedule=Schedule.from_json(value["schedule"]) if "schedule" in value else None,
            derived=Exclusion.from_json(value["derived"]) if "derived" in value else None,
            weigh_by=value.get("weigh_by"),
            shuffle=(
                BlockPlan.from_json(value["shuffle"], len(comps)) if "shuffle" in value else None
            ),  # fmt: skip
        )
        if "run_id" in value and value["run_id"] != record.run_id:
            raise PlanError(
                f"run record field 'run_id' is {value['run_id']!r} but its contents hash to "
                f"{record.run_id!r} (the record was edited)"
            )
        return record


def _validate(r: RunRecord) -> None:
    """Checks shared by construction and parsing; each error names the field."""
    if r.algorithm not in _ALGORITHMS:
        raise PlanError(
            f"run record field 'algorithm' must be {ALGORITHM!r} or {LEGACY_ALGORITHM!r}, "
            f"got {r.algorithm!r}"
        )
    if not isinstance(r.project, str) or not r.project:
        raise PlanError(f"run record field 'project' must be a non-empty string, got {r.project!r}")
    for key in ("seed", "batch_size", "weight_denominator"):
        v = getattr(r, key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise PlanError(f"run record field {key!r} must be an integer, got {v!r}")
    if not 0 <= r.seed <= _MAX_SEED:
        raise PlanError(f"run record field 'seed' must be in 0..2**64-1, got {r.seed}")
    if r.batch_size < 1:
        raise PlanError(f"run record field 'batch_size' must be >= 1, got {r.batch_size}")
    if r.weight_denominator < 1:
        raise PlanError(
            f"run record field 'weight_denominator' must be >= 1, got {r.weight_denominator}"
        )
    if not r.tables:
        raise PlanError("run record field 'tables' is empty")
    if not r.components:
        raise PlanError("run record field 'components' is empty")
    if r.weigh_by is not None:
        _validate_weigh_by(r)
    _validate_entries(r)
    _validate_weights(r)
    if r.shuffle is not None and len(r.shuffle.block_rows) != len(r.components):
        raise PlanError(
            f"run record field 'shuffle.block_rows' lists {len(r.shuffle.block_rows)} sizes "
            f"for {len(r.components)} components"
        )
    if r.schedule is not None:
        if not isinstance(r.schedule, Schedule):
            raise PlanError(
                f"run record field 'schedule' must be a td.Schedule, got {r.schedule!r}"
            )
        if r.schedule.num_components != len(r.components):
            raise PlanError(
                f"run record field 'schedule' gives {r.schedule.num_components} weights per "
                f"stage for {len(r.components)} components"
            )


def _validate_weigh_by(r: RunRecord) -> None:
    if r.weigh_by not in WEIGH_BY:
        raise PlanError(
            f"run record field 'weigh_by' must be 'moments' or absent, got {r.weigh_by!r}"
        )
    if r.algorithm != ALGORITHM:
        raise PlanError(f"run record field 'weigh_by' needs algorithm {ALGORITHM!r}")


def _validate_entries(r: RunRecord) -> None:
    """Each table's counts, and each component's table index, weights and eligible count."""
    for i, t in enumerate(r.tables):
        if t.version < 0 or t.num_moments < 0 or t.num_episodes < 0:
            raise PlanError(f"run record tables[{i}] has a negative version or count")
    for i, c in enumerate(r.components):
        if not 0 <= c.table < len(r.tables):
            raise PlanError(
                f"run record components[{i}] field 'table' is {c.table}, "
                f"but there are {len(r.tables)} tables"
            )
        if c.weight_quantised < 1:
            raise PlanError(f"run record components[{i}] field 'weight_quantised' must be >= 1")
        if not (c.weight > 0 and c.weight != float("inf")):
            raise PlanError(f"run record components[{i}] field 'weight' must be positive, finite")
        if c.eligible < 1:
            raise PlanError(f"run record components[{i}] field 'eligible' must be >= 1")
        if c.eligible > r.tables[c.table].num_moments:
            raise PlanError(
                f"run record components[{i}] field 'eligible' exceeds its table's num_moments"
            )


def _validate_weights(r: RunRecord) -> None:
    """The quantised weights: they sum to the denominator, which the weights determine."""
    total = sum(c.weight_quantised for c in r.components)
    if total != r.weight_denominator:
        raise PlanError(
            f"run record quantised weights sum to {total}, not weight_denominator "
            f"{r.weight_denominator}"
        )
    if r.algorithm == LEGACY_ALGORITHM:
        if r.weight_denominator != _LEGACY_DENOMINATOR:
            raise PlanError(
                f"run record field 'weight_denominator' of a {LEGACY_ALGORITHM!r} record must "
                f"be {_LEGACY_DENOMINATOR}, got {r.weight_denominator}"
            )
        return
    nums, den = realise_weights([c.weight for c in r.components], r.batch_size, r.sizes)
    got = tuple(c.weight_quantised for c in r.components)
    if (got, r.weight_denominator) != (nums, den):
        raise PlanError(
            f"run record fields 'weight_quantised' {list(got)} / 'weight_denominator' "
            f"{r.weight_denominator} do not match its weights at batch size {r.batch_size}, "
            f"which plan {list(nums)} / {den}"
        )

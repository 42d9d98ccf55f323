"""The entries of a run record: one pinned table, one component; each parsed field by field.

:class:`~treadle.plan.record.RunRecord` holds a tuple of each; its module documents the JSON
layout. Parsing is strict: a missing or unknown field, or a value of the wrong type, raises
:class:`PlanError` naming where it is (``run record tables[1] field 'version' ...``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from treadle.errors import PlanError
from treadle.plan.windows import Windows

_TABLE_KEYS = {"name", "branch", "commit", "version", "num_moments", "num_episodes"}
_COMPONENT_KEYS = {"table", "windows", "weight", "weight_quantised", "eligible"}
SELECTION_KEYS = ("where", "episodes", "rename", "name", "pad_to")
"""Optional component fields, written (and hashed) only when set: records without them
keep their run ids."""


@dataclass(frozen=True)
class TableEntry:
    """One pinned table of a run."""

    name: str
    branch: str | None
    commit: str | None
    version: int
    num_moments: int
    num_episodes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # every field is a JSON scalar, in the record's key order

    @classmethod
    def from_dict(cls, t: Any, where: str) -> TableEntry:
        """Parse one ``tables[i]`` object of a record; errors name ``where`` and the field."""
        check_object(t, _TABLE_KEYS, _TABLE_KEYS, where)
        branch, commit = t["branch"], t["commit"]
        if branch is not None and not isinstance(branch, str):
            raise PlanError(f"{where} field 'branch' must be a string or null")
        if commit is not None and (not isinstance(commit, str) or not commit):
            raise PlanError(f"{where} field 'commit' must be a commit id or null")
        return cls(
            name=str_field(t, "name", where),
            branch=branch,
            commit=commit,
            version=int_field(t, "version", where),
            num_moments=int_field(t, "num_moments", where),
            num_episodes=int_field(t, "num_episodes", where),
        )


@dataclass(frozen=True)
class ComponentEntry:
    """One component of a run: a table (index into ``RunRecord.tables``), windows, weights."""

    table: int
    windows: Windows | None
    weight: float
    weight_quantised: int
    eligible: int
    where: str | None = None
    """Lance SQL predicate an anchor's own row satisfies (None: every row)."""
    episodes: tuple[str, ...] | None = None
    """Episode names anchors are drawn from (None: every episode)."""
    rename: tuple[tuple[str, str], ...] | None = None
    """(table column, batch name) pairs, sorted."""
    name: str | None = None
    """The component's name as given (None: its table's name, made unique)."""
    pad_to: tuple[tuple[str, int], ...] | None = None
    """(table column, size) pairs, sorted: the last dimension zero-padded to ``size``."""

    def selection(self) -> dict[str, Any]:
        """The optional fields that are set, as JSON values."""
        out: dict[str, Any] = {}
        if self.where is not None:
            out["where"] = self.where
        if self.episodes is not None:
            out["episodes"] = list(self.episodes)
        if self.rename is not None:
            out["rename"] = dict(self.rename)
        if self.name is not None:
            out["name"] = self.name
        if self.pad_to is not None:
            out["pad_to"] = dict(self.pad_to)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "windows": None if self.windows is None else self.windows.to_json(),
            "weight": self.weight,
            "weight_quantised": self.weight_quantised,
            "eligible": self.eligible,
            **self.selection(),
        }

    @classmethod
    def from_dict(cls, c: Any, where: str) -> ComponentEntry:
        """Parse one ``components[i]`` object of a record; errors name ``where`` and the field."""
        check_object(c, _COMPONENT_KEYS, _COMPONENT_KEYS | set(SELECTION_KEYS), where)
        w = c["windows"]
        if w is not None and not isinstance(w, dict):
            raise PlanError(f"{where} field 'windows' must be an object or null")
        try:
            windows = None if w is None else Windows.from_json(w)
        except PlanError as e:
            raise PlanError(f"{where} field 'windows': {e}") from None
        weight = c["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise PlanError(f"{where} field 'weight' must be a number")
        return cls(
            table=int_field(c, "table", where),
            windows=windows,
            weight=float(weight),
            weight_quantised=int_field(c, "weight_quantised", where),
            eligible=int_field(c, "eligible", where),
            **_selection(c, where),
        )


def _selection(c: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "where" in c:
        out["where"] = str_field(c, "where", where)
    if "episodes" in c:
        eps = c["episodes"]
        if not isinstance(eps, list) or not eps or not all(isinstance(e, str) for e in eps):
            raise PlanError(f"{where} field 'episodes' must be a non-empty list of names")
        out["episodes"] = tuple(eps)
    if "rename" in c:
        ren = c["rename"]
        if (
            not isinstance(ren, dict)
            or not ren
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in ren.items())
        ):
            raise PlanError(f"{where} field 'rename' must be an object of column names")
        out["rename"] = tuple(sorted(ren.items()))
    if "name" in c:
        out["name"] = str_field(c, "name", where)
    if "pad_to" in c:
        pad = c["pad_to"]
        if (
            not isinstance(pad, dict)
            or not pad
            or not all(isinstance(k, str) and type(v) is int and v > 0 for k, v in pad.items())
        ):
            raise PlanError(f"{where} field 'pad_to' must be an object of column -> size")
        out["pad_to"] = tuple(sorted(pad.items()))
    return out


def check_object(d: Any, required: set[str], allowed: set[str], where: str) -> None:
    """Refuse ``d`` unless it is an object with the keys :func:`check_keys` allows."""
    if not isinstance(d, dict):
        raise PlanError(f"{where} must be an object")
    check_keys(d, required, allowed, where)


def check_keys(d: dict[str, Any], required: set[str], allowed: set[str], where: str) -> None:
    """Refuse ``d`` unless it has every ``required`` key and only ``allowed`` ones."""
    missing = sorted(required - d.keys())
    if missing:
        raise PlanError(f"{where} is missing field {missing[0]!r}")
    extra = sorted(d.keys() - allowed)
    if extra:
        raise PlanError(f"{where} has unknown field {extra[0]!r}")


def str_field(d: dict[str, Any], key: str, where: str) -> str:
    """``d[key]``, a non-empty string."""
    v = d[key]
    if not isinstance(v, str) or not v:
        raise PlanError(f"{where} field {key!r} must be a non-empty string, got {v!r}")
    return v


def int_field(d: dict[str, Any], key: str, where: str) -> int:
    """``d[key]``, an integer (not a bool)."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(f"{where} field {key!r} must be an integer, got {v!r}")
    return v

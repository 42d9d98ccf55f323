"""A component of a recipe: a table, its windows, a weight, and the selection, names and
padding that shape its samples (:class:`Component`), with the checks of its arguments."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from treadle.errors import PlanError
from treadle.names import check_name
from treadle.plan.shares import printed_float
from treadle.plan.windows import Windows

if TYPE_CHECKING:
    from treadle.table.table import Table


class _Named(Protocol):
    name: str


class TableRef(Protocol):
    """A table by name on a branch (a :class:`treadle.TableRef`, of the catalog above this
    layer): a recipe pins it when planned."""

    name: str

    @property
    def branch(self) -> _Named: ...

    def pin(self) -> Table: ...


def _table_label(table: object) -> str:
    name = getattr(table, "name", None)
    return repr(name) if name is not None else repr(table)


def check_weight(weight: Any, what: str = "weight") -> float:
    """A positive, finite real number (not a bool, not a string) as a float (a numpy
    float32/float16 as the decimal it prints as: :func:`~treadle.plan.shares.printed_float`)."""
    if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, numbers.Real):
        raise PlanError(f"{what} must be a positive number, got {weight!r}")
    value = printed_float(weight)
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"{what} must be positive and finite, got {weight!r}")
    return value


class Component:
    """One source of samples: a table (a branch-relative ``TableRef`` or a pinned ``Table``),
    its windows (None: every column but ``episode``/``frame`` at the moment itself, each one
    a batch can hold, else a :class:`PlanError` naming it) and a positive weight.

    ``where`` (a Lance SQL predicate over the table's columns) and ``episodes`` (episode
    names) select the anchors: a moment is drawn only when its own row satisfies ``where``
    and its episode is named; window rows around it still come from the whole episode.
    ``rename`` maps the table's column names to the batch's (``{"cam_high": "image"}``).
    ``name`` names the component (default: its table's name, made unique; ``plan.components``
    lists them). ``pad_to={column: size}`` zero-pads the last dimension of a numeric Rows
    column (a table column name) to ``size``; the batch then holds
    ``"<column>_dim_mask"`` (bool ``[b, size]``, True on the real dimensions).
    """

    def __init__(
        self,
        table: TableRef | Table,
        windows: Windows | Mapping[str, Any] | None = None,
        weight: float = 1.0,
        where: str | None = None,
        episodes: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        name: str | None = None,
        pad_to: Mapping[str, int] | None = None,
    ):
        if table is None or not (
            callable(getattr(table, "pin", None)) or callable(getattr(table, "episodes", None))
        ):
            raise PlanError(
                f"Component table must be a table (branch.table(name) or table.at(...)), "
                f"got {table!r}"
            )
        if windows is not None and not isinstance(windows, Windows):
            if isinstance(windows, Mapping):
                windows = Windows(windows)
            else:
                raise PlanError(
                    f"Component windows for table {_table_label(table)} must be td.Windows, "
                    f"got {type(windows).__name__}"
                )
        self.table = table
        self.windows = windows
        self.weight = check_weight(weight, f"weight of table {_table_label(table)}")
        label = f"component of table {_table_label(table)}"
        if where is not None and (not isinstance(where, str) or not where.strip()):
            raise PlanError(f"{label}: where must be a Lance SQL predicate (text), got {where!r}")
        self.where = where
        self.episodes = _episode_names(episodes, label)
        self.rename = _rename(rename, label)
        self.name = None if name is None else check_name(name, "component")
        self.pad_to = _pad_to(pad_to, label)

    def __repr__(self) -> str:
        return f"Component({_table_label(self.table)}, {self.windows!r}, weight={self.weight})"


def lerobot_episode(index: int) -> str:
    """The episode name ``treadle import lerobot`` gives LeRobot's episode ``index``."""
    return f"episode_{index:06d}"


def _episode_names(episodes: Any, label: str) -> tuple[str, ...] | None:
    if episodes is None:
        return None
    if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
        raise PlanError(f"{label}: episodes must be a list of episode names, got {episodes!r}")
    bad = [e for e in episodes if isinstance(e, bool) or not isinstance(e, (str, int, np.integer))]
    if bad:
        raise PlanError(
            f"{label}: episodes must be names (strings) or LeRobot episode indices (int), "
            f"got {bad[0]!r}"
        )
    negative = [e for e in episodes if not isinstance(e, str) and int(e) < 0]
    if negative:
        raise PlanError(f"{label}: a LeRobot episode index is >= 0, got {negative[0]!r}")
    # An integer is a LeRobot episode index: the LeRobot importer names episode i so.
    episodes = [e if isinstance(e, str) else lerobot_episode(int(e)) for e in episodes]
    if not episodes:
        raise PlanError(f"{label}: episodes=[] selects nothing")
    return tuple(sorted(set(episodes)))


def _rename(rename: Any, label: str) -> tuple[tuple[str, str], ...] | None:
    if rename is None:
        return None
    if not isinstance(rename, Mapping) or not rename:
        raise PlanError(f"{label}: rename must be a dict of column -> batch name, got {rename!r}")
    onto: dict[str, str] = {}
    for col, new in rename.items():
        if not isinstance(col, str) or not isinstance(new, str):
            raise PlanError(f"{label}: rename {col!r} -> {new!r}: names must be strings")
        check_name(new, "column")
        if new in onto:
            raise PlanError(
                f"{label}: rename maps columns {onto[new]!r} and {col!r} onto one name {new!r}"
            )
        onto[new] = col
    return tuple(sorted(rename.items()))


def _pad_to(pad_to: Any, label: str) -> tuple[tuple[str, int], ...] | None:
    if pad_to is None:
        return None
    if not isinstance(pad_to, Mapping) or not pad_to:
        raise PlanError(f"{label}: pad_to must be a dict of column -> size, got {pad_to!r}")
    for col, size in pad_to.items():
        if not isinstance(col, str):
            raise PlanError(f"{label}: pad_to column {col!r} must be a column name")
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
            raise PlanError(f"{label}: pad_to[{col!r}] must be a positive integer, got {size!r}")
        if int(size) < 1:
            raise PlanError(f"{label}: pad_to[{col!r}] must be >= 1, got {size}")
    return tuple(sorted((c, int(v)) for c, v in pad_to.items()))

"""LeRobot batches from treadle, with no glue: ``tl.windows`` and ``tl.to_lerobot``.

For a table imported from LeRobot (``treadle import lerobot``: each feature ``a.b.c`` is the
column ``a_b_c``, episode ``i`` is named ``episode_{i:06d}``)::

    from treadle import lerobot as tl

    windows = tl.windows(table, {"observation.state": [-1 / 30, 0], "action": [0, 1 / 30]})
    plan = td.Recipe(seed=0, batch_size=8, components=[td.Component(table, windows)]).plan()
    for batch in td.TrainLoader(plan):
        batch = tl.to_lerobot(batch)   # what LeRobotDataset + DataLoader give for those moments

:func:`windows` gives every feature of the table as ``LeRobotDataset(delta_timestamps=...)``
does: features listed in ``delta_timestamps`` as windows in seconds with ``pad=True`` (the
nearest frame at episode ends, and ``<feature>_is_pad``), every other one at the moment
itself; cameras as ``float32 [.., C, H, W]`` equal to ``uint8 / 255`` exactly.
:func:`to_lerobot` renames the batch's columns back to LeRobot's feature names, drops the
time axis of the features LeRobot gives without one (those without ``_is_pad``), makes
every tensor contiguous and gives ``task`` as ``list[str]``. :func:`source_stats` is the
dataset's own ``meta/stats.json`` (kept by the importer) under LeRobot's names, as the
``dataset_stats`` a LeRobot policy's processors take; :func:`dataset_stats` gives
``plan.stats(...)`` (the run's own statistics) in that form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.windows import Rows, Video, Windows, default_columns
from treadle.table.image_sizes import recorded_images

if TYPE_CHECKING:
    from treadle.catalog.tableref import TableRef
    from treadle.table.table import Table

__all__ = ["dataset_stats", "feature_column", "source_stats", "to_lerobot", "windows"]

IS_PAD = "_is_pad"
_FLAGS = (IS_PAD, "_dim_mask", "_is_present")  # a column's flags in a batch (renamed with it)
#: The table columns :func:`windows` mapped, to their LeRobot feature names (this process).
_FEATURES: dict[str, str] = {}
# LeRobot's conventional dotted prefixes, for columns not named in delta_timestamps/features.
_PREFIXES = (("observation_images_", "observation.images."), ("observation_", "observation."),
             ("next_", "next."))  # fmt: skip


def feature_column(feature: str) -> str:
    """The column the LeRobot importer made of ``feature``: dots become ``_``."""
    return feature.replace(".", "_")


def _guess_feature(column: str) -> str:
    for col, feat in _PREFIXES:
        if column.startswith(col) and len(column) > len(col):
            return feat + column[len(col) :]
    return column


def _table(table: TableRef | Table) -> Table:
    """A pinned table (``TableRef.pin()``; a pinned ``Table`` as it is)."""
    pin = getattr(table, "pin", None)
    return pin() if callable(pin) and not hasattr(table, "video_columns") else table


def windows(
    table: TableRef | Table,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    *,
    features: Sequence[str] | None = None,
    tolerance_s: float = 1e-4,
) -> Windows:
    """``td.Windows`` for every LeRobot feature of ``table``, as ``LeRobotDataset`` gives them.

    ``delta_timestamps``: ``{feature: [seconds, ...]}`` with LeRobot's dotted names; each
    becomes a window with ``pad=True``. Every other column but ``episode``/``frame`` is read
    at the moment itself. ``features``: the dataset's feature names (``meta/info.json``),
    for columns whose dotted name is not LeRobot's usual ``observation.images.<cam>``,
    ``observation.<name>`` or ``next.<name>``. Video is ``float32`` ``TCHW`` (``x / 255``).
    A feature the table lacks is a :class:`PlanError` naming it and the columns there are.
    """
    t = _table(table)
    columns = default_columns(t)
    video = set(t.video_columns) | set(recorded_images(t.schema))  # image features: cameras
    names = {c: _guess_feature(c) for c in columns}
    for f in list(features or ()) + list(delta_timestamps or {}):
        if feature_column(f) in names:
            names[feature_column(f)] = f
    specs: dict[str, Rows | Video] = {}
    for feature, seconds in (delta_timestamps or {}).items():
        col = feature_column(feature)
        if col not in names:
            raise PlanError(
                f"delta_timestamps names {feature!r}, but table {t.name!r} has no column "
                f"{col!r} (the importer's name for it); its columns: {columns}"
            )
        secs = [float(s) for s in seconds]
        if col in video:
            specs[col] = Video(seconds=secs, pad=True, layout="TCHW", dtype="float32",
                               tolerance_s=tolerance_s)  # fmt: skip
        else:
            specs[col] = Rows(seconds=secs, pad=True, tolerance_s=tolerance_s)
    for col in columns:
        if col not in specs:
            specs[col] = Video([0], layout="TCHW", dtype="float32") if col in video else Rows([0])
    for col, feature in names.items():
        _FEATURES[col] = feature
    return Windows(specs)


def to_lerobot(batch: Mapping[str, Any], names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A treadle batch of :func:`windows` as LeRobot's DataLoader gives it.

    Keys: LeRobot's feature names (``names`` maps columns to them; by default what
    :func:`windows` mapped in this process), ``<feature>_is_pad`` for windowed features,
    ``<feature>_dim_mask`` / ``<feature>_is_present`` as the batch has them (``pad_to``,
    ``optional=True``).
    A column without ``<column>_is_pad`` loses its length-1 time axis (``[b, 1, ...]`` ->
    ``[b, ...]``, a string column's ``[[s], ...]`` -> ``[s, ...]``). Tensors are contiguous.
    treadle's own keys (``_moment``, ``_valid``, ...) pass through unchanged.
    """
    lookup = dict(_FEATURES)
    lookup.update(names or {})
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key.startswith("_"):
            out[key] = value
            continue
        flag = next((f for f in _FLAGS if key.endswith(f) and key[: -len(f)] in batch), None)
        if flag is not None:  # a column's padding, dimension mask or presence: as it is
            base = key[: -len(flag)]
            out[lookup.get(base, base) + flag] = _contiguous(value)
            continue
        if key + IS_PAD not in batch:
            value = _drop_time(key, value)
        out[lookup.get(key, key)] = _contiguous(value)
    return out


def _drop_time(key: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() < 2 or value.shape[1] != 1:
            raise PlanError(
                f"column {key!r} is {tuple(value.shape)} without {key + IS_PAD!r}: to_lerobot "
                "takes batches of tl.windows (a feature read at the moment has a time axis "
                "of 1; windowed features are padded)"
            )
        return value[:, 0]
    if isinstance(value, list) and all(isinstance(v, list) and len(v) == 1 for v in value):
        return [v[0] for v in value]
    return value


def _contiguous(value: Any) -> Any:
    return value.contiguous() if isinstance(value, torch.Tensor) else value


def source_stats(
    table: TableRef | Table, names: Mapping[str, str] | None = None
) -> dict[str, dict]:
    """The dataset's own ``meta/stats.json`` (``table.source_stats()``, kept by the importer)
    as LeRobot's ``dataset_stats``: ``{feature: {"mean": np.ndarray, ...}}``, feature names as
    :func:`to_lerobot` gives them. Empty when the dataset shipped none."""
    t = _table(table)
    lookup = {c: _FEATURES.get(c, _guess_feature(c)) for c in t.schema.names}
    lookup.update(names or {})
    out = {}
    for col, fields in t.source_stats().items():
        stats = {k: np.asarray(v) for k, v in fields.items() if k != "source"}
        out[lookup.get(col, col)] = stats
    return out


def dataset_stats(
    stats: Mapping[str, Any], names: Mapping[str, str] | None = None
) -> dict[str, dict]:
    """``plan.stats(...)`` or ``table.stats(...)`` (``{column: td.ColumnStats}``) as a LeRobot
    policy's ``dataset_stats``: each ``ColumnStats.to_lerobot()``, keyed by the feature name
    :func:`to_lerobot` gives the column in the batch (``names`` as there). A LeRobot
    normaliser looks stats up by those names and leaves a feature it finds none for
    unnormalised, without a word: column names (``observation_state``) never match."""
    lookup = dict(_FEATURES)
    lookup.update(names or {})
    out = {}
    for col, s in stats.items():
        if not callable(getattr(s, "to_lerobot", None)):
            raise PlanError(
                f"dataset_stats takes {{column: ColumnStats}}; {col!r} holds "
                f"{type(s).__name__} (for plan.stats(by_component=True), pass one component's)"
            )
        out[lookup.get(col, col)] = s.to_lerobot()
    return out

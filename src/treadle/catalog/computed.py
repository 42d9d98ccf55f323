"""A column computed from other columns (``add_column(name, fn=..., columns=[...])``).

``fn(batch) -> values``: ``batch`` is ``{column: numpy array}`` of up to ``batch_rows``
consecutive moments (video columns decoded, ``[n, H, W, 3]`` uint8, as the loaders give
them; with a video column a batch never spans two episodes); it returns one value per
moment (an array ``[n, ...]`` or a list). Batches run here, in table order, with a
progress bar (tqdm, on a terminal), or with ``executor=`` (``td.RayExecutor()``) as
tasks of about ``TASK_ROWS`` moments each, every task opening the pinned version from
the project's root; the values come back to this process, which writes the column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import NotFound, SchemaMismatch, TreadleError
from treadle.table.table import Table
from treadle.table.tensors import column_from_values, is_video

TASK_ROWS = 65536  # moments an executor task computes, about


@dataclass(frozen=True)
class _Task:
    """One executor task: batches ``ranges`` of a pinned table (picklable)."""

    address: Any  # a catalog.client.ProjectAddress: opens the project in the task's process
    table: str
    version: int
    columns: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]
    fn: Callable[[dict[str, Any]], Any]
    where: str  # "table 't' of project 'p', column 'c'", for fn's errors


def _batches(table: Table, columns: Sequence[str], batch_rows: int) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges of at most ``batch_rows``; within one episode when a
    video column is read (one stream, one frame size, per batch)."""
    if any(is_video(table.schema.field(c)) for c in columns):
        idx = table.episodes()
        bounds = list(zip(idx.starts.tolist(), (idx.starts + idx.lengths).tolist(), strict=True))
    else:
        bounds = [(0, table.num_moments)]
    return [(s, min(s + batch_rows, e)) for b, e in bounds for s in range(b, e, batch_rows)]


def _compute(
    table: Table, columns: Sequence[str], fn: Callable, span: tuple[int, int], where: str
) -> np.ndarray | list:
    """``fn`` of the moments ``span`` of ``columns``, checked: one value per moment; an
    exception of ``fn`` becomes a :class:`TreadleError` naming ``where`` and the rows."""
    from treadle.read.columns import moment_columns
    from treadle.read.sample_reader import SampleReader

    rows = np.arange(*span, dtype=np.int64)
    reader = SampleReader([table], [moment_columns(table, list(columns))], ids=False)
    try:
        batch = reader.read(np.zeros(len(rows), np.int64), rows)
    finally:
        reader.close()
    try:
        got = fn({c: batch[c] for c in columns})
    except Exception as e:
        raise TreadleError(
            f"{where}: fn raised {type(e).__name__}: {e} on the batch of rows "
            f"{span[0]}..{span[1] - 1} (columns {list(columns)}); nothing was written"
        ) from e
    try:
        n = len(got)
    except TypeError:
        n = -1
    if n != len(rows):
        raise SchemaMismatch(
            f"table {table.name!r}: fn returned {n if n >= 0 else type(got).__name__} values "
            f"for a batch of {len(rows)} moments (rows {span[0]}..{span[1] - 1}); give one "
            "per moment; nothing was written"
        )
    return got if isinstance(got, np.ndarray) else list(got)


def _run_task(task: _Task) -> list[np.ndarray | list]:
    """What one executor task returns: its batches' values, in order (runs elsewhere)."""
    table = task.address.open().table_at(task.table, task.version)
    return [_compute(table, task.columns, task.fn, span, task.where) for span in task.ranges]


def _bar(total: int, desc: str, progress: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="rows", disable=None if progress is None else not progress
    )


def computed_column(
    table: Table,
    name: str,
    fn: Callable[[dict[str, Any]], Any],
    columns: Sequence[str] | None,
    executor: Any,
    batch_rows: int,
    progress: bool | None,
    address: Any,
    where: str,
) -> tuple[pa.Field, pa.Array]:
    """The column ``fn`` computes over ``columns`` of ``table`` (see the module docstring)."""
    if not callable(fn):
        raise SchemaMismatch(f"{where}: fn must be callable")
    if not columns:
        raise SchemaMismatch(f"{where}: name the columns fn reads (columns=[...])")
    for c in columns:
        if c not in table.schema.names:
            raise NotFound(f"{where}: fn reads column {c!r}, which the table does not have")
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise SchemaMismatch(f"{where}: batch_rows must be an integer >= 1")
    spans = _batches(table, columns, batch_rows)
    parts: list[np.ndarray | list] = []
    with _bar(table.num_moments, f"add_column {name}", progress) as bar:
        if executor is None:
            for span in spans:
                parts.append(_compute(table, columns, fn, span, where))
                bar.update(span[1] - span[0])
        else:
            per = max(1, TASK_ROWS // batch_rows)
            tasks = [
                _Task(
                    address,
                    table.name,
                    table.version,
                    tuple(columns),
                    tuple(spans[i : i + per]),
                    fn,
                    where,
                )  # fmt: skip
                for i in range(0, len(spans), per)
            ]
            for got in executor.map(_run_task, tasks, lambda t: f"rows {t.ranges[0][0]}.."):
                parts.extend(got)
            bar.update(table.num_moments)
    return _column(name, parts, table.num_moments, where)


def _column(
    name: str, parts: list[np.ndarray | list], rows: int, where: str
) -> tuple[pa.Field, pa.Array]:
    """The batches' values as one column (numpy batches concatenated, lists joined)."""
    if parts and all(isinstance(p, np.ndarray) for p in parts):
        try:
            values: Any = np.concatenate(parts)
        except ValueError as e:
            raise SchemaMismatch(f"{where}: fn's batches differ in shape ({e})") from None
    else:
        values = [v for p in parts for v in p]
    return column_from_values(name, values, rows)

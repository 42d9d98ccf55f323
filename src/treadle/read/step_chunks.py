"""What the steps of worker processes need of the chunk cache, known in the loader's process.

With ``workers=N`` and ``lookahead`` the loader's process fetches the chunks every step
needs (:mod:`treadle.read.lookahead`) but reads no row: its workers do. :class:`StepTakes`
gives a :class:`~treadle.read.lookahead.Lookahead` what it asks of a reader, the takes of a
step and which of their columns are chunked, decided as a worker's reader decides (the same
object cache, chunk store and resident budget), through a :class:`PlanningReader` that
reads nothing: a column a reader would keep resident only counts against the budget, a
table that fits the object cache is neither copied nor mapped (the workers map it), and
only a chunked column's page layout is read (the data files' footers). Its ``media`` (a
:class:`~treadle.video.fetch.WindowFetcher` on the same chunk store, reading nothing) and
``streams`` let :func:`~treadle.read.chunk_media.media_chunks` map the steps' video windows
to their stream chunks, as for a ``workers=0`` reader: the workers' readers read those
windows from the chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.read.columns import output_columns
from treadle.read.fixed import RESIDENT_BYTES, FixedReader, _Column
from treadle.read.stream_index import StreamIndexes
from treadle.read.takes import Take, component_takes, fixed_groups
from treadle.video.fetch import WindowFetcher

if TYPE_CHECKING:
    from treadle.plan.plan import Plan
    from treadle.storage.chunkstore import ChunkStore
    from treadle.table.table import Table

__all__ = ["PlanningReader", "StepTakes"]


class PlanningReader(FixedReader):
    """A :class:`FixedReader` that chooses each column's path as one would, reading nothing."""

    def read(self, table: Table, rows: Any, columns: list[str]) -> dict[str, np.ndarray]:
        raise RuntimeError("a PlanningReader decides how columns are read; it reads none")

    def _whole(self, table: Table, column: str, f: pa.Field, nbytes: int) -> np.ndarray:
        return np.broadcast_to(np.zeros(1, np.uint8), (nbytes,))  # counts nbytes, holds none

    def _map_fragments(self, *args: Any, **kwargs: Any) -> _Column:
        return _Column("mapped")  # fits the object cache: a reader maps it, nothing to fetch


class StepTakes:
    """The row takes of a plan's samples, as a worker's reader makes them (``takes``,
    ``fixed`` and ``read_ahead``: what :class:`~treadle.read.lookahead.Lookahead` asks),
    and what :func:`~treadle.read.chunk_media.media_chunks` asks of a reader (``tables``,
    ``columns``, ``streams``, ``media``: None on a local store, where nothing is fetched).
    ``decodes``: the steps decode video windows or images (a reader then hands a batch out
    once it started the next one's decode: it reads one more step ahead)."""

    def __init__(self, plan: Plan, chunks: ChunkStore, read_ahead: int,
                 resident_bytes: int | None = None) -> None:  # fmt: skip
        self.tables = [plan.table(c) for c in range(plan.num_components)]
        budget = RESIDENT_BYTES if resident_bytes is None else resident_bytes
        self.fixed = PlanningReader(budget, chunks=chunks)
        self.read_ahead = int(read_ahead)
        self.columns = output_columns(plan)
        # a reader of these steps hands a batch out only once the next one's decode started
        self.decodes = any(cs.video for specs in self.columns for cs in specs)
        self._groups = [fixed_groups(t, cs, self.fixed)
                        for t, cs in zip(self.tables, self.columns)]  # fmt: skip
        project = self.tables[0].project
        self.streams = StreamIndexes()
        self.media = None if project.store.is_local else WindowFetcher(
            project.store, project.prefix, chunks)  # fmt: skip

    def takes(self, component: np.ndarray, moment: np.ndarray) -> list[Take]:
        """The takes of these samples, per component in order (as SampleReader.takes)."""
        return component_takes(self.tables, self._groups, component, moment)

    def close(self) -> None:
        self.fixed.close()

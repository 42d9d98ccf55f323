"""``ScanDataset``: the on-ramp. A plain scan of one pinned table for a standard DataLoader.

``DataLoader(ScanDataset(scan, batch_size=64), batch_size=None, num_workers=N)``:
batches of ``batch_size`` consecutive rows (or of a seeded shuffle of the rows) are
split across ranks and DataLoader workers without overlap or loss — batch ``i`` of
an epoch goes to the reader ``i mod (world_size * num_workers)`` — so every row is
read exactly once per epoch. Call ``set_epoch(e)`` for a fresh shuffle per epoch.

Workers must be started with ``spawn`` or ``forkserver``
(``DataLoader(..., multiprocessing_context="spawn")``): Lance is not fork-safe, and a
forked worker (Linux's default context forks) fails at once with a ``RuntimeError``
saying so instead of hanging.

A number or tensor column that is null at a row the scan reads (a column added without
``default=``, then episodes appended; ``update({col: None})``) is a ``PlanError`` when the
dataset is made, naming the column, episode, frame and row, as a plan's is
(:func:`~treadle.plan.null_rows.check_scan_rows`); strings and bytes arrive as ``None``.

``state_dict``/``load_state_dict`` follow torchdata's ``StatefulDataLoader`` protocol:
each worker's dataset copy reports how many of its batches it has yielded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from treadle import reaper
from treadle.errors import PlanError
from treadle.fork_locks import check_not_forked
from treadle.plan.null_rows import check_scan_rows
from treadle.plan.permute import Domain, Domains, derive_key, permute
from treadle.plan.video_sizes import check_scan_sizes
from treadle.read.columns import moment_columns
from treadle.read.sample_reader import SampleArrays, SampleReader
from treadle.table.table import ScanRequest, Table
from treadle.torch.convert import to_torch
from treadle.torch.delivery import close_at_exit, rank_world

_SCAN_DOMAIN = 0x5CA11


class ScanDataset(torch.utils.data.IterableDataset):
    """Batches ``dict[str, Tensor]`` of ``scan``'s columns (video: one frame per row).

    A batch stacks one frame a row, so the scanned rows of a video column must decode to
    one size, else a :class:`PlanError` when the dataset is made names two; ``size=(H, W)``
    resizes every video column's frames to it (a ``{column: (H, W)}`` mapping: those
    columns), as ``td.Video(size=...)`` does."""

    def __init__(
        self,
        scan: ScanRequest,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        size: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
    ):
        if not isinstance(scan, ScanRequest):
            raise PlanError("ScanDataset takes table.scan_request(columns)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise PlanError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise PlanError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
        self.rank, self.world_size = rank_world(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise PlanError(f"rank must be in 0..{self.world_size - 1}, got {self.rank}")
        table = scan.table
        self._sizes = _video_sizes(table, list(scan.columns), size)
        moment_columns(table, list(scan.columns), self._sizes)  # fail now: non-tensor columns
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.epoch = 0
        self._yielded = 0
        self._skip = 0
        self._root = table.project.client.root
        self._options = table.project.client.storage_options
        self._where = (table.project.name, table.name, table.version, table.commit_id)
        self._columns = list(scan.columns)
        self._rows = table.matching_rows(scan.filter)
        # a null a batch cannot hold: refused now, naming it, not at the batch that reads it
        check_scan_rows(table, self._columns, self._rows, "ScanDataset")
        check_scan_sizes(table, self._columns, self._rows, list(self._sizes), "ScanDataset")
        self._table = None  # opened lazily in whichever process iterates
        # The process this copy was built or unpickled in. A forked worker inherits the
        # object without unpickling it, whatever the start method reads as (Linux's default
        # context reports None, not "fork"), so a pid other than this one means a fork.
        self._home_pid = os.getpid()
        self._sent = False

    def __getstate__(self) -> dict[str, Any]:
        # sent to other processes (DataLoader workers): what they read is not counted here
        self._sent = True
        state = dict(self.__dict__)
        state["_table"] = None
        state["_sent"] = False  # the copy counts what it reads itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._home_pid = os.getpid()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch (with ``shuffle``, its own order: a
        function of ``(seed, epoch)``)."""
        self.epoch = int(epoch)
        self._yielded = self._skip = 0

    def __len__(self) -> int:
        """Batches per epoch over all ranks and workers."""
        return -(-len(self._rows) // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "yielded"}``: the batches this copy delivered in the epoch (read in
        this process: ``num_workers=0``)."""
        if self._sent:
            raise PlanError(
                "this ScanDataset was sent to other processes (DataLoader worker processes): "
                "the batches they read are not counted here, so its state would resume at "
                "the wrong batch; resume a position with num_workers=0"
            )
        return {"epoch": self.epoch, "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._skip = self._yielded = int(state["yielded"])

    def _open(self) -> Any:
        if self._table is None:
            from treadle.catalog import Client

            project_name, name, version, commit_id = self._where
            client = Client(self._root, self._options or None)
            self._table = client.project(project_name, create=False).table_at(
                name, version, commit_id
            )
        return self._table

    def _order(self) -> np.ndarray:
        n = len(self._rows)
        if not self.shuffle or n < 2:
            return self._rows
        key = derive_key(_SCAN_DOMAIN, self.seed, self.epoch)
        idx = permute(np.arange(n, dtype=np.uint64), 0, Domains([Domain.of(n)]), np.uint64(key))
        return self._rows[idx.astype(np.int64)]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        it = self._batches()
        close_at_exit(it)  # one left unfinished is closed while the interpreter still runs
        return it

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        if os.getpid() != self._home_pid:
            raise RuntimeError(
                "ScanDataset workers must be started with 'spawn' or 'forkserver' (Lance is "
                "not fork-safe): DataLoader(..., multiprocessing_context='spawn')"
            )
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        if info is not None and self._skip:
            raise PlanError(
                f"this ScanDataset resumes after {self._skip} batches, but it is read by "
                f"{nw} DataLoader worker processes, each of which would skip as many of its "
                "own: resume a position with num_workers=0"
            )
        readers = self.world_size * nw
        me = self.rank * nw + wid
        table = self._open()
        order = self._order()
        mine = range(me, len(self), readers)[self._skip :]  # the batches this copy delivers
        reader = SampleReader(
            [table], [moment_columns(table, self._columns, self._sizes)], ids=False
        )
        samples = (self._samples(order, i) for i in mine)
        batches = reader.read_many(samples)
        # closed early (maybe by a finalizer, on any thread) the reaper closes the reader
        home = os.getpid()
        with reaper.closing(reader.close, inner=batches):
            for k, (_, out) in enumerate(batches, start=self._skip):
                self._yielded = k + 1
                yield to_torch(out)
                # resumed in a forked child: the reader's threads are not there (a hang)
                check_not_forked(home, "this ScanDataset's iterator")
        self._skip = 0

    def _samples(self, order: np.ndarray, i: int) -> SampleArrays:
        """Batch ``i`` of this epoch: its rows, all of the one component."""
        rows = order[i * self.batch_size : (i + 1) * self.batch_size]
        return SampleArrays(np.zeros(len(rows), np.int64), rows)


def _video_sizes(
    table: Table, columns: list[str], size: tuple[int, int] | Mapping[str, tuple[int, int]] | None
) -> dict[str, tuple[int, int]]:
    """``{video column: (H, W)}`` of ``size=``: one size for every video column scanned,
    or a mapping naming some of them."""
    video = [c for c in columns if c in table.video_columns]
    if size is None:
        return {}
    if not isinstance(size, Mapping):
        if not video:
            raise PlanError(f"ScanDataset: size={size!r} given, but no column scanned is video")
        return {c: size for c in video}  # type: ignore[misc]
    other = sorted(set(size) - set(video))
    if other:
        raise PlanError(
            f"ScanDataset: size= names {other}, which are not video columns scanned "
            f"(those are {video})"
        )
    return dict(size)

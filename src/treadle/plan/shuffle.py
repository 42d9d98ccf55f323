"""Which shuffle a run's draws walk: the full permutation (default) or ``td.BlockShuffle``.

``td.Recipe(..., shuffle=td.BlockShuffle(block_rows=None, window_blocks=None, partitions=1))``
keeps every component's draw order a pure function of (seed, component, epoch, draw index)
(:mod:`treadle.plan.order_block`), so resume stays O(1), batches are the same at any rank
count, every eligible moment appears once per component epoch and the per-batch shares are
exactly those of the full permutation (only which moment a draw takes changes).

**In the run record** the block shuffle is ``"shuffle": {"algorithm": "treadle.block/1",
"block_rows": [per component], "window_blocks": w, "partitions": P, "row_bytes": [...]}``,
hashed into the run id except ``row_bytes`` (the estimate the card's cache figure uses). A
record without ``shuffle`` is the full permutation: records written before block shuffles keep
their run ids and batches.

**Sizing.** ``block_rows=None`` sizes each component's blocks from the cache bound
(``$TREADLE_CACHE_BYTES``, else the object cache's default) so that the rows in use,
``sum over components of 2 * block_rows_c * row_bytes_c``, stay within half of it; a
component's row bytes are its table's Lance data files plus its video columns' packet bytes,
over its moments. A segment reads a contiguous part, ``1/w``, of each of its ``w`` open
blocks: one block's rows in all; the lookahead fetches the next segment's while it is read,
so two blocks' rows are in use at once, not ``w + 1`` blocks. The other half of the bound
holds the chunks those parts straddle (each part's ends share a chunk with rows of no part
read now) and the rest of the lookahead's window. Issue 48's case (2 tables of 12.3 kB rows,
a cache of 37 MB, 1 MiB chunks) measured 1.41x the bytes delivered fetched and 0.016 GETs a
sample with blocks sized for ``w + 1`` of them (149 rows), 1.10x and 0.012 with 384 rows. ``window_blocks=None`` is :data:`DEFAULT_WINDOW_BLOCKS`. A block is at most
a component's (largest) partition: a larger ``block_rows`` is recorded as that, the same draws
(one block, read in ``w`` parts in table order), so the record states what the plan reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.order_block import MAX_WINDOW_BLOCKS, BlockOrder
from treadle.plan.order_full import FullOrder
from treadle.storage.filecache import DEFAULT_BYTES, parse_bytes

if TYPE_CHECKING:
    from treadle.table.table import Table

ALGORITHM = "treadle.block/1"
DEFAULT_WINDOW_BLOCKS = 4
MAX_PARTITIONS = 1 << 20


def _count(value: Any, what: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise PlanError(f"BlockShuffle {what} must be an integer >= {low}, got {value!r}")
    if not low <= int(value) <= high:
        raise PlanError(f"BlockShuffle {what} must be in {low}..{high}, got {value}")
    return int(value)


def _field(value: Any, what: str, high: int) -> int:
    """A run record's ``shuffle.<what>``: an integer in ``1..high`` (never None)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise PlanError(f"run record field 'shuffle.{what}' must hold integers in 1..{high}")
    return value


@dataclass(frozen=True)
class BlockShuffle:
    """A block-local shuffle: draws read ``window_blocks`` blocks of ``block_rows``
    consecutive eligible moments at a time (:mod:`treadle.plan.order_block`).

    ``block_rows=None`` sizes blocks from the cache bound (module docstring);
    ``partitions=P`` splits each component into ``P`` disjoint ranges, and slot ``t`` of every
    global batch reads partition ``t mod P`` where the batch allows it
    (:mod:`treadle.plan.arrange`)."""

    block_rows: int | None = None
    window_blocks: int | None = None
    partitions: int = 1

    def __post_init__(self) -> None:
        _count(self.block_rows, "block_rows", 1, 2**62)
        _count(self.window_blocks, "window_blocks", 1, MAX_WINDOW_BLOCKS)
        _count(self.partitions, "partitions", 1, MAX_PARTITIONS)


@dataclass(frozen=True)
class BlockPlan:
    """A block shuffle resolved for a run (what the record holds)."""

    block_rows: tuple[int, ...]
    window_blocks: int
    partitions: int
    row_bytes: tuple[int, ...] | None = None
    """Estimated bytes per row of each component (the card's cache figure; not hashed)."""

    def identity(self) -> dict[str, Any]:
        return {
            "algorithm": ALGORITHM,
            "block_rows": list(self.block_rows),
            "window_blocks": self.window_blocks,
            "partitions": self.partitions,
        }

    def to_json(self) -> dict[str, Any]:
        out = self.identity()
        if self.row_bytes is not None:
            out["row_bytes"] = list(self.row_bytes)
        return out

    @classmethod
    def from_json(cls, value: Any, components: int) -> BlockPlan:
        keys = {"algorithm", "block_rows", "window_blocks", "partitions"}
        if not isinstance(value, dict) or not keys <= set(value) <= keys | {"row_bytes"}:
            raise PlanError(f"run record field 'shuffle' must have the keys {sorted(keys)}")
        if value["algorithm"] != ALGORITHM:
            raise PlanError(
                f"run record field 'shuffle.algorithm' is {value['algorithm']!r}; this "
                f"treadle plans {ALGORITHM!r}"
            )
        rows = value["block_rows"]
        if not isinstance(rows, list) or len(rows) != components:
            raise PlanError(f"run record field 'shuffle.block_rows' must list {components} sizes")
        row_bytes = value.get("row_bytes")
        if row_bytes is not None and (
            not isinstance(row_bytes, list) or len(row_bytes) != components
        ):
            raise PlanError(f"run record field 'shuffle.row_bytes' must list {components} sizes")
        return cls(
            tuple(_field(r, "block_rows", 2**62) for r in rows),
            _field(value["window_blocks"], "window_blocks", MAX_WINDOW_BLOCKS),
            _field(value["partitions"], "partitions", MAX_PARTITIONS),
            None if row_bytes is None else tuple(_field(b, "row_bytes", 2**62) for b in row_bytes),
        )

    def block_bytes(self) -> list[int] | None:
        """Estimated bytes of one block of each component (None without estimates)."""
        if self.row_bytes is None:
            return None
        return [r * b for r, b in zip(self.block_rows, self.row_bytes)]

    def blocks(self, eligible: Sequence[int]) -> list[int]:
        """Blocks in the largest partition of each component (``eligible[i]``: its moments)."""
        largest = [-(-int(n) // self.partitions) for n in eligible]
        return [-(-n // b) for n, b in zip(largest, self.block_rows)]

    def cache_needed(self, eligible: Sequence[int] | None = None) -> int | None:
        """Bytes of the rows in use at once for one partition of every component: two
        segments, ``sum 2 * block_bytes`` (a segment reads ``1/w`` of each of its ``w``
        open blocks; the next one is fetched ahead), or with the components' ``eligible``
        moments, no more than a partition has; a node reading ``k`` partitions needs ``k``
        times it. The chunks their parts straddle come on top (module docstring)."""
        sizes = self.block_bytes()
        if sizes is None:
            return None
        counts = [2] * len(sizes) if eligible is None else self.blocks(eligible)
        return sum(min(2, k) * s for k, s in zip(counts, sizes))


def cache_bound() -> int:
    """The cache bound the default block size is sized from (``$TREADLE_CACHE_BYTES``)."""
    raw = os.environ.get("TREADLE_CACHE_BYTES")
    try:  # read as the cache reads it (a blank value is an error there too)
        bound = DEFAULT_BYTES if raw is None else parse_bytes(raw)
    except ValueError as e:
        raise PlanError(f"BlockShuffle() sizes blocks from the cache bound: {e}") from None
    if bound <= 0:
        raise PlanError(
            "BlockShuffle() sizes blocks from the cache bound, but TREADLE_CACHE_BYTES is 0: "
            "give block_rows="
        )
    return bound


def row_bytes(table: Table) -> int:
    """Bytes per row of a table: its Lance data files plus its video packets, over its rows."""
    rows = max(int(table.num_moments), 1)
    known = getattr(table, "bytes_per_row", None)  # a stand-in table (treadle simulate)
    if known is not None:
        return int(known)
    try:
        total = sum(
            int(getattr(df, "file_size_bytes", 0) or 0)
            for frag in table.dataset.get_fragments()
            for df in frag.metadata.files
        )
        for col in table.video_columns:
            sizes = table.to_arrow([col]).column(col).combine_chunks().field("size")
            total += int(np.asarray(sizes.fill_null(0), np.int64).sum())
    except Exception as e:  # noqa: BLE001 - any failure: ask for an explicit size
        raise PlanError(
            f"BlockShuffle(): could not estimate the row size of table {table.name!r} ({e}); "
            f"give block_rows="
        ) from None
    return max(1, -(-total // rows))


def resolve(
    spec: BlockShuffle | None, tables: Sequence[Table], eligible: Sequence[int]
) -> BlockPlan | None:
    """A recipe's shuffle for its record: None (full permutation) or a :class:`BlockPlan`
    (``tables[i]``, ``eligible[i]``: component ``i``'s pinned table and anchor count)."""
    if spec is None:
        return None
    if not isinstance(spec, BlockShuffle):
        raise PlanError(f"shuffle must be a td.BlockShuffle or None, got {spec!r}")
    w = spec.window_blocks or DEFAULT_WINDOW_BLOCKS
    per_row = [row_bytes(t) for t in tables] if spec.block_rows is None else None
    if per_row is None:
        rows = [spec.block_rows] * len(tables)
        known = None
    else:
        share = cache_bound() // 2 // len(tables) // 2  # bytes of one block
        rows = [max(1, share // b) for b in per_row]
        known = tuple(per_row)
    cap = [max(1, -(-int(n) // spec.partitions)) for n in eligible]  # no block past a partition
    return BlockPlan(tuple(min(int(r), c) for r, c in zip(rows, cap)), w, spec.partitions, known)


def order_of(shuffle: BlockPlan | None, seed: int, eligible: Sequence[int]) -> Any:
    """The draw order of a run: :class:`FullOrder` or :class:`BlockOrder`."""
    if shuffle is None:
        return FullOrder(seed, eligible)
    return BlockOrder(seed, eligible, shuffle.block_rows, shuffle.window_blocks, shuffle.partitions)

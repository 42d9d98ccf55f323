"""``treadle simulate``: what a run asks of the object store, node by node, walked exactly.

The plan is pure, so which samples every rank reads at every step is known; this module turns
them into the fixed-size chunks each node needs and replays a node's cache over them
(:mod:`treadle.plan.simcache`). Nothing is read or timed: the link is a model.

**Bytes.** A table's moments are stored in objects of consecutive rows (its Lance fragments,
or a stand-in's ``rows_per_object``), ``bytes_per_row`` each (:func:`treadle.plan.shuffle.row_bytes`:
data files plus video packets over rows). A sample reads the rows of its window's span
(``windows.eligible_span()``) from its anchor's object; chunk ``k`` of an object is its bytes
``[k C, (k+1) C)``. Video is counted at its mean packet bytes per frame in the row's place (a
window's GOP lead-in is not counted).

**Nodes.** Rank ``r`` of ``W = nodes * ranks_per_node`` reads slots ``r, r+W, ...`` and sits
on node ``r div ranks_per_node``; a node's ranks share one cache of ``cache_bytes``. Nodes are
alike in distribution, so a sample of them (``sample_nodes``, spread evenly) is replayed.

**Requests.** Per step, a node fetches its missed chunks; consecutive chunks of one object are
one ranged GET. Each table adds its manifest once (step 0) and each object its footer once
(the step that first reads it).

**Time.** A step's fetches take ``max(bytes / bandwidth, GETs * latency / in_flight)``; the
samples/s the link allows a node is its samples over the sum of those times. Time to the first
batch is two round trips for manifests and footers plus step 0's fetches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.shuffle import row_bytes

if TYPE_CHECKING:
    from treadle.table.table import Table
from treadle.plan.simcache import Replay, belady, lru, requests

CHUNK_BITS = 28
"""A chunk id is ``object << CHUNK_BITS | chunk index``."""
PREFIX_GETS = 5500
"""GET/s an S3 prefix serves before it answers 503 SlowDown (AWS's documented figure)."""


@dataclass(frozen=True)
class Link:
    """A node's link to the object store."""

    bandwidth: float  # bytes/s
    latency: float  # seconds per request
    in_flight: int = 64


@dataclass(frozen=True)
class Setup:
    nodes: int
    ranks_per_node: int
    cache_bytes: int
    chunk_bytes: int = 4 << 20
    lookahead: int = 2
    sample_nodes: int = 4


@dataclass
class TableBytes:
    """Objects of consecutive rows of one table: first row, rows and bytes per row."""

    name: str
    starts: np.ndarray
    row_bytes: int
    first_object: int

    @classmethod
    def of(cls, table: Table, first_object: int) -> TableBytes:
        per = getattr(table, "rows_per_object", None)
        n = int(table.num_moments)
        if per is not None:
            starts = np.arange(0, max(n, 1), int(per), dtype=np.int64)
        else:
            rows = [int(f.count_rows()) for f in table.dataset.get_fragments()]
            starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        return cls(table.name, starts, row_bytes(table), first_object)

    def chunks(self, rows_lo: np.ndarray, rows_hi: np.ndarray, chunk: int) -> np.ndarray:
        """Chunk ids of the byte ranges of rows ``[lo, hi]`` (each within one object)."""
        obj = np.searchsorted(self.starts, rows_lo, side="right") - 1
        base = self.starts[obj]
        first = (rows_lo - base) * self.row_bytes // chunk
        last = ((rows_hi - base + 1) * self.row_bytes - 1) // chunk
        count = last - first + 1
        ids = (obj + self.first_object).astype(np.int64) << CHUNK_BITS
        start = np.repeat(ids + first, count)
        return start + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))


@dataclass
class NodeReport:
    """One sampled node over the walked steps."""

    node: int
    samples: int
    steps: int
    delivered: int
    fetched: list[int] = field(default_factory=list)
    gets: list[int] = field(default_factory=list)
    table_gets: dict[str, int] = field(default_factory=dict)
    optimum: float = 0.0
    lru: float = 0.0
    over: int = 0
    first_batch_s: float = 0.0
    link_s: float = 0.0
    peak_in_flight: int = 0


def _node_slots(batch: int, setup: Setup, node: int) -> np.ndarray:
    world = setup.nodes * setup.ranks_per_node
    t = np.arange(batch)
    return t[(t % world) // setup.ranks_per_node == node]


def sampled_nodes(setup: Setup) -> list[int]:
    k = min(setup.sample_nodes, setup.nodes)
    return sorted({i * setup.nodes // k for i in range(k)})


def node_steps(plan: Any, layout: Sequence[TableBytes], setup: Setup, steps: Sequence[int],
               nodes: Sequence[int]) -> dict[int, tuple[list[np.ndarray], int]]:  # fmt: skip
    """Per node, the sorted distinct chunks of each step, and the bytes its samples read."""
    spans = []
    for c in range(plan.num_components):
        w = plan.windows(c)
        spans.append((0, 0) if w is None else w.eligible_span())
    table_of = [plan.record.components[c].table for c in range(plan.num_components)]
    slots = {n: _node_slots(plan.batch_size, setup, n) for n in nodes}
    out: dict[int, tuple[list[np.ndarray], int]] = {n: ([], 0) for n in nodes}
    for step in steps:
        whole = plan.batch(step)
        for n in nodes:
            comp, moment = whole.component[slots[n]], whole.moment[slots[n]]
            parts, read = [], 0
            for c in np.unique(comp).tolist():
                m = moment[comp == c]
                lo, hi = spans[c]
                tb = layout[table_of[c]]
                parts.append(tb.chunks(m + lo, m + hi, setup.chunk_bytes))
                read += m.size * (hi - lo + 1) * tb.row_bytes
            chunks, total = out[n]
            chunks.append(np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64))
            out[n] = (chunks, total + read)
    return out


def replay_node(node: int, chunks: list[np.ndarray], delivered: int, samples: int,
                layout: Sequence[TableBytes], setup: Setup, link: Link) -> NodeReport:  # fmt: skip
    """Replay one node's cache (Belady's optimum, and LRU for comparison) and time its link."""
    capacity = max(1, setup.cache_bytes // setup.chunk_bytes)
    best: Replay = belady(chunks, capacity)
    rep = NodeReport(node, samples, len(chunks), delivered)
    rep.optimum, rep.lru, rep.over = best.hit_rate, lru(chunks, capacity).hit_rate, best.over
    bounds = [tb.first_object for tb in layout]
    objects: set[int] = set()
    for miss in best.misses:
        rep.fetched.append(int(miss.size) * setup.chunk_bytes)
        touched = set(np.unique(miss >> CHUNK_BITS).tolist())
        rep.gets.append(requests(miss, CHUNK_BITS) + len(touched - objects))  # + new footers
        objects |= touched
        m = np.sort(miss)
        run = np.concatenate([[m.size > 0], (np.diff(m) != 1) | (np.diff(m >> CHUNK_BITS) != 0)])
        which = np.searchsorted(bounds, m[run[: m.size]] >> CHUNK_BITS, side="right") - 1
        for t, k in zip(*np.unique(which, return_counts=True)):  # each GET to its table
            name = layout[int(t)].name
            rep.table_gets[name] = rep.table_gets.get(name, 0) + int(k)
    rep.gets[0] += len(layout)  # the manifests
    times = [max(b / link.bandwidth, g * link.latency / link.in_flight)
             for b, g in zip(rep.fetched, rep.gets)]  # fmt: skip
    rep.link_s = float(sum(times))
    rep.first_batch_s = 2 * link.latency + times[0] + link.latency
    window = setup.lookahead + 1
    sums = np.convolve(np.asarray(rep.fetched, np.int64), np.ones(window, np.int64), "valid")
    rep.peak_in_flight = int(sums.max()) if sums.size else int(max(rep.fetched))
    return rep


def simulate(plan: Any, tables: Sequence[Table], setup: Setup, link: Link,
             steps: Sequence[int]) -> list[NodeReport]:  # fmt: skip
    """Walk ``steps`` of ``plan`` (one contiguous window) for the sampled nodes."""
    world = setup.nodes * setup.ranks_per_node
    if plan.batch_size % world:
        raise PlanError(
            f"batch size {plan.batch_size} is not divisible by {setup.nodes} nodes x "
            f"{setup.ranks_per_node} ranks = {world} ranks"
        )
    layout, first = [], 0
    for t in tables:
        layout.append(TableBytes.of(t, first))
        first += len(layout[-1].starts)
    nodes = sampled_nodes(setup)
    per = node_steps(plan, layout, setup, steps, nodes)
    samples = plan.batch_size // setup.nodes * len(steps)
    return [replay_node(n, per[n][0], per[n][1], samples, layout, setup, link) for n in nodes]

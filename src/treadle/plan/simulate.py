"""``treadle simulate``: what a run asks of the object store, node by node, walked exactly.

The plan is pure, so which samples every rank reads at every step is known; this module turns
them into the fixed-size chunks each rank needs (:mod:`treadle.plan.simlayout`: where rows
lie) and replays a node's cache over them (:mod:`treadle.plan.simcache`). Nothing is read or
timed: the link is a model.

**Nodes.** Rank ``r`` of ``W = nodes * ranks_per_node`` reads slots ``r, r+W, ...`` and sits
on node ``r div ranks_per_node``; a node's ranks share one cache of ``cache_bytes``. Nodes are
alike in distribution, so a sample of them (``sample_nodes``, spread evenly) is replayed.

**Requests**, as the loader's lookahead (:mod:`treadle.read.lookahead`) sends them. It fetches
in **rounds**: first the steps of its window ``[s, s + w]`` (``w``: :attr:`Setup.window`, the
lookahead or the reader's ``read_ahead`` + 1, whichever is more), :data:`FETCH_GROUP` steps a round, then each step as the window moves on. In a round, each rank of the node (in rank
order) fetches the missed chunks it needs that no rank before it fetched: runs of consecutive
chunks of an object are ranges, and obstore merges ranges of one object closer than 1 MiB
into one GET (:func:`treadle.storage.coalesce.coalesced`; the gap's bytes are fetched too).
Each rank also opens what it reads: a ``HEAD`` and a ``GET`` of every table's manifest in its
first round, and a ``HEAD`` and a ``GET`` of the last 64 KiB (the footer) of a data file in
the first round it needs a chunk of that file (:mod:`treadle.read.chunk_rows` reads footers
when first needed, several at once). A rank's counts are these; a node's their sum.

**Time.** A round's fetches take ``max(bytes / bandwidth, GETs * latency / in_flight)``; the
samples/s the link allows a node is its samples over the sum of those times. Time to the first
batch is four round trips (manifests, footers) plus the first round's fetches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import PlanError
from treadle.plan.nextuse import node_slots
from treadle.plan.simcache import Replay, belady, lookahead, lru, rank_next_uses
from treadle.plan.simlayout import CHUNK_BITS, FOOTER_BYTES, TableBytes, window_rows
from treadle.storage.coalesce import OBSTORE_COALESCE, coalesced

if TYPE_CHECKING:
    from treadle.table.table import Table

__all__ = ["CHUNK_BITS", "FETCH_GROUP", "Link", "NodeReport", "Setup", "TableBytes", "simulate"]

FETCH_GROUP = 8
"""Steps of a lookahead window fetched in one round (``read.lookahead.GROUP_STEPS``)."""
FETCH_HORIZON = 64
"""Steps ahead whose uses give a chunk its next use (``read.lookahead.HORIZON_STEPS``)."""
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
    chunk_bytes: int = 1 << 20  # the chunk store's CHUNK_BYTES
    lookahead: int = 2
    sample_nodes: int = 4
    coalesce: int = OBSTORE_COALESCE  # ranges of one object this close are one request
    read_ahead: int = 0  # the reader's batches read ahead (8 on an object store)
    node_uses: bool = True  # a chunk's next use by any rank of the node (LOCAL_WORLD_SIZE)

    @property
    def window(self) -> int:
        """Steps the loader's lookahead fetches ahead: ``lookahead``, at least the reader's
        ``read_ahead`` + 1 (the steps the reader has in hand)."""
        return max(self.lookahead, self.read_ahead + 1)


@dataclass
class NodeReport:
    """One sampled node over the walked steps; ``fetched`` and ``gets`` per fetch round."""

    node: int
    samples: int
    steps: int
    delivered: int
    fetched: list[int] = field(default_factory=list)
    gets: list[int] = field(default_factory=list)
    table_gets: dict[str, int] = field(default_factory=dict)
    rank_fetched: list[int] = field(default_factory=list)  # bytes per rank of the node
    rank_gets: list[int] = field(default_factory=list)  # requests per rank of the node
    open_gets: int = 0  # of the requests: manifests and footers
    open_bytes: int = 0  # of the bytes: manifests and footers
    optimum: float = 0.0
    loader: float = 0.0  # what the loader's lookahead stage does (simcache.lookahead)
    loader_stopped: int | None = None  # the step where that stage gave up (None: never)
    accesses: int = 0  # chunk accesses of the node's steps (each step's chunks once)
    own_ranks: float = 0.0  # Belady with each rank's own next uses (not its node's)
    lru: float = 0.0
    over: int = 0
    first_batch_s: float = 0.0
    link_s: float = 0.0
    peak_in_flight: int = 0


def rank_slots(batch: int, setup: Setup, node: int) -> list[np.ndarray]:
    """The batch slots each rank of ``node`` reads (rank ``r`` of ``W``: ``r, r+W, ...``)."""
    first = node * setup.ranks_per_node
    world = setup.nodes * setup.ranks_per_node
    return node_slots(batch, world, range(first, first + setup.ranks_per_node))


def sampled_nodes(setup: Setup) -> list[int]:
    k = min(setup.sample_nodes, setup.nodes)
    return sorted({i * setup.nodes // k for i in range(k)})


def fetch_rounds(steps: Sequence[int], lookahead: int) -> list[list[int]]:
    """The steps each fetch round of a loader's lookahead covers: its first window in rounds
    of :data:`FETCH_GROUP` steps, then one step a round."""
    steps = list(steps)
    first, rest = steps[: lookahead + 1], steps[lookahead + 1 :]
    return [first[i : i + FETCH_GROUP] for i in range(0, len(first), FETCH_GROUP)] + [
        [s] for s in rest
    ]


Walk = tuple[list[list[np.ndarray]], int]
"""Per step, the sorted distinct chunks each rank of a node needs; the bytes it delivers."""

MediaWindows = Callable[[np.ndarray, np.ndarray, int], Sequence[tuple[str, int, np.ndarray, int]]]
"""The video windows of samples ``(component, moment)``, for chunks of ``chunk_bytes``: per
window ``(stream key, stream bytes, chunk ids of its byte range, range bytes)``
(:func:`treadle.read.simpages.media_windows`: the loader's own computation)."""


class MediaObjects:
    """Video streams as objects of the walk: ids after the tables' objects, as first seen;
    a stream has no footer (its index is in the table)."""

    def __init__(self, windows: MediaWindows | None, first: int) -> None:
        self.windows, self.first = windows, first
        self.ids: dict[str, int] = {}
        self.sizes: list[int] = []

    def chunks(self, component: np.ndarray, moment: np.ndarray, chunk: int
               ) -> tuple[list[np.ndarray], int]:  # fmt: skip
        """The chunk ids of the samples' windows, and the bytes of their ranges."""
        if self.windows is None:
            return [], 0
        parts, nbytes = [], 0
        for key, size, ids, n in self.windows(component, moment, chunk):
            if key not in self.ids:
                self.ids[key] = self.first + len(self.sizes)
                self.sizes.append(int(size))
            parts.append((np.int64(self.ids[key]) << CHUNK_BITS) + np.asarray(ids, np.int64))
            nbytes += int(n)
        return parts, nbytes


def node_steps(plan: Any, layout: Sequence[TableBytes], setup: Setup, steps: Sequence[int],
               nodes: Sequence[int], media: MediaObjects | None = None
               ) -> dict[int, Walk]:  # fmt: skip
    """Per node, the chunks of each step per rank (rows', and video windows' of ``media``),
    and the bytes its samples read."""
    media = MediaObjects(None, 0) if media is None else media
    table_of = [plan.record.components[c].table for c in range(plan.num_components)]
    slots = {n: rank_slots(plan.batch_size, setup, n) for n in nodes}
    out: dict[int, Walk] = {n: ([], 0) for n in nodes}
    for step in steps:
        whole = plan.batch(step)
        for n in nodes:
            per_rank, read = [], 0
            for mine in slots[n]:
                comp, moment = whole.component[mine], whole.moment[mine]
                parts = []
                for c in np.unique(comp).tolist():
                    got, nbytes = _row_chunks(plan, c, layout[table_of[c]], moment[comp == c],
                                              setup.chunk_bytes)  # fmt: skip
                    parts += got
                    read += nbytes
                windows, nbytes = media.chunks(comp, moment, setup.chunk_bytes)
                parts += windows
                read += nbytes
                per_rank.append(
                    np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)
                )
            chunks, total = out[n]
            chunks.append(per_rank)
            out[n] = (chunks, total + read)
    return out


def _row_chunks(plan: Any, c: int, tb: TableBytes, moments: np.ndarray, chunk: int
                ) -> tuple[list[np.ndarray], int]:  # fmt: skip
    """The chunks component ``c``'s samples at ``moments`` read of each chunked column of
    its table, each column at its own window's rows (:func:`window_rows`), and their bytes."""
    table, windows = plan.tables[plan.record.components[c].table], plan.windows(c)
    parts, nbytes = [], 0
    for col in tb.columns:
        rows = window_rows(table, windows, col.column, moments)
        parts.append(tb.chunks(rows, chunk, [col]))
        nbytes += rows.size * col.row_bytes
    return parts, nbytes


def _fetches(mine: np.ndarray, sizes: np.ndarray, chunk: int, gap: int
             ) -> dict[int, list[tuple[int, int]]]:  # fmt: skip
    """Per object, the requests that fetch the sorted chunk ids ``mine`` in one round: runs
    of consecutive chunks are one range each (as the chunk store asks), merged by obstore."""
    out: dict[int, list[tuple[int, int]]] = {}
    for c in mine.tolist():
        obj, k = c >> CHUNK_BITS, c & ((1 << CHUNK_BITS) - 1)
        end = min(int(sizes[obj]), (k + 1) * chunk)
        runs = out.setdefault(obj, [])
        if runs and runs[-1][1] == k * chunk:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((k * chunk, end))
    return {o: coalesced(r, gap) for o, r in out.items()}


def _opening(rep: NodeReport, tb: TableBytes, rank: int, objects: np.ndarray | None
             ) -> tuple[int, int]:  # fmt: skip
    """A rank opens a table (``objects`` None: its manifest) or data files of it
    (``objects``: their ids in the table: their footers), a HEAD and a GET each. Returns
    (bytes, requests)."""
    if objects is None:
        got = (tb.manifest_bytes, 2)
    else:
        footers = np.minimum(tb.object_bytes[objects], FOOTER_BYTES)
        got = (int(footers.sum()), 2 * len(objects))
    rep.rank_fetched[rank] += got[0]
    rep.rank_gets[rank] += got[1]
    rep.open_bytes += got[0]
    rep.open_gets += got[1]
    rep.table_gets[tb.name] = rep.table_gets.get(tb.name, 0) + got[1]
    return got


def _round(rep: NodeReport, per_rank: list[np.ndarray], missed: np.ndarray,
           layout: Sequence[TableBytes], sizes: np.ndarray, setup: Setup,
           opened: list[np.ndarray], node: np.ndarray) -> tuple[int, int]:  # fmt: skip
    """One fetch round: each rank in turn reads the footers of the data files it needs a
    chunk of for the first time, or the node's ranks' next uses do (``node``: objects;
    ``opened[r]``: those it read) and fetches the missed chunks it needs that no rank
    before it fetched; (bytes, requests)."""
    bounds = [tb.first_object for tb in layout]
    streams = layout[-1].first_object + layout[-1].num_objects if layout else 0
    total = [0, 0]
    for r, need in enumerate(per_rank):
        new = np.setdiff1d(np.union1d(need >> CHUNK_BITS, node), opened[r])
        new = new[new < streams]  # a stream (media) has no footer
        opened[r] = np.union1d(opened[r], new)
        table = np.searchsorted(bounds, new, side="right") - 1
        for t in np.unique(table).tolist():
            objects = new[table == t] - layout[t].first_object
            for i, v in enumerate(_opening(rep, layout[t], r, objects)):
                total[i] += v
        mine, missed = np.intersect1d(need, missed), np.setdiff1d(missed, need)
        for obj, reqs in _fetches(mine, sizes, setup.chunk_bytes, setup.coalesce).items():
            t = int(np.searchsorted(bounds, obj, side="right") - 1)
            name = "media" if obj >= streams else layout[t].name
            rep.table_gets[name] = rep.table_gets.get(name, 0) + len(reqs)
            sent = sum(b - a for a, b in reqs)
            rep.rank_fetched[r] += sent
            rep.rank_gets[r] += len(reqs)
            total[0] += sent
            total[1] += len(reqs)
    return total[0], total[1]


def replay_node(node: int, walk: Walk, samples: int, layout: Sequence[TableBytes],
                setup: Setup, link: Link, media_sizes: Sequence[int] = ()
                ) -> NodeReport:  # fmt: skip
    """Replay one node's cache (Belady's optimum, and LRU for comparison) over its steps,
    count each rank's requests round by round, and time the node's link."""
    steps, delivered = walk
    union = [np.unique(np.concatenate(ranks)) for ranks in steps]
    capacity = max(1, setup.cache_bytes // setup.chunk_bytes)
    best: Replay = belady(union, capacity)
    rep = NodeReport(node, samples, len(steps), delivered)
    rep.optimum, rep.lru, rep.over = best.hit_rate, lru(union, capacity).hit_rate, best.over
    rep.accesses = best.accesses
    rep.own_ranks = rep.optimum
    sizes = np.concatenate([*(tb.object_bytes for tb in layout), media_sizes]).astype(np.int64)
    stage = lookahead(union, setup.cache_bytes, _chunk_size(sizes, setup.chunk_bytes),
                      setup.window, FETCH_GROUP, _tie(layout), horizon=FETCH_HORIZON,
                      read_ahead=setup.read_ahead)  # fmt: skip
    rep.loader, rep.loader_stopped = stage.hit_rate, stage.stopped
    if setup.ranks_per_node > 1:  # what Belady reaches with each rank's next uses only
        rep.own_ranks = belady(union, capacity, rank_next_uses(steps)).hit_rate
    rep.rank_fetched = [0] * setup.ranks_per_node
    rep.rank_gets = [0] * setup.ranks_per_node
    opened = [np.empty(0, np.int64) for _ in range(setup.ranks_per_node)]
    node = _node_objects(steps, setup)
    for i, group in enumerate(fetch_rounds(range(len(steps)), setup.window)):
        per_rank = [np.unique(np.concatenate([steps[s][r] for s in group]))
                    for r in range(setup.ranks_per_node)]  # fmt: skip
        missed = np.unique(np.concatenate([best.misses[s] for s in group]))
        got = [0, 0]
        if i == 0:
            for r in range(setup.ranks_per_node):
                for tb in layout:
                    got = [a + b for a, b in zip(got, _opening(rep, tb, r, None))]
        got = [a + b for a, b in zip(got, _round(rep, per_rank, missed, layout, sizes, setup,
                                                  opened, node(group[-1])))]  # fmt: skip
        rep.fetched.append(got[0])
        rep.gets.append(got[1])
    _time(rep, setup, link)
    return rep


def _node_objects(steps: list[list[np.ndarray]], setup: Setup) -> Callable[[int], np.ndarray]:
    """The objects whose footers a rank has read for its node's next uses by the round that
    fetches up to step ``last``: with several ranks a node, a step read (``window`` steps
    before) gives its chunks their next use by any rank within the horizon
    (:class:`~treadle.plan.nextuse.NodeNextUse`), which maps the node's samples of those
    steps (to the walk's end: the run's) to chunks, their data files' footers read."""
    horizon = max(setup.window, FETCH_HORIZON)
    seen, upto = [np.empty(0, np.int64)], [0]

    def objects(last: int) -> np.ndarray:
        if setup.ranks_per_node == 1 or not setup.node_uses or last < setup.window:
            return seen[0][:0]
        stop = min(last - setup.window + horizon, len(steps) - 1) + 1
        if stop > upto[0]:
            parts = [r >> CHUNK_BITS for ranks in steps[upto[0] : stop] for r in ranks]
            seen[0], upto[0] = np.union1d(seen[0], np.concatenate(parts)), stop
        return seen[0]

    return objects


def _chunk_size(sizes: np.ndarray, chunk: int) -> Callable[[int], int]:
    """Bytes of a chunk id (``sizes``: of each object; an object's last chunk is shorter)."""
    mask = (1 << CHUNK_BITS) - 1
    return lambda c: int(min(chunk, sizes[c >> CHUNK_BITS] - (c & mask) * chunk))


def _tie(layout: Sequence[TableBytes]) -> Callable[[int], tuple[str, int]]:
    """How the chunk store orders chunks of equal next use: by object key, then index (keys
    unknown: by object id)."""
    keys = [k for tb in layout for k in (tb.keys or [f"{i:012d}" for i in range(tb.num_objects)])]

    def key(obj: int) -> str:  # a video stream's (after the tables' objects): by its id
        return keys[obj] if obj < len(keys) else f"~{obj:012d}"

    return lambda c: (key(c >> CHUNK_BITS), c & ((1 << CHUNK_BITS) - 1))


def _time(rep: NodeReport, setup: Setup, link: Link) -> None:
    """The link's time per round, the first batch's, and the peak of bytes in flight."""
    times = [max(b / link.bandwidth, g * link.latency / link.in_flight)
             for b, g in zip(rep.fetched, rep.gets)]  # fmt: skip
    rep.link_s = float(sum(times))
    rep.first_batch_s = 4 * link.latency + times[0]
    window = setup.window + 1
    later = np.asarray(rep.fetched[1:], np.int64)
    sums = np.convolve(later, np.ones(window, np.int64), "valid") if later.size >= window else later
    rep.peak_in_flight = int(max([rep.fetched[0], *sums.tolist()]))


def table_layout(tables: Sequence[Table]) -> list[TableBytes]:
    """:meth:`TableBytes.of` of each table, object ids one after the other."""
    layout, first = [], 0
    for t in tables:
        layout.append(TableBytes.of(t, first))
        first += layout[-1].num_objects
    return layout


def simulate(plan: Any, tables: Sequence[Table], setup: Setup, link: Link,
             steps: Sequence[int], layout: Sequence[TableBytes] | None = None,
             media: MediaWindows | None = None) -> list[NodeReport]:  # fmt: skip
    """Walk ``steps`` of ``plan`` (one contiguous window, from a cold cache) for the sampled
    nodes. ``layout``: where each table's rows lie (default :func:`table_layout`; a Lance
    table's true pages: :func:`treadle.read.simpages.page_layout`). ``media``: the video
    windows' byte ranges (:func:`treadle.read.simpages.media_windows`; None: no video)."""
    world = setup.nodes * setup.ranks_per_node
    if setup.cache_bytes < setup.chunk_bytes:  # the loader's chunk store refuses it
        raise PlanError(f"cache_bytes {setup.cache_bytes:,} is less than one chunk "
                        f"(chunk_bytes {setup.chunk_bytes:,})")  # fmt: skip
    if plan.batch_size % world:
        raise PlanError(
            f"batch size {plan.batch_size} is not divisible by {setup.nodes} nodes x "
            f"{setup.ranks_per_node} ranks = {world} ranks"
        )
    layout = table_layout(tables) if layout is None else layout
    nodes = sampled_nodes(setup)
    streams = MediaObjects(media, sum(tb.num_objects for tb in layout))
    per = node_steps(plan, layout, setup, steps, nodes, streams)
    samples = plan.batch_size // setup.nodes * len(steps)
    return [replay_node(n, per[n], samples, layout, setup, link, streams.sizes) for n in nodes]

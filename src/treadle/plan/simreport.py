"""The text ``treadle simulate`` prints: per node (the sampled nodes' mean, min and max) and
for the cluster, with a warning for every table prefix past about 5,500 GET/s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from treadle.plan.simulate import PREFIX_GETS, Link, NodeReport, Setup


def size_text(n: float) -> str:
    """Bytes in binary units, as the flags read them (``--bandwidth 1G`` is ``1 GiB/s``)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            v = n / size  # .3g of 1000 and more is "1e+03"
            return f"{v:.3g} {unit}" if abs(v) < 999.5 else f"{v:,.0f} {unit}"
    return f"{n:.0f} B"


def _stat(values: Sequence[float], fmt: Any) -> str:
    v = np.asarray(values, np.float64)
    return f"{fmt(v.mean())}  ({fmt(v.min())} .. {fmt(v.max())})"


def _rate(rep: NodeReport, setup: Setup, rank_rate: float | None) -> tuple[float, float]:
    """(samples/s the node runs at, seconds the walked steps take at it)."""
    link_rate = rep.samples / rep.link_s if rep.link_s > 0 else float("inf")
    rate = link_rate if rank_rate is None else min(link_rate, rank_rate * setup.ranks_per_node)
    return rate, rep.samples / rate if rate and rate != float("inf") else 0.0


def render(reports: Sequence[NodeReport], plan: Any, setup: Setup, link: Link,
           walked: str, rank_rate: float | None = None) -> str:  # fmt: skip
    """The report of one configuration (every sampled node over the walked steps)."""
    world = setup.nodes * setup.ranks_per_node
    sh = plan.record.shuffle
    shuffle = "full permutation" if sh is None else (
        f"BlockShuffle(block_rows={'/'.join(str(b) for b in sorted(set(sh.block_rows)))}, "
        f"window_blocks={sh.window_blocks}, partitions={sh.partitions})")  # fmt: skip
    rates = [_rate(r, setup, rank_rate) for r in reports]
    gets_s = [sum(r.gets) / t if t else 0.0 for r, (_, t) in zip(reports, rates)]
    lines = [
        f"run {plan.run_id} · {plan.num_components} components · {shuffle}",
        f"{setup.nodes} nodes x {setup.ranks_per_node} ranks = {world} ranks · batch "
        f"{plan.batch_size} ({plan.batch_size // world} per rank)",
        f"cache {size_text(setup.cache_bytes)} per node in {size_text(setup.chunk_bytes)} chunks"
        f" · lookahead {setup.window} steps · link {size_text(link.bandwidth)}/s, "
        f"{link.latency * 1e3:g} ms, {link.in_flight} requests in flight per node",
        f"walked {walked}; nodes sampled {[r.node for r in reports]}",
        "per node: mean (min .. max) of the sampled nodes",
        "  downloaded per step       "
        + _stat([sum(r.fetched) / max(r.steps, 1) for r in reports], size_text),
        "  fetched / delivered bytes "
        + _stat([sum(r.fetched) / max(r.delivered, 1) for r in reports], lambda x: f"{x:.2f}x"),
        "  hit rate, Belady optimum  " + _stat([r.optimum for r in reports], lambda x: f"{x:.1%}"),
        "  hit rate, own ranks' uses "
        + _stat([r.own_ranks for r in reports], lambda x: f"{x:.1%}")
        + "  (Belady, each rank knowing its own next uses only)",
        "  hit rate, LRU             " + _stat([r.lru for r in reports], lambda x: f"{x:.1%}"),
        "  hit rate, the loader      "
        + _stat([r.loader for r in reports], lambda x: f"{x:.1%}")
        + "  (its lookahead stage replayed)",
        *_gave_up_lines(reports),
        "  GETs per sample           "
        + _stat([sum(r.gets) / r.samples for r in reports], lambda x: f"{x:.4f}"),
        "  GET/s                     " + _stat(gets_s, lambda x: f"{x:,.0f}"),
        "  GETs per sample, steady   "
        + _stat([(sum(r.gets) - r.open_gets) / r.samples for r in reports], lambda x: f"{x:.4f}"),
        "  per rank: GETs            "
        + _stat([g for r in reports for g in r.rank_gets], lambda x: f"{x:,.0f}"),
        "  per rank: bytes fetched   "
        + _stat([b for r in reports for b in r.rank_fetched], size_text),
        "  opening GETs per rank     "
        + _stat([r.open_gets / len(r.rank_gets) for r in reports], lambda x: f"{x:,.0f}")
        + "  (manifests, data file footers)",
        "  peak in-flight bytes      " + _stat([r.peak_in_flight for r in reports], size_text),
        "  time to first batch       "
        + _stat([r.first_batch_s for r in reports], lambda x: f"{x:.2f} s"),
        "  samples/s                 "
        + _stat([x for x, _ in rates], lambda x: f"{x:,.0f}")
        + ("" if rank_rate is None else f"  (ranks asking {rank_rate:,.0f}/s each)"),
    ]
    lines += _lifetime_lines(plan)
    over = sum(r.over for r in reports)
    if over:
        lines.append(f"  warning: {over} steps need more chunks than the cache holds")
    cluster = float(np.mean([x for x, _ in rates])) * setup.nodes
    lines.append(f"cluster: {cluster:,.0f} samples/s, {np.mean(gets_s) * setup.nodes:,.0f} GET/s")
    lines += _prefix_lines(reports, rates, setup)
    return "\n".join(lines) + "\n"


def _gave_up_lines(reports: Sequence[NodeReport]) -> list[str]:
    """Where the loader's lookahead stage gave up, as the loader does when most chunks its
    window needs find no room: its hit rate counts only the steps asked until then."""
    stops = [r.loader_stopped for r in reports if r.loader_stopped is not None]
    if not stops:
        return []
    where = (
        f"step {min(stops)}" if min(stops) == max(stops) else f"steps {min(stops)}..{max(stops)}"
    )
    return [
        f"  warning: the loader's lookahead stage gives up at {where} of {reports[0].steps} "
        f"({len(stops)} of {len(reports)} nodes): the chunks its window needs do not fit the "
        "cache; its hit rate counts the steps until then, after which it reads rows as without "
        "lookahead (the GETs and bytes above are the optimum's)"
    ]


def _prefix_lines(reports: Sequence[NodeReport], rates: Sequence[tuple[float, float]],
                  setup: Setup) -> list[str]:  # fmt: skip
    """Cluster GET/s per table (one prefix each), busiest first; a warning past the limit."""
    per: dict[str, float] = {}
    for r, (_, t) in zip(reports, rates):
        for name, gets in r.table_gets.items():
            per[name] = per.get(name, 0.0) + (gets / t if t else 0.0) * setup.nodes / len(reports)
    busiest = sorted(per.items(), key=lambda kv: -kv[1])
    out = ["  busiest prefixes: " + ", ".join(f"{n} {g:,.0f} GET/s" for n, g in busiest[:3])]
    for name, gets in busiest:
        if gets > PREFIX_GETS:
            out.append(
                f"  warning: table {name!r} takes {gets:,.0f} GET/s, past the ~{PREFIX_GETS:,} "
                f"GET/s an S3 prefix serves before 503 SlowDown"
            )
    return out


def _lifetime_lines(plan: Any) -> list[str]:
    """How many steps a block stays open: ``w * block_rows * P / (share * B)`` per component
    (a walk shorter than that sees mostly first fetches, and overstates bytes per sample)."""
    sh = plan.record.shuffle
    if sh is None:
        return []
    life = [
        sh.window_blocks * rows * sh.partitions / (float(share) * plan.batch_size)
        for rows, share in zip(sh.block_rows, plan.weights)
    ]
    big = int(np.argmax([float(w) for w in plan.weights]))
    return [
        f"  a block stays open ~{_steps(life[big])} steps (largest component), "
        f"{_steps(min(life))} .. {_steps(max(life))} over all: walk longer windows than that"
    ]


def _steps(n: float) -> str:
    """A block's lifetime in steps: two significant digits under 10 (a block read within
    one step printed "~0 steps")."""
    return f"{n:,.0f}" if n >= 10 else f"{n:.2g}"

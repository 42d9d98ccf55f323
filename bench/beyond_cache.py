"""Issue 48's case: the mix on S3 behind a 30 ms proxy, the object cache bounded to 1/8 of
the tables, the full permutation against ``td.BlockShuffle``, each against its limit measured
in the same run, interleaved with it.

Two image tables (64x64x3 uint8 and a 7-float action, ``--rows`` rows each: ``case_mix``'s
data) on SeaweedFS behind ``delay_proxy`` (the S3 server, the proxy and the loader share the
machine's cores); ``TREADLE_CACHE_BYTES`` = 1/8 of their data files. Each configuration runs
``--steps`` batches of 64 from a cold object cache; reported: samples/s, its ratio to the
limit, requests and payload kB per sample the proxy counted; with ``--lookahead L`` also each
order with ``TrainLoader(lookahead=L)`` (the chunk cache driven by the plan, bounded like the
object cache: ``TREADLE_CHUNK_CACHE_BYTES`` = 1/8 of the data files), its hit rate and
Belady's optimum for that cache, chunk size and lookahead (``treadle simulate``'s replay over
the same steps and the same pages).

The limits, each round (issue 48): for ``BlockShuffle``, min(the same loader on local disk,
the link: raw obstore 8 MiB range GETs of the data files, 8 in flight, through the proxy); for
the full shuffle, random single-sample range GETs, 64 in flight, through the proxy.

``--cpu`` (Linux) adds, for the link and each lookahead row, the CPU each party spent per
sample delivered (the S3 server's processes, the proxy's thread, the loader: the rest of
this process) from the first batch on, the cores they kept busy together, and the rate the
machine's cores would allow at that cost: ``cores / (store + proxy + loader)``; and two ceilings: the rate the cores would allow a
loader costing the local loader's CPU plus what fetching like the link (8 MiB GETs) or like
what half the cache can keep in flight (1 MiB GETs) costs every party, every core busy.

    python bench/beyond_cache.py [--rows 12000] [--steps 60] [--rounds 2] [--lookahead 16]
                                 [--block-rows 512] [--window-blocks W] [--cache-part 8]
                                 [--cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import case_mix as cm  # noqa: E402
import case_s3 as c3  # noqa: E402
from benchlib import cold_object_cache, thread_cpu, tree_cpu  # noqa: E402
from case_cloud import LATENCY_S, Proxied  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402

LINK_RANGE = 8 << 20


class CpuMeter:
    """CPU seconds of the S3 server (``pid``), the proxy's thread and the rest of this
    process (the loader or the raw GETs) between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int, proxy: DelayProxy) -> None:
        self.pid, self.proxy = pid, proxy
        self.spent = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float, float]:
        tid = self.proxy._thread.native_id if self.proxy._thread is not None else 0
        proxy = thread_cpu(tid) if tid else 0.0
        return tree_cpu(self.pid), proxy, tree_cpu(exclude=[self.pid]) - proxy, time.perf_counter()

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> None:
        now = self._now()
        self.spent = tuple(b - a for a, b in zip(self._t0, now))  # type: ignore[assignment]

    def costs(self, samples: int) -> tuple[float, float, float]:
        """Seconds of CPU a sample: (store, proxy, client), of the last start..stop."""
        return tuple(x / max(samples, 1) for x in self.spent[:3])  # type: ignore[return-value]

    def line(self, samples: int, limit: float) -> str:
        """Per sample: each party's CPU; the cores busy; the rate the cores allow."""
        store, proxy, loader, wall = self.spent
        per = (store + proxy + loader) / max(samples, 1)
        cores = os.cpu_count() or 1
        allow = cores / per if per > 0 else float("inf")
        return (f"CPU per sample: store {store / samples * 1e6:.1f} us, proxy "
                f"{proxy / samples * 1e6:.1f} us, client {loader / samples * 1e6:.1f} us; "
                f"{(store + proxy + loader) / wall:.2f} of {cores} cores busy; at this cost "
                f"the cores allow {allow:,.0f} samples/s ({allow / limit:.2f}x limit)")  # fmt: skip


def ceiling(local: float, fetch: tuple[float, float, float], limit: float, what: str) -> str:
    """The rate the cores would allow a loader costing the local loader's CPU a sample
    (``local`` s) plus what fetching its bytes like ``what`` costs the store, the proxy and
    the client (``fetch``, s a sample), every core busy: the most this machine can show."""
    cores = os.cpu_count() or 1
    per = local + sum(fetch)
    allow = cores / per
    return (f"ceiling ({what}): local client {local * 1e6:.1f} + store {fetch[0] * 1e6:.1f} + "
            f"proxy {fetch[1] * 1e6:.1f} + client {fetch[2] * 1e6:.1f} us a sample: {cores} "
            f"cores allow {allow:,.0f} samples/s ({allow / limit:.2f}x limit)")  # fmt: skip


def run(root: Path, s3: Proxied | None, steps: int, shuffle: object,
        lookahead: int | None = None, meter: CpuMeter | None = None
        ) -> tuple[float, int, Any]:  # fmt: skip
    """(seconds for ``steps`` batches after the first, samples, the loader); ``meter``
    counts the CPU spent on them."""
    import treadle as td

    branch = cm.treadle_client(root, s3, "mix").project("bench").branch()
    comps = [td.Component(branch.table(t), None, weight=w) for t, w in zip(cm.TABLES, cm.WEIGHTS)]
    recipe = td.Recipe(seed=2048, batch_size=cm.BATCH, components=comps, shuffle=shuffle)
    loader = td.TrainLoader(recipe, steps=steps + 1, prefetch=4, lookahead=lookahead)
    it = iter(loader)
    next(it)
    if meter is not None:
        meter.start()
    t0 = time.perf_counter()
    n = sum(len(b["_moment"]) for b in it)
    wall = time.perf_counter() - t0
    if meter is not None:
        meter.stop()
    return wall, n, loader


def link_limit(store: Any, files: list[tuple[str, int]], per_sample: float,
               size: int = LINK_RANGE, in_flight: int = 8) -> float:  # fmt: skip
    """Samples/s of raw range GETs of the data files (``size`` bytes each, ``in_flight`` at
    once; the issue's limit: 8 MiB, 8 in flight)."""
    ranges = [[(k, s, min(s + size, n))] for k, n in files for s in range(0, n, size)]
    wall, got = c3.raw_get(store, ranges, in_flight=in_flight)
    return got / wall / per_sample


def random_limit(store: Any, files: list[tuple[str, int]], samples: int, seed: int) -> float:
    """Samples/s of random single-sample range GETs (the mix's shares), 64 in flight."""
    ranges = [[r] for b in c3.mix_batches(files, samples // cm.BATCH + 1, seed) for r in b]
    wall, _ = c3.raw_get(store, ranges[:samples], in_flight=64)
    return samples / wall


def optimum(loader: Any, steps: int) -> tuple[float, float]:
    """Belady's hit rate over the loader's steps, its chunk cache, chunks and lookahead, and
    the simulator's replay of the loader's stage (its window and reader's ``read_ahead``)."""
    from treadle.plan.simulate import Link, Setup, simulate
    from treadle.read.simpages import page_layout

    stage, plan = loader.lookahead_stage, loader.plan
    layout = page_layout(plan.tables, stage.chunks, reader=stage.reader.fixed)
    setup = Setup(1, 1, stage.chunks.max_bytes, stage.chunks.chunk_bytes, stage.lookahead, 1,
                  read_ahead=stage.reader.read_ahead)  # fmt: skip
    (rep,) = simulate(plan, plan.tables, setup, Link(1e9, LATENCY_S), range(steps), layout)
    return rep.optimum, rep.loader


def treadle_row(r: int, name: str, root: Path, s3p: Proxied, proxy: DelayProxy, steps: int,
                shuffle: object, look: int | None, limit: float,
                meter: CpuMeter | None = None) -> None:  # fmt: skip
    """One timed run of treadle through the proxy, printed with its ratio to ``limit``
    (``meter``: and the CPU it cost, when it looks ahead)."""
    from treadle import reaper
    from treadle.read.lookahead import LAST

    with cold_object_cache():
        c0 = proxy.counts()
        meter = meter if look is not None else None
        wall, n, loader = run(root, s3p, steps, shuffle, look, meter)
        got = proxy.counts() - c0
    total = n + cm.BATCH
    extra = ""
    if look is not None:
        reaper.drain(30)  # the stage's report is made on the reaper thread
        best, replay = optimum(loader, steps + 1)
        hit = LAST.get("hit_rate")  # None: no chunk asked for
        waited = LAST.get("reader_waited")  # the reader's time at the gate, for fetches
        extra = (f"  hit rate {'-' if hit is None else f'{hit:.1%}'} (optimum {best:.1%}, "
                 f"replay {replay:.1%}); reader waited "
                 f"{'-' if waited is None else f'{waited:.0%}'} for fetches")  # fmt: skip
    print(f"round {r} {name:<16} {n / wall:8,.0f} samples/s  {n / wall / limit:5.2f}x limit  "
          f"{got.requests / total:.3f} requests and {got.body_out / total / 1e3:,.1f} kB "
          f"per sample{extra}", flush=True)  # fmt: skip
    if meter is not None:
        print(f"round {r} {name:<16} {meter.line(n, limit)}", flush=True)


def _local(root: Path, steps: int, shuffle: object, meter: CpuMeter | None = None
           ) -> tuple[float, int]:  # fmt: skip
    wall, n, _ = run(root, None, steps, shuffle, meter=meter)
    return n / wall, n


def _data(rows: int) -> Path:
    """The case's tables in treadle's format only (``case_mix`` writes every format)."""
    root = cm.data_dir(rows)
    if not (root / "treadle.done").exists():
        cm._write_treadle(root / "treadle", rows)
        (root / "treadle.done").write_text("ok\n")
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=512, help="0: td.BlockShuffle()'s")
    ap.add_argument("--window-blocks", type=int, default=None, help="td.BlockShuffle()'s w")
    ap.add_argument("--lookahead", type=int, default=None)
    ap.add_argument("--block-only", action="store_true", help="skip the full shuffle's rows")
    ap.add_argument("--cache-part", type=int, default=8, help="caches of 1/N of the data")
    ap.add_argument("--cpu", action="store_true", help="CPU per sample of each party (Linux)")
    a = ap.parse_args()
    import treadle as td
    from treadle.testing import SeaweedS3

    root = _data(a.rows)
    data = sum(p.stat().st_size for p in (root / "treadle").rglob("*.lance") if p.is_file())
    os.environ["TREADLE_CACHE_BYTES"] = str(max(data // a.cache_part, 1))
    os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(max(data // a.cache_part, 1))
    files = c3.lance_files(root / "treadle", "mix")
    per_sample = sum(n for _, n in files) / (a.rows * len(cm.TABLES))
    print(f"{data / 1e6:,.0f} MB of data files; cache bound {data // a.cache_part / 1e6:,.0f} MB; "
          f"{per_sample / 1e3:.1f} kB of data files per sample")  # fmt: skip
    rows = a.block_rows or None  # 0: sized from the cache bound (td.BlockShuffle())
    block = td.BlockShuffle(block_rows=rows, window_blocks=a.window_blocks)
    w = "" if a.window_blocks is None else f" w{a.window_blocks}"
    orders = {"full": None, f"block {rows or 'auto'}{w}": block}
    if a.block_only:
        del orders["full"]
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        c3.upload(s3, root / "treadle", "mix")
        s3p = Proxied(s3, proxy)
        raw = c3.raw_store(s3p)
        meter = CpuMeter(s3.proc.pid, proxy) if a.cpu and s3.proc is not None else None
        samples = (a.steps + 1) * cm.BATCH
        for r in range(a.rounds):
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"round {r}: load average {load}", flush=True)
            for name, shuffle in orders.items():  # each order with its limit, interleaved
                local, n_local = _local(root, a.steps, shuffle, meter)
                if meter is not None:
                    print(f"round {r} local {name}: {meter.line(n_local, local)}", flush=True)
                    local_cpu = meter.costs(n_local)[2]
                if shuffle is None:
                    limit = random_limit(raw, files, samples, seed=r)
                    print(f"round {r} limit {name}: random single-sample GETs x64 "
                          f"{limit:,.0f} samples/s (local {local:,.0f})", flush=True)  # fmt: skip
                else:
                    if meter is not None:
                        meter.start()
                    link = link_limit(raw, files, per_sample)
                    limit = min(local, link)
                    if meter is not None:
                        meter.stop()
                        print(f"round {r} link: {meter.line(a.rows * len(cm.TABLES), limit)}",
                              flush=True)  # fmt: skip
                        link_cpu = meter.costs(a.rows * len(cm.TABLES))
                    print(f"round {r} limit {name}: min(local {local:,.0f}, 8 MiB GETs x8 "
                          f"{link:,.0f}) samples/s", flush=True)  # fmt: skip
                    # the link with no more bytes in flight than half the cache bound (the
                    # other half holds the open blocks): what a cache this size can draw
                    half = max(1, data // a.cache_part // 2 // (1 << 20))
                    if meter is not None:
                        meter.start()
                    held = link_limit(raw, files, per_sample, 1 << 20, half)
                    print(f"round {r} (not the issue's limit) 1 MiB GETs x{half} (half the "
                          f"cache in flight) {held:,.0f} samples/s", flush=True)  # fmt: skip
                    if meter is not None:
                        meter.stop()
                        print(f"round {r} 1 MiB GETs: {meter.line(a.rows * len(cm.TABLES), limit)}",
                              flush=True)  # fmt: skip
                        held_cpu = meter.costs(a.rows * len(cm.TABLES))
                        for what, cpu in (("8 MiB GETs x8", link_cpu),
                                          (f"1 MiB GETs x{half}", held_cpu)):  # fmt: skip
                            print(f"round {r} {ceiling(local_cpu, cpu, limit, what)}", flush=True)
                looks = [None] if a.lookahead is None else [None, a.lookahead]
                for look in looks:
                    label = name if look is None else f"{name} +L{look}"
                    treadle_row(r, label, root, s3p, proxy, a.steps, shuffle, look, limit, meter)


if __name__ == "__main__":
    main()

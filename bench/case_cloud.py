"""Case ``cloud``: cases 1 and 2 on S3 at cloud latency, against the same loader on local disk.

The tables of ``mix`` and ``video`` are copied into SeaweedFS on 127.0.0.1 (as in case
``s3``), and read through a :class:`delay_proxy.DelayProxy` that holds every request
``LATENCY_S`` (30 ms, what a cloud region's object store adds to a request), by the same
``td.TrainLoader`` configurations that also read the local copy in the same interleaved
rounds:

- mix: workers 0 and 2, :data:`MIX_BATCHES` timed batches; each S3 run starts with an empty object cache (a fresh
  ``TREADLE_CACHE_DIR``): it copies the two tables' data files in its start-up (``start s``)
  and maps them, as a training run's first epoch does;
- video: workers 0 with 2 reader threads, and 2 workers (1 thread each), per size.

Each S3 row also records, per batch, the requests that reached the server and the bytes
each way (counted by the proxy over the whole run, start-up included, divided by the
batches the loader read; ``extra``), and shows them in its label. ``report.py`` judges best on S3 / best local per data set (issue 33, goal 4: >= 0.9).
The S3 server runs on the same cores as the loader, and its CPU is not counted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchlib import Result, Run, batch_len, cold_object_cache, measure
from delay_proxy import Counts, DelayProxy

LATENCY_S = 0.030
MIX_BATCHES = 2000
"""Timed batches of a mix row: at local disk's ~70-90k samples/s, case mix's 150 batches
were 0.14 s and 600 were 0.5 s, and rounds of workers=2 came out bimodal (~50k or ~100k
samples/s, local and S3 alike); over 3,000 batches both were 90-103k in every round."""


class Proxied:
    """A ``SeaweedS3``'s URLs and options, with the endpoint replaced by a proxy's."""

    def __init__(self, s3: Any, proxy: DelayProxy):
        self.s3, self.proxy = s3, proxy

    @property
    def bucket(self) -> str:
        return self.s3.bucket

    def url(self, prefix: str = "") -> str:
        return self.s3.url(prefix)

    def storage_options(self) -> dict[str, str]:
        return self.proxy.options(self.s3.storage_options())


def note(res: Result, got: Counts, batches: int, peak: int) -> None:
    """Requests and bytes per batch of one run into ``res`` (extra, and its label)."""
    per = res.extra.setdefault("per_batch", [])
    per.append({"requests": got.requests / batches, "bytes_out": got.bytes_out / batches,
                "bytes_in": got.bytes_in / batches, "max_in_flight": peak})  # fmt: skip
    req = statistics.median(p["requests"] for p in per)
    kb = statistics.median(p["bytes_out"] for p in per) / 1e3
    res.extra["requests_per_batch"], res.extra["kb_per_batch"] = req, kb
    res.config["label"] = f"{res.config['base_label']} ({req:.1f} requests, {kb:,.0f} kB per batch)"


def timed_run(make: Callable[[], Iterator[Any]], n: int, steps: int, warm: int,
              proxy: DelayProxy | None, res: Result) -> Run:  # fmt: skip
    """``measure`` of ``make()`` (a loader of ``steps`` batches); through the proxy, with
    its requests and bytes per batch over the whole run (start-up included: with many
    batches read ahead, the timed batches' reads are not apart from the others')."""
    if proxy is None:
        return measure(make, n, batch_len, warm)
    c0 = proxy.counts()
    proxy.reset_peak()
    run = measure(make, n, batch_len, warm)
    note(res, proxy.counts() - c0, steps, proxy.max_waiting)
    return run


def _mix_rows(root: Any, s3p: Proxied, proxy: DelayProxy, tiny: bool) -> list[tuple[Result, Any]]:
    import case_mix as cm

    samples = (4 if tiny else MIX_BATCHES) * cm.BATCH
    steps = samples // cm.BATCH + 2
    rs = []
    for w in (0,) if tiny else (0, 2):
        for where, s3 in (("local", None), ("s3", s3p)):
            r = Result("cloud", "treadle", {"data": "mix", "where": where, "workers": w},
                       "samples/s")  # fmt: skip
            r.config["base_label"] = r.config["label"] = (
                f"treadle TrainLoader {'local' if s3 is None else 'on S3 +30 ms, cold cache'}, "
                f"workers={w}"
            )

            def fn(w=w, s3=s3, r=r) -> Run:
                make = lambda: cm.treadle_iter(root, w, steps, s3=s3, prefix="mix")  # noqa: E731
                if s3 is None:
                    return timed_run(make, samples, steps, 0, None, r)
                with cold_object_cache():  # each run copies the data files (in its start-up)
                    return timed_run(make, samples, steps, 0, proxy, r)

            rs.append((r, fn))
    return rs


def _video_rows(client: Any, s3c: Any, proxy: DelayProxy, tiny: bool) -> list[tuple[Result, Any]]:
    import case_video as cv

    rs = []
    for sz in cv.sizes(tiny):
        lab, nw = cv.label(sz), sz["windows"]
        for workers, threads in ((0, 2),) if tiny else ((0, 2), (2, 1)):
            for where, c in (("local", client), ("s3", s3c)):
                cfg = {"data": f"video {lab}", "where": where, "workers": workers,
                       "threads": threads}  # fmt: skip
                r = Result("cloud", "treadle", cfg, "frames/s")
                r.config["base_label"] = r.config["label"] = (
                    f"treadle {'local' if where == 'local' else 'on S3 +30 ms'} "
                    f"workers={workers} threads={threads}"
                )

                def fn(sz=sz, c=c, workers=workers, threads=threads, nw=nw, r=r,
                       p=proxy if where == "s3" else None) -> Run:  # fmt: skip
                    warm = cv.warmup(tiny, workers)
                    steps = nw // cv.BATCH + 2 + warm
                    make = lambda: cv.treadle_iter(c, sz, workers, threads, steps)  # noqa: E731
                    run = timed_run(make, nw, steps, warm, p, r)
                    run.samples *= sz["window"]
                    return run

                rs.append((r, fn))
    return rs


def _limit_rows(mix_root: Any, s3p: Proxied, plans: dict[str, Any], tiny: bool
                ) -> list[tuple[Result, Any]]:  # fmt: skip
    """Raw range GETs (obstore, no decode) of the same bytes through the proxy, at treadle's
    read-ahead on object stores (``CLOUD_READ_AHEAD`` batches in flight)."""
    import case_mix as cm
    import case_s3 as c3
    import case_video as cv
    from benchlib import tree_cpu
    from treadle.concurrency import CONCURRENCY

    CLOUD_READ_AHEAD = CONCURRENCY.cloud_read_ahead

    store = c3.raw_store(s3p)
    samples = (4 if tiny else 150) * cm.BATCH
    files = c3.lance_files(mix_root / "treadle", "mix")
    jobs = [("mix", c3.mix_batches(files, samples // cm.BATCH), "samples/s", 1)]
    for sz in cv.sizes(tiny):
        ranges = [(f"video/projects/bench/{k}", a, e) for k, a, e, _ in
                  cv.window_ranges(plans[sz["name"]], range(sz["windows"] // cv.BATCH))]  # fmt: skip
        vb = [ranges[i : i + cv.BATCH] for i in range(0, len(ranges), cv.BATCH)]
        jobs.append((f"video {cv.label(sz)}", vb, "frames/s", sz["window"]))
    rs = []
    for data, batches, unit, per in jobs:
        r = Result("cloud", "limit", {"data": data, "where": "s3"}, unit)
        r.config["label"] = (
            f"limit: obstore range GETs through the proxy, {CLOUD_READ_AHEAD} batches in flight"
        )

        def fn(batches=batches, per=per) -> Run:
            c0 = tree_cpu()
            wall, _ = c3.raw_get(store, batches, CLOUD_READ_AHEAD)
            return Run(wall, tree_cpu() - c0, sum(len(b) for b in batches) * per)

        rs.append((r, fn))
    return rs


def run(tiny: bool, runs: int, log: Callable[[str], None]) -> list[Result]:
    """Every configuration, local and on S3 +30 ms, ``runs`` interleaved rounds."""
    import case_mix as cm
    import case_s3 as c3
    import case_video as cv
    import treadle as td
    from treadle.testing import SeaweedS3

    mix_root = cm.generate(1000 if tiny else 20_000, log)
    vid_root = cv.generate(tiny, log)
    with SeaweedS3(bucket="bench") as s3, DelayProxy(s3.endpoint, LATENCY_S) as proxy:
        t0 = time.perf_counter()
        nbytes = c3.upload(s3, mix_root / "treadle", "mix")
        nbytes += c3.upload(s3, vid_root / "treadle", "video")
        log(f"  uploaded {nbytes / 1e6:,.0f} MB to SeaweedFS in {time.perf_counter() - t0:.1f} s")
        s3p = Proxied(s3, proxy)
        local = td.Client(str(vid_root / "treadle"))
        remote = td.Client(s3p.url("video"), storage_options=s3p.storage_options())
        rs = _mix_rows(mix_root, s3p, proxy, tiny) + _video_rows(local, remote, proxy, tiny)
        plans = {sz["name"]: cv.recipe(local, sz).plan() for sz in cv.sizes(tiny)}
        rs += _limit_rows(mix_root, s3p, plans, tiny)
        for rnd in range(runs):
            t = time.perf_counter()
            for r, fn in rs:
                if r.status != "ok":
                    continue
                try:
                    r.runs.append(fn())
                except Exception as e:  # reported, the others go on
                    r.status = f"failed: {type(e).__name__}: {str(e)[:160]}"
                    log(f"    {r.config['label']}: {r.status}")
            log(f"  cloud: round {rnd + 1}/{runs} took {time.perf_counter() - t:.1f} s")
    return [r for r, _ in rs]

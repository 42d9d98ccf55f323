"""The benchmark suite behind ``treadle bench``: treadle side by side with the peer loaders.

Cases (``--cases``, default all):

- ``mix``: image + action, 30/70 mix of two tables, batch 64 (``case_mix.py``);
- ``video``: 90x224x224 and 16x640x480 windows of H.264 episodes (``case_video.py``);
- ``s3``: ``mix`` and ``video`` with the tables on SeaweedFS S3 on 127.0.0.1 vs raw
  parallel range GETs of the same bytes with obstore (``case_s3.py``);
- ``plan``: one batch at step 0 and 1e12, resume (``plan_bench.py``'s recipes), and building
  a 16-component plan (random p/q weights; six-digit decimals with a 10**6-step period);
- ``import_ray`` (opt-in, not in the default run): WebDataset import, one process vs Ray
  with 2 local workers, and their ratio (``case_import_ray.py``);
- ``augment`` (opt-in): samples/s of the 90-frame video recipe with and without
  ``treadle.transforms`` augmentations (``case_augment.py``).

Datasets are generated once under ``bench/data/`` (``$TREADLE_BENCH_DATA`` if set: ``treadle
bench`` sets it to its ``--dir``) in each library's own format. Every
configuration of a case runs once per round, ``--runs`` rounds, interleaved, so a noisy shared
machine hits them alike; the table shows medians. Wall rate excludes start-up (time to the
first batch, shown separately); CPU rate counts the whole process tree (spawned workers and,
for ``s3``, the S3 server too). Results go to ``bench/results/<stamp>.json`` and
``latest.json``, and a PNG chart when matplotlib is installed. Nothing here asserts a timing.

    python bench/suite.py [--tiny] [--cases mix,video,s3,plan] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from benchlib import Result, Run, batch_len, measure, tree_cpu  # noqa: E402

CASES = ("mix", "video", "s3", "plan")
OPT_IN = ("import_ray", "augment")  # run only when named in --cases
GOALS = {
    "mix": "treadle >= 2x the best peer's samples/s",
    "video": "treadle >= 0.8x the FFmpeg decode limit (useful frames/s), ahead of torchcodec and SPDL on the same bytes, >= 3x LeRobotDataset",
    "s3": "treadle on S3 >= 0.9x raw parallel range-GET throughput",
    "plan": "< 1 ms per batch at any step, < 1 s to build 16 components",
    "import_ray": "reported: Ray with 2 local workers / one process (same cores)",
    "augment": "reported: samples/s with the shipped augmentations / without",
}


def log(msg: str) -> None:
    print(msg, flush=True)


def _attempt(res: Result, fn: Callable[[], Run]) -> None:
    if res.status != "ok":
        return
    try:
        res.runs.append(fn())
    except Exception as e:  # a peer that fails is reported, the suite goes on
        res.status = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        res.extra["traceback"] = traceback.format_exc()[-2000:]
        log(f"    {res.name} {res.config}: {res.status}")


# -- case 1 -------------------------------------------------------------------------------
def run_mix(tiny: bool, runs: int) -> list[Result]:
    import case_mix as cm

    n = 1000 if tiny else 20_000
    samples = (4 if tiny else 150) * cm.BATCH
    steps = samples // cm.BATCH + 2
    root = cm.generate(n, log)
    peer_workers = (0,) if tiny else (0, 2)
    configs = [("treadle", 0), ("treadle", 2)]
    configs += [(p, w) for p in ("mds", "wds", "hf", "lance") for w in peer_workers]
    configs += [("limit", 0)]
    results = []
    for name, w in configs:
        r = Result("mix", name, {"workers": w, "label": cm.LABELS[name]}, "samples/s")
        r.status = cm.available(name, root) or "ok"
        r.extra["samples_per_table"] = n
        results.append(r)
    for rnd in range(runs):
        log(f"  mix round {rnd + 1}/{runs}: {samples:,} samples per reader")
        for r in results:
            fn = cm.READERS[r.name]
            w = r.config["workers"]
            _attempt(r, lambda fn=fn, w=w: measure(lambda: fn(root, w, steps), samples, batch_len))
    return results


# -- case 2 -------------------------------------------------------------------------------
def run_video(tiny: bool, runs: int) -> list[Result]:
    import case_video as cv
    import case_video_peers as cvp
    import treadle as td

    root = cv.generate(tiny, log)
    client = td.Client(str(root / "treadle"))
    results = []
    for sz in cv.sizes(tiny):
        lab = cv.label(sz)
        paths = cv.stream_paths(root, sz)
        frames = sz["episodes"] * sz["frames"]
        n = sz["windows"]
        steps = n // cv.BATCH + 2
        # FFmpeg decodes every frame of the streams; a window needs its frames and those from
        # the keyframe before it: "exactly the frames needed" = decode rate x useful/needed.
        plan = cv.recipe(client, sz).plan()
        needed = statistics.mean(x[3] for x in cv.window_ranges(plan, range(steps)))
        useful = sz["window"] / needed
        rs: list[tuple[Result, Callable[[], Run]]] = []
        for procs in (1, 2):
            r = Result("video", "decode", {"size": lab, "cores": procs}, "frames/s")
            r.config["label"] = f"FFmpeg: every frame [{_limit_label()}] x{procs} proc"
            lim = Result("video", "limit", {"size": lab, "cores": procs}, "frames/s")
            lim.config["label"] = f"limit: FFmpeg, exactly the frames needed, x{procs} proc"
            lim.extra["decoded_per_window"] = needed
            lim.extra["useful_share"] = useful

            def dec(paths=paths, frames=frames, procs=procs, lim=lim, useful=useful) -> Run:
                wall, cpu = cv.limit_runs(paths, frames, procs)
                lim.runs.append(Run(wall, cpu, frames * useful))
                return Run(wall, cpu, frames)

            rs.append((r, dec))
            results.append(lim)
        tconfigs = [(0, 1), (0, 2)] + ([] if tiny else [(2, 1)])
        for workers, threads in tconfigs:
            cores = max(workers, threads)
            r = Result(
                "video",
                "treadle",
                {"size": lab, "workers": workers, "threads": threads, "cores": cores},
                "frames/s",
            )
            r.config["label"] = f"treadle TrainLoader workers={workers} threads={threads}"

            def tr(sz=sz, workers=workers, threads=threads, n=n, steps=steps) -> Run:
                run = measure(
                    lambda: cv.treadle_iter(client, sz, workers, threads, steps), n, batch_len
                )
                run.samples *= sz["window"]  # useful frames
                return run

            rs.append((r, tr))
        want = next(cv.treadle_iter(client, sz, 0, 1, 1))["cam"].numpy()
        for r, fn in cvp.rows(root, plan, sz, steps, cv.BATCH, tiny, cv.frames_of(sz), want, log):
            if fn is None:
                results.append(r)
            else:
                rs.append((r, fn))
        results += [r for r, _ in rs]
        for rnd in range(runs):
            log(f"  video {lab} round {rnd + 1}/{runs}: {n} windows per reader")
            for r, fn in rs:
                _attempt(r, fn)
    return results


def _limit_label() -> str:
    return "PyAV sequential decode, 1 thread"


# -- case 3 -------------------------------------------------------------------------------
def run_s3(tiny: bool, runs: int) -> list[Result]:
    import case_mix as cm
    import case_s3 as c3
    import case_video as cv
    import treadle as td
    from treadle.testing import SeaweedS3

    n = 1000 if tiny else 20_000
    mix_root = cm.generate(n, log)
    vid_root = cv.generate(tiny, log)
    results: list[Result] = []
    with SeaweedS3(bucket="bench") as s3:
        t0 = time.perf_counter()
        nbytes = c3.upload(s3, mix_root / "treadle", "mix")
        nbytes += c3.upload(s3, vid_root / "treadle", "video")
        log(f"  uploaded {nbytes / 1e6:,.0f} MB to SeaweedFS in {time.perf_counter() - t0:.1f} s")
        store = c3.raw_store(s3)
        rs: list[tuple[Result, Callable[[], Run]]] = []
        # image + action
        samples = (4 if tiny else 150) * cm.BATCH
        steps = samples // cm.BATCH + 2
        for w in (0,) if tiny else (0, 2):
            r = Result("s3", "treadle", {"data": "mix", "workers": w}, "samples/s")
            r.config["label"] = f"treadle TrainLoader on S3, workers={w}"

            def tm(w=w) -> Run:
                return measure(
                    lambda: cm.treadle_iter(mix_root, w, steps, s3=s3, prefix="mix"),
                    samples,
                    batch_len,
                )

            rs.append((r, tm))
        files = c3.lance_files(mix_root / "treadle", "mix")
        mb = c3.mix_batches(files, samples // cm.BATCH)
        r = Result(
            "s3", "limit", {"data": "mix", "label": "limit: obstore range GETs"}, "samples/s"
        )

        def rm(mb=mb) -> Run:
            c0 = tree_cpu()
            wall, _ = c3.raw_get(store, mb)
            return Run(wall, tree_cpu() - c0, sum(len(b) for b in mb))

        rs.append((r, rm))
        # video
        client = td.Client(s3.url("video"), storage_options=s3.storage_options())
        for sz in cv.sizes(tiny):
            lab = cv.label(sz)
            nw = sz["windows"]
            vsteps = nw // cv.BATCH + 2
            for workers, threads in ((0, 2),) if tiny else ((0, 2), (2, 1)):
                r = Result(
                    "s3",
                    "treadle",
                    {"data": f"video {lab}", "workers": workers, "threads": threads},
                    "frames/s",
                )
                r.config["label"] = f"treadle on S3 workers={workers} threads={threads}"

                def tv_(sz=sz, workers=workers, threads=threads, nw=nw, vsteps=vsteps) -> Run:
                    run = measure(
                        lambda: cv.treadle_iter(client, sz, workers, threads, vsteps), nw, batch_len
                    )
                    run.samples *= sz["window"]
                    return run

                rs.append((r, tv_))
            plan = cv.recipe(client, sz).plan()
            ranges = [
                (f"video/projects/bench/{k}", s, e)
                for k, s, e, _ in cv.window_ranges(plan, range(nw // cv.BATCH))
            ]
            vb = [ranges[i : i + cv.BATCH] for i in range(0, len(ranges), cv.BATCH)]
            r = Result("s3", "limit", {"data": f"video {lab}"}, "frames/s")
            r.config["label"] = "limit: obstore range GETs of the windows' bytes (no decode)"
            r.extra["bytes_per_window"] = statistics.mean(e - s for _, s, e in ranges)

            def rv(vb=vb, win=sz["window"]) -> Run:
                c0 = tree_cpu()
                wall, _ = c3.raw_get(store, vb)
                return Run(wall, tree_cpu() - c0, sum(len(b) for b in vb) * win)

            rs.append((r, rv))
        results += [r for r, _ in rs]
        for rnd in range(runs):
            log(f"  s3 round {rnd + 1}/{runs}")
            for r, fn in rs:
                _attempt(r, fn)
    return results


# -- case 4 -------------------------------------------------------------------------------
def run_plan(tiny: bool, runs: int) -> list[Result]:
    import plan_bench as pb
    from treadle.plan.plan import Plan
    from treadle.plan.record import RunRecord

    episodes = 200 if tiny else 10_000
    repeat = 30 if tiny else 300
    results = []
    for comps, batch, world in [(2, 64, 1), (6, 64, 1), (6, 64, 8)]:
        recipe, tables = pb._recipe(comps, batch, episodes)  # noqa: SLF001
        plan = recipe.plan()
        client = pb._Client(tables)  # noqa: SLF001
        text = plan.record.to_json()
        base = {"components": comps, "batch": batch, "world": world, "episodes": episodes}

        def resume(text=text, client=client, world=world) -> None:
            p = Plan.from_record(RunRecord.from_json(text), client)
            p.batch(10**12 + 17, 0, world)

        what = {
            "step 0": lambda p=plan, w=world: p.batch(0, 0, w),
            "step 1e12": lambda p=plan, w=world: p.batch(10**12, w - 1, w),
            "resume": resume,
        }
        for label, fn in what.items():
            r = Result("plan", "treadle", {**base, "what": label, "label": label}, "batches/s")
            for _ in range(runs):
                c0 = time.process_time()
                reps = repeat if label != "resume" else max(5, repeat // 20)
                us = pb._median_us(fn, reps)  # noqa: SLF001
                cpu = (time.process_time() - c0) / (reps + 1)
                r.runs.append(Run(us / 1e6, cpu, 1))
            results.append(r)
    # Building a 16-component plan: random p/q weights (shares within 1e-6) and six-digit
    # decimals (exact shares over 10**6, a 10**6-step period; 10**4 when tiny).
    for kind, batch, digits in [("random", 64, 6), ("1e6", 63, 4 if tiny else 6)]:
        what = f"build {kind}" if digits == 6 else f"build 1e{digits}"
        config = {"components": 16, "batch": batch, "world": 1, "what": what, "label": what}
        r = Result("plan", "treadle", config, "batches/s")
        for _ in range(runs):
            c0 = time.process_time()
            ms, plan = pb.build_ms(16, batch, kind, digits=digits)
            r.runs.append(Run(ms / 1e3, time.process_time() - c0, 1))
            r.extra["period"] = plan.schedule.period
        results.append(r)
    return results


# -- case 5 -------------------------------------------------------------------------------
def run_import_ray(tiny: bool, runs: int) -> list[Result]:
    import case_import_ray as ci

    return ci.run(tiny, runs, log)


def run_augment(tiny: bool, runs: int) -> list[Result]:
    import case_augment as ca

    return ca.run(tiny, runs, log)


RUNNERS: dict[str, Callable[[bool, int], list[Result]]] = {
    "mix": run_mix,
    "video": run_video,
    "s3": run_s3,
    "plan": run_plan,
    "import_ray": run_import_ray,
    "augment": run_augment,
}


# -- summary ------------------------------------------------------------------------------
def _best(results: list[Result], **match: Any) -> Result | None:
    cands = [
        r
        for r in results
        if r.rate
        and r.status == "ok"
        and all((r.name == v if k == "name" else r.config.get(k) == v) for k, v in match.items())
    ]
    return max(cands, key=lambda r: r.rate) if cands else None


def summarise(results: list[Result]) -> list[dict[str, Any]]:
    """Ratios treadle/peer and treadle/limit, and whether each goal holds."""
    out: list[dict[str, Any]] = []

    def add(goal: str, what: str, num: Any, den: Any, need: float) -> None:
        """``num``/``den``: a Result, or (label, rate, cpu rate), or None."""

        def parts(x: Any) -> tuple[str, float, float | None]:
            if isinstance(x, Result):
                return f"{x.name} {x.config.get('label', '')}".strip(), x.rate, x.cpu_rate
            return x

        if num is None or den is None:
            out.append({"goal": goal, "what": what, "ratio": None, "holds": None})
            return
        (nl, nr, nc), (dl, dr, dc) = parts(num), parts(den)
        ratio = nr / dr
        out.append(
            {
                "goal": goal,
                "what": what,
                "numerator": nl,
                "denominator": dl,
                "ratio": ratio,
                "cpu_ratio": (nc / dc) if nc and dc else None,
                "need": need,
                "holds": (ratio >= need) if need else None,
            }
        )

    mix = [r for r in results if r.case == "mix"]
    if mix:
        peers = [r for r in mix if r.name in ("mds", "wds", "hf") and r.rate and r.status == "ok"]
        best_peer = max(peers, key=lambda r: r.rate) if peers else None
        add("mix", "best treadle / best mixing peer", _best(mix, name="treadle"), best_peer, 2.0)
        for w in (0, 2):
            pw = [p for p in peers if p.config["workers"] == w]
            add(
                "mix",
                f"treadle / best mixing peer, workers={w}",
                _best(mix, name="treadle", workers=w),
                max(pw, key=lambda r: r.rate) if pw else None,
                2.0,
            )
        add(
            "mix",
            "best treadle / numpy limit",
            _best(mix, name="treadle"),
            _best(mix, name="limit"),
            0,
        )
    vid = [r for r in results if r.case == "video"]
    for size in sorted({r.config["size"] for r in vid}):
        for cores in (1, 2):
            add(
                "video",
                f"{size}: treadle / FFmpeg needed-frames limit, {cores} core(s)",
                _best(vid, name="treadle", size=size, cores=cores),
                _best(vid, name="limit", size=size, cores=cores),
                0.8,
            )
            for peer, what in (("torchcodec", "torchcodec"), ("spdl", "SPDL")):
                add(
                    "video",
                    f"{size}: treadle / {what}, {cores} core(s)",
                    _best(vid, name="treadle", size=size, cores=cores),
                    _best(vid, name=peer, size=size, cores=cores),
                    1.0,
                )
        add(
            "video",
            f"{size}: treadle / LeRobotDataset",
            _best(vid, name="treadle", size=size),
            _best(vid, name="lerobot", size=size),
            3.0,
        )
    s3 = [r for r in results if r.case == "s3"]
    for data in sorted({r.config["data"] for r in s3}):
        t3 = _best(s3, name="treadle", data=data)
        raw = _best(s3, name="limit", data=data)
        add("s3", f"{data}: treadle on S3 / raw range GETs", t3, raw, 0.9)
        if data.startswith("video"):
            size = data.split(" ", 1)[1]
            local = _best(vid, name="treadle", size=size)
            dec = _best(vid, name="limit", size=size, cores=2)
            if raw is not None and dec is not None:
                both = min((raw, dec), key=lambda r: r.rate)
                add(
                    "s3",
                    f"{data}: treadle on S3 / min(GETs, decode limit 2 cores)",
                    t3,
                    (f"min: {both.name} {both.config.get('label', '')}", both.rate, both.cpu_rate),
                    0.9,
                )
        else:
            local = _best(mix, name="treadle") if mix else None
        add("s3", f"{data}: treadle on S3 / treadle local", t3, local, 0)
    imp = [r for r in results if r.case == "import_ray"]
    if imp:
        add(
            "import",
            "import: Ray x2 local workers / one process",
            _best(imp, name="ray"),
            _best(imp, name="one process"),
            0,
        )
    for r in results:
        if r.case == "plan" and r.runs:
            ms = statistics.median(x.wall_s for x in r.runs) * 1e3
            c = r.config
            build = c["what"].startswith("build")
            need = 1000.0 if build else 1.0
            out.append(
                {
                    "goal": "plan",
                    "what": f"{c['what']}: {c['components']} comps, B={c['batch']}, W={c['world']}",
                    "ms": ms,
                    "need": need,
                    "holds": ms < need if c["what"] != "resume" else None,
                }
            )
    return out


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def print_table(results: list[Result], summary: list[dict[str, Any]]) -> None:
    head = f"{'case':<6} {'reader':<58} {'unit':<10} {'wall rate':>11} {'per CPU-s':>11} {'CPU/wall':>8} {'start s':>7}"
    print("\n" + head)
    print("-" * len(head))
    for r in results:
        if r.case == "plan":
            continue
        desc = r.config.get("label", r.name)
        if "size" in r.config:
            desc = f"[{r.config['size']}] {desc}"
        elif "data" in r.config and r.case == "s3":
            desc = f"[{r.config['data']}] {desc}"
        if r.case == "mix" and "workers" in r.config:
            desc = f"{desc}, w={r.config['workers']}"
        if r.status != "ok" or not r.runs:
            print(f"{r.case:<6} {desc[:58]:<58} {r.unit:<10} {r.status[:40]:>11}")
            continue
        cpw = statistics.median(x.cpu_s / x.wall_s for x in r.runs if x.wall_s > 0)
        st = statistics.median(x.startup_s for x in r.runs)
        print(
            f"{r.case:<6} {desc[:58]:<58} {r.unit:<10} {fmt_rate(r.rate):>11} "
            f"{fmt_rate(r.cpu_rate):>11} {cpw:>8.2f} {st:>7.2f}"
        )
    print("\nratios and goals (median wall rates; CPU ratio in brackets)")
    for s in summary:
        if "ms" in s:
            print(f"  plan   {s['what']:<52} {s['ms']:8.3f} ms  (goal < {s['need']} ms)")
            continue
        if s["ratio"] is None:
            print(f"  {s['goal']:<6} {s['what']:<52}        -   (not measured)")
            continue
        cpu = f"[{s['cpu_ratio']:.2f}]" if s.get("cpu_ratio") else ""
        need = f"goal >= {s['need']}" if s["need"] else ""
        mark = "" if not s["need"] else ("holds" if s["holds"] else "MISSES")
        print(f"  {s['goal']:<6} {s['what']:<52} {s['ratio']:8.2f}x {cpu:<7} {need} {mark}")


def markdown(doc: dict[str, Any], results: list[Result], summary: list[dict[str, Any]]) -> str:
    """The table and the ratios as Markdown (for the README and ``bench/results/latest.md``)."""
    m = doc["machine"]
    v = {k: x for k, x in m.get("versions", {}).items() if x}
    lines = [
        f"# treadle bench ({'tiny' if doc['tiny'] else 'full'} run, {doc['stamp']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('mem_gib', '?')} GiB, "
        f"Python {m['python']}, load average at start {m.get('load_avg')} (shared machine); "
        + ", ".join(f"{k} {x}" for k, x in v.items())
        + f". Median of {doc['runs']} interleaved rounds; wall rates exclude start-up (time to "
        "the first batch); CPU counts the whole process tree (workers; for S3 also the server).",
        "",
        "| case | reader | unit | wall rate | per CPU-s | CPU/wall | start s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.case == "plan":
            continue
        desc = r.config.get("label", r.name)
        if "size" in r.config:
            desc = f"[{r.config['size']}] {desc}"
        elif "data" in r.config:
            desc = f"[{r.config['data']}] {desc}"
        if r.case == "mix" and "workers" in r.config:
            desc += f", workers={r.config['workers']}"
        if r.status != "ok" or not r.runs:
            lines.append(f"| {r.case} | {desc} | {r.unit} | {r.status} | | | |")
            continue
        cpw = statistics.median(x.cpu_s / x.wall_s for x in r.runs if x.wall_s > 0)
        st = statistics.median(x.startup_s for x in r.runs)
        lines.append(
            f"| {r.case} | {desc} | {r.unit} | {fmt_rate(r.rate)} | {fmt_rate(r.cpu_rate)} "
            f"| {cpw:.2f} | {st:.2f} |"
        )
    lines += ["", "| goal | comparison | wall ratio | CPU ratio | need | holds |"]
    lines += ["|---|---|---:|---:|---:|---|"]
    for s in summary:
        if "ms" in s:
            held = {True: "yes", False: "no", None: ""}[s["holds"]]
            lines.append(f"| plan | {s['what']} | {s['ms']:.3f} ms | | < 1 ms | {held} |")
        elif s["ratio"] is None:
            lines.append(f"| {s['goal']} | {s['what']} | - | | | not measured |")
        else:
            cpu = f"{s['cpu_ratio']:.2f}" if s.get("cpu_ratio") else ""
            need = f">= {s['need']}" if s["need"] else ""
            held = {True: "yes", False: "no", None: ""}[s["holds"]]
            lines.append(
                f"| {s['goal']} | {s['what']} | {s['ratio']:.2f}x | {cpu} | {need} | {held} |"
            )
    if doc.get("chart"):
        lines += ["", f"![chart]({doc['chart']})"]
    return "\n".join(lines) + "\n"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        info["load_avg"] = os.getloadavg()
    except OSError:
        pass
    versions = {}
    for mod in (
        "treadle",
        "torch",
        "lance",
        "av",
        "obstore",
        "numpy",
        "streaming",
        "webdataset",
        "datasets",
        "lerobot",
        "torchcodec",
        "spdl",
    ):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", "?")
        except Exception:
            versions[mod] = None
    info["versions"] = versions
    return info


def chart(results: list[Result], path: Path) -> str:
    """A PNG of the rates per case; '' when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.case != "plan" and r.rate and r.status == "ok":
            key = (
                r.case
                if r.case == "mix"
                else f"{r.case} {r.config.get('size') or r.config.get('data')}"
            )
            groups.setdefault(key, []).append(r)
    if not groups:
        return "nothing to chart"
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(10, 2.2 + 0.35 * sum(len(g) for g in groups.values()))
    )
    axes = [axes] if len(groups) == 1 else list(axes)
    for ax, (key, rs) in zip(axes, groups.items()):
        labels = []
        for r in rs:
            lab = r.config.get("label", r.name)
            if "workers" in r.config and r.case == "mix":
                lab += f", w={r.config['workers']}"
            labels.append(lab.replace("PyAV sequential decode, 1 thread", "PyAV 1 thread")[:60])
        colours = [
            {"treadle": "tab:blue", "limit": "tab:gray", "decode": "silver"}.get(
                r.name, "tab:orange"
            )
            for r in rs
        ]
        ax.barh(range(len(rs)), [r.rate for r in rs], color=colours)
        ax.set_yticks(range(len(rs)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")  # limits are often 10-100x the loaders: keep every bar visible
        ax.set_xlim(left=min(r.rate for r in rs) / 4, right=max(r.rate for r in rs) * 3)
        for i, r in enumerate(rs):
            ax.text(r.rate, i, f" {r.rate:,.0f}", va="center", fontsize=6)
        ax.set_title(f"{key} ({rs[0].unit}, median wall, log scale)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def redraw(path: Path) -> int:
    """Rebuild the PNG and Markdown of a results JSON (e.g. after changing the chart)."""
    doc = json.loads(path.read_text())
    results = []
    for d in doc["results"]:
        r = Result(d["case"], d["name"], d["config"], d["unit"], note=d["note"])
        r.status, r.extra = d["status"], d["extra"]
        r.runs = [Run(**x) for x in d["runs"]]
        results.append(r)
    note = chart(results, path.with_suffix(".png"))
    doc["chart"] = None if note else path.with_suffix(".png").name
    path.write_text(json.dumps(doc, indent=1, default=str))
    md = markdown(doc, results, doc["summary"])
    (path.parent / ("latest-tiny.md" if doc["tiny"] else "latest.md")).write_text(md)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="treadle bench", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tiny", "--quick", action="store_true", help="small sizes, 1 round, few configs"
    )
    ap.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated of {','.join(CASES + OPT_IN)} (default {','.join(CASES)})",
    )
    ap.add_argument("--runs", type=int, default=None, help="rounds (default 3, --tiny 1)")
    ap.add_argument("--out", default=str(HERE / "results"), help="folder for JSON and PNG")
    ap.add_argument("--redraw", metavar="JSON", help="only redraw the chart and table of a run")
    args = ap.parse_args(argv)
    if args.redraw:
        return redraw(Path(args.redraw))
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in RUNNERS]
    if bad:
        ap.error(f"unknown case(s) {bad}; choose from {list(CASES + OPT_IN)}")
    runs = args.runs or (1 if args.tiny else 3)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = machine()
    log(f"treadle bench: {info.get('cpu', '?')}, {info['cpus']} CPUs, load {info.get('load_avg')}")
    results: list[Result] = []
    for c in cases:
        log(f"== {c}")
        t = time.perf_counter()
        results += RUNNERS[c](args.tiny, runs)
        log(f"   {c} took {time.perf_counter() - t:.1f} s")
    summary = summarise(results)
    print_table(results, summary)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{'tiny' if args.tiny else 'full'}-{stamp}"
    doc = {
        "version": 1,
        "tiny": args.tiny,
        "runs": runs,
        "cases": cases,
        "machine": info,
        "elapsed_s": time.perf_counter() - t0,
        "goals": GOALS,
        "results": [r.to_dict() for r in results],
        "summary": summary,
    }
    doc["stamp"] = stamp
    note = chart(results, out / f"{name}.png")
    doc["chart"] = None if note else f"{name}.png"
    if note:
        log(f"chart: {note}")
    text = json.dumps(doc, indent=1, default=str)
    (out / f"{name}.json").write_text(text)
    (out / ("latest-tiny.json" if args.tiny else "latest.json")).write_text(text)
    md = markdown(doc, results, summary)
    (out / ("latest-tiny.md" if args.tiny else "latest.md")).write_text(md)
    log(f"\nwrote {out / (name + '.json')}" + ("" if note else f" and {name}.png"))
    log(f"elapsed {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The judgement of a bench run: issue 17's goals as ratio and time rows, and the reports.

``summarise`` turns a run's :class:`benchlib.Result` list into goal rows, each either a
ratio (``ratio`` = numerator's median wall rate / denominator's, held when ``>= need``) or
a time (``value`` in ``unit``, held when ``<= need``); ``need`` 0 means reported, not
judged (``holds`` None). ``markdown`` renders one run (machine, load at start and end,
every row, the goal table, the chart), ``compare`` two runs' goal tables side by side (the
second run's ratio beside the first's shows the noise), ``readme_block`` the README's part.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchlib import Result

GOALS = {
    "video": "1: treadle workers=0 threads=1 >= 0.9x single-thread PyAV decode + a reused "
    "VideoReformatter to rgb24 of exactly the frames needed; 2: treadle at 2 cores "
    "(threads=2, and the best 2-core config) >= 0.85x decode-only of the frames needed x 2 "
    "processes; both at 90x224x224 and 16x640x480",
    "peers": "4: treadle / torchcodec and / SPDL at 1 and 2 threads (same bytes, frames "
    "checked equal), / LeRobotDataset at workers 0 and 2 (reported)",
    "mix": "2: treadle >= 3x the best mixing peer at workers=0 and at workers=2; best treadle "
    ">= 0.25x the numpy gather limit",
    "s3": "3: video on S3 >= 0.9x min(raw range GETs, decode limit x 2 processes) per size; "
    "mix on S3 >= 0.95x raw range GETs",
    "cloud": "issue 33, 4: on S3 behind 30 ms of latency per request, best treadle >= 0.9x "
    "the best of the same loaders on local disk, mix and each video size (requests and "
    "bytes per batch in the S3 rows' labels)",
    "start": "5: workers=2 start-up (spawn + plan rebuild) <= 1 s; first batch of the "
    "90-frame video recipe <= 0.5 s",
    "plan": "< 1 ms per batch at any step, < 1 s to build 16 components",
    "import_ray": "reported: Ray with 2 local workers / one process (same cores)",
    "contents": "issue 33, 3: per content (bench, panned random texture, real clip), "
    "treadle threads=1 >= 0.97x and threads=2 >= 0.95x the single-thread decode + rgb24 "
    "(one reused swscale context) rate of exactly the frames needed x cores",
    "augment": "reported: samples/s with the shipped augmentations / without",
    "cold": "issue 33 goal 2: first batch of the first workers=2 loader in a fresh process "
    "<= 1 s, median of 5 fresh processes, mix and video",
    "images": "issue 44, 2: per window kind, treadle workers=0 threads=1 >= 0.95x Pillow's "
    "decode of exactly the needed images (the limit, 1 core), threads=2 and workers=2 >= 0.9x "
    "the limit x2 cores; on S3 +30 ms >= 0.9x local; the peers (WebDataset, HF, MDS) reported",
    "memory": "issue 33 goal 1: peak RSS growth from 10k to 1M episodes <= 64 MiB per process "
    "(the training process and each worker; workers 0 and 2; rows and video)",
}
NO_RATE = ("plan", "cold", "memory")  # judged as times or bytes: not in the rate table
MIXING_PEERS = ("mds", "wds", "hf")


def best(results: list[Result], **match: Any) -> Result | None:
    """The measured result of highest median wall rate whose name/config match ``match``."""
    cands = [
        r
        for r in results
        if r.rate
        and r.status == "ok"
        and all((r.name == v if k == "name" else r.config.get(k) == v) for k, v in match.items())
    ]
    return max(cands, key=lambda r: r.rate) if cands else None


def _label(x: Result) -> str:
    return f"{x.name} {x.config.get('label', '')}".strip()


def ratio_row(goal: str, what: str, num: Any, den: Any, need: float) -> dict[str, Any]:
    """``num``/``den``: a Result, or (label, rate, cpu rate), or None (not measured)."""
    if num is None or den is None:
        return {"goal": goal, "what": what, "ratio": None, "need": need, "holds": None}
    (nl, nr, nc), (dl, dr, dc) = [
        (_label(x), x.rate, x.cpu_rate) if isinstance(x, Result) else x for x in (num, den)
    ]
    ratio = nr / dr
    return {
        "goal": goal,
        "what": what,
        "numerator": nl,
        "denominator": dl,
        "ratio": ratio,
        "cpu_ratio": (nc / dc) if nc and dc else None,
        "need": need,
        "holds": (ratio >= need) if need else None,
    }


def time_row(goal: str, what: str, value: float | None, unit: str, need: float) -> dict[str, Any]:
    """A time that must be at most ``need`` (``need`` 0: reported)."""
    holds = None if value is None or not need else value <= need
    return {"goal": goal, "what": what, "value": value, "unit": unit, "need": need, "holds": holds}


def _startup(r: Result | None) -> float | None:
    return statistics.median(x.startup_s for x in r.runs) if r and r.runs else None


def _mix(mix: list[Result]) -> list[dict[str, Any]]:
    peers = [r for r in mix if r.name in MIXING_PEERS]
    out = [
        ratio_row(
            "mix",
            f"treadle / best mixing peer, workers={w}",
            best(mix, name="treadle", workers=w),
            best(peers, workers=w),
            3.0,
        )
        for w in (0, 2)
    ]
    top = best(peers)
    out.append(
        ratio_row("mix", "best treadle / best mixing peer", best(mix, name="treadle"), top, 0)
    )
    lim = best(mix, name="limit")
    out.append(
        ratio_row("mix", "best treadle / numpy gather limit", best(mix, name="treadle"), lim, 0.25)
    )
    return out


def _rate(r: Result | None) -> float:
    return (r.rate or 0.0) if r is not None else -1.0


def _video(vid: list[Result], size: str) -> list[dict[str, Any]]:
    def t(**kw: Any) -> Result | None:
        return best(vid, name="treadle", size=size, **kw)

    lim2 = best(vid, name="limit", size=size, cores=2)
    return [
        ratio_row("video", f"{size}: treadle workers=0 threads=1 / decode+convert limit, 1 core",
                  t(workers=0, threads=1), best(vid, name="limit_rgb", size=size, cores=1), 0.9),
        ratio_row("video", f"{size}: treadle workers=0 threads=2 / decode-only limit x2 proc",
                  t(workers=0, threads=2), lim2, 0.85),
        ratio_row("video", f"{size}: best treadle at 2 cores / decode-only limit x2 proc",
                  t(cores=2), lim2, 0.85),
    ]  # fmt: skip


def _peers(vid: list[Result], size: str) -> list[dict[str, Any]]:
    out = []
    for threads in (1, 2):
        tr = best(vid, name="treadle", size=size, workers=0, threads=threads)
        for peer, what in (("torchcodec", "torchcodec"), ("spdl", "SPDL")):
            den = best(vid, name=peer, size=size, threads=threads)
            out.append(
                ratio_row("peers", f"{size}: treadle / {what}, threads={threads}", tr, den, 0)
            )
    for codec in sorted({r.config.get("codec") or "" for r in vid if r.name == "lerobot"}):
        for w in (0, 2):
            den = best(vid, name="lerobot", size=size, codec=codec or None, workers=w)
            tr = best(vid, name="treadle", size=size, cores=max(1, w))
            what = f"{size}: best treadle at {max(1, w)} core(s) / LeRobotDataset{' ' + codec if codec else ''}, workers={w}"
            out.append(ratio_row("peers", what, tr, den, 0))
    return out


def _s3(s3: list[Result], vid: list[Result], mix: list[Result]) -> list[dict[str, Any]]:
    out = []
    for data in sorted({r.config["data"] for r in s3 if "data" in r.config}):
        t3, raw = best(s3, name="treadle", data=data), best(s3, name="limit", data=data)
        if not data.startswith("video"):
            out.append(ratio_row("s3", f"{data}: treadle on S3 / raw range GETs", t3, raw, 0.95))
            out.append(ratio_row("s3", f"{data}: treadle on S3 / treadle local", t3,
                                 best(mix, name="treadle"), 0))  # fmt: skip
            continue
        size = data.split(" ", 1)[1]
        dec = best(vid, name="limit", size=size, cores=2)
        both = min((raw, dec), key=_rate) if raw is not None and dec is not None else None
        if both is not None:
            both = (f"min: {_label(both)}", both.rate, both.cpu_rate)
        out += [
            ratio_row("s3", f"{data}: treadle on S3 / min(GETs, decode limit x2 proc)", t3, both, 0.9),
            ratio_row("s3", f"{data}: treadle on S3 / raw range GETs", t3, raw, 0),
            ratio_row("s3", f"{data}: treadle on S3 / treadle local", t3,
                      best(vid, name="treadle", size=size), 0),
        ]  # fmt: skip
    return out


def _cloud(cloud: list[Result]) -> list[dict[str, Any]]:
    """Per data set: best on S3 +30 ms / best local (judged), and each configuration's."""
    out = []
    for data in sorted({r.config["data"] for r in cloud if "data" in r.config}):
        s3 = best(cloud, name="treadle", data=data, where="s3")
        local = best(cloud, name="treadle", data=data, where="local")
        out.append(ratio_row("cloud", f"{data}: best on S3 +30 ms / best local", s3, local, 0.9))
        lim = best(cloud, name="limit", data=data)
        out.append(ratio_row("cloud", f"{data}: best on S3 +30 ms / raw GETs +30 ms", s3, lim, 0))
        for r in cloud:
            c = r.config
            if r.name == "treadle" and c.get("data") == data and c.get("where") == "s3":
                keys = {k: v for k, v in c.items() if k in ("workers", "threads")}
                what = f"{data}: on S3 +30 ms / local, " + " ".join(
                    f"{k}={v}" for k, v in keys.items()
                )
                out.append(ratio_row("cloud", what, r if r.rate else None,
                                     best(cloud, name="treadle", data=data, where="local",
                                          **keys), 0))  # fmt: skip
    return out


def _contents(res: list[Result]) -> list[dict[str, Any]]:
    out = []
    for content in sorted({r.config["content"] for r in res if "content" in r.config}):
        lim = best(res, name="limit_rgb", content=content)
        for threads, need in ((1, 0.97), (2, 0.95)):
            t = best(res, name="treadle", content=content, threads=threads)
            den = lim and (f"{_label(lim)} x{threads}", lim.rate * threads, lim.cpu_rate)
            what = f"{content}: treadle threads={threads} / decode+convert limit x{threads} cores"
            out.append(ratio_row("contents", what, t, den, need))
        par = best(res, name="limit_rgb_procs", content=content)
        if par is not None:  # how far the limit itself scales to 2 cores (reported)
            den = lim and (f"{_label(lim)} x2", lim.rate * 2, lim.cpu_rate)
            what = f"{content}: limit in 2 processes at once / limit x2 cores"
            out.append(ratio_row("contents", what, par, den, 0))
            t = best(res, name="treadle", content=content, threads=2)
            what = f"{content}: treadle threads=2 / limit in 2 processes at once"
            out.append(ratio_row("contents", what, t, par, 0))
    return out


def _images(res: list[Result]) -> list[dict[str, Any]]:
    """Issue 44, 2: per window kind, treadle local against the limit x the cores it uses,
    each S3 configuration against its local twin, the best treadle against each peer."""
    out = []
    for kind in sorted({r.config["window"] for r in res if "window" in r.config}):
        lim = best(res, name="limit", window=kind)
        for workers, threads, need in ((0, 1, 0.95), (0, 2, 0.9), (2, 1, 0.9)):
            cores = max(workers, threads)
            den = lim and (f"{_label(lim)} x{cores}", lim.rate * cores, lim.cpu_rate)
            t = best(res, name="treadle", window=kind, workers=workers, threads=threads,
                     where="local")  # fmt: skip
            what = f"{kind}: treadle workers={workers} threads={threads} / limit x{cores} cores"
            out.append(ratio_row("images", what, t, den, need))
            s3 = best(res, name="treadle", window=kind, workers=workers, threads=threads,
                      where="s3")  # fmt: skip
            if s3 is not None:
                what = f"{kind}: on S3 +30 ms / local, workers={workers} threads={threads}"
                out.append(ratio_row("images", what, s3, t, 0.9))
        peers = sorted({r.name for r in res if r.name not in ("treadle", "limit")
                        and r.config.get("window") == kind})  # fmt: skip
        for peer in peers:
            for w in (0, 2):
                tr = best(res, name="treadle", window=kind, workers=w, where="local")
                what = f"{kind}: best treadle at workers={w} / {peer}, workers={w}"
                out.append(ratio_row("images", what, tr,
                                     best(res, name=peer, window=kind, workers=w), 0))  # fmt: skip
    return out


def _start(mix: list[Result], vid: list[Result]) -> list[dict[str, Any]]:
    out = []
    if mix:
        r = best(mix, name="treadle", workers=2)
        out.append(time_row("start", "mix: workers=2 start-up", _startup(r), "s", 1.0))
    sizes = sorted(
        {r.config["size"] for r in vid if "size" in r.config}, key=lambda s: -int(s.split("x")[0])
    )
    for size in sizes:
        r = best(vid, name="treadle", size=size, workers=2)
        out.append(time_row("start", f"video {size}: workers=2 start-up", _startup(r), "s", 1.0))
    if sizes:  # the longest window: 90 frames in a full run
        ts = [_startup(r) for r in vid if r.name == "treadle" and r.config.get("size") == sizes[0]
              and r.config.get("workers") == 0 and r.status == "ok" and r.runs]  # fmt: skip
        what = f"video {sizes[0]}: first batch, workers=0 (slowest thread count)"
        out.append(time_row("start", what, max(ts) if ts else None, "s", 0.5))
    return out


def _plan(results: list[Result]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        if r.case == "plan" and r.runs:
            c = r.config
            ms = statistics.median(x.wall_s for x in r.runs) * 1e3
            need = 0 if c["what"] == "resume" else 1000.0 if c["what"].startswith("build") else 1.0
            if c["what"].endswith("x3 stages"):
                need = 2000.0  # issue 28: a 3-stage schedule within 2x the 1 s build
            what = f"{c['what']}: {c['components']} comps, B={c['batch']}, W={c['world']}"
            out.append(time_row("plan", what, ms, "ms", need))
    return out


def _cold(results: list[Result]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        if r.case == "cold" and r.runs:
            n, recipe = len(r.runs), r.config.get("recipe")
            out.append(time_row("cold", f"{recipe}: first batch of the first workers=2 loader, "
                                f"fresh process (median of {n})", _startup(r), "s", 1.0))  # fmt: skip
            cpu = statistics.median(x.cpu_s for x in r.runs)
            out.append(time_row("cold", f"{recipe}: CPU of the worker server (median of {n})",
                                cpu, "s", 0))  # fmt: skip
    return out


def _memory(results: list[Result]) -> list[dict[str, Any]]:
    """One row per (data, workers, process): peak RSS growth from the fewest episodes to the
    most (<= 64 MiB), and the peak at the most (reported)."""
    out = []
    for r in results:
        if r.case != "memory" or r.status != "ok":
            continue
        c, peaks = r.config, r.extra["peak_mib"]  # {episodes: MiB}
        lo, hi = min(peaks, key=int), max(peaks, key=int)
        what = f"{c['data']}, workers={c['workers']}, {c['process']}"
        span = f"{int(lo):,} -> {int(hi):,} episodes"
        out.append(time_row("memory", f"{what}: peak RSS growth {span}",
                            peaks[hi] - peaks[lo], "MiB", 64.0))  # fmt: skip
        top = max(peaks, key=lambda k: peaks[k])
        if top not in (lo, hi):  # e.g. a column small enough to keep resident at 100k only
            out.append(time_row("memory", f"{what}: largest peak RSS growth over "
                                f"{int(lo):,} episodes, at {int(top):,}",
                                peaks[top] - peaks[lo], "MiB", 0))  # fmt: skip
        out.append(time_row("memory", f"{what}: peak RSS at {int(hi):,} episodes", peaks[hi],
                            "MiB", 0))  # fmt: skip
    return out


def summarise(results: list[Result]) -> list[dict[str, Any]]:
    """Every goal row of a run (see the module docstring), in the order of ``GOALS``."""
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.case, []).append(r)
    mix, vid, s3 = by.get("mix", []), by.get("video", []), by.get("s3", [])
    sizes = sorted({r.config["size"] for r in vid if "size" in r.config})
    out = [row for size in sizes for row in _video(vid, size)]
    out += [row for size in sizes for row in _peers(vid, size)]
    out += _mix(mix) if mix else []
    out += _s3(s3, vid, mix)
    out += _cloud(by.get("cloud", []))
    out += _start(mix, vid)
    out += _plan(results)
    out += _cold(results)
    out += _memory(results)
    if "import_ray" in by:
        imp = by["import_ray"]
        out.append(ratio_row("import_ray", "Ray x2 local workers / one process",
                             best(imp, name="ray"), best(imp, name="one process"), 0))  # fmt: skip
    out += _contents(by.get("contents", []))
    out += _images(by.get("images", []))
    aug = by.get("augment", [])
    for size in sorted({r.config["size"] for r in aug if "size" in r.config}):
        out.append(ratio_row("augment", f"{size}: augmented / plain",
                             best(aug, name="augmented", size=size),
                             best(aug, name="plain", size=size), 0))  # fmt: skip
    return out


# -- rendering -----------------------------------------------------------------------------
def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def describe(r: Result) -> str:
    """A result's row name: its label, with the size or data set and mix workers."""
    desc = r.config.get("label", r.name)
    if "content" in r.config:
        desc = f"[{r.config['content']}] {desc}"
    elif "size" in r.config:
        desc = f"[{r.config['size']}] {desc}"
    elif "data" in r.config and r.case in ("s3", "cloud"):
        desc = f"[{r.config['data']}] {desc}"
    if r.case == "mix" and "workers" in r.config:
        desc += f", workers={r.config['workers']}"
    return desc


def cells(r: Result) -> list[str]:
    """wall rate, per CPU-s, CPU/wall, start s of a result (or its status)."""
    if r.status != "ok" or not r.runs:
        return [r.status, "", "", ""]
    cpw = statistics.median(x.cpu_s / x.wall_s for x in r.runs if x.wall_s > 0)
    return [fmt_rate(r.rate), fmt_rate(r.cpu_rate), f"{cpw:.2f}", f"{_startup(r):.2f}"]


def goal_cells(s: dict[str, Any]) -> tuple[str, str, str, str]:
    """(value, CPU ratio, need, holds) of a goal row as text."""
    held = {True: "yes", False: "NO", None: ""}[s["holds"]]
    if "unit" in s:
        val = "-" if s["value"] is None else f"{s['value']:.3f} {s['unit']}"
        need = f"<= {s['need']:g} {s['unit']}" if s["need"] else ""
    else:
        val = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x"
        need = f">= {s['need']:g}" if s["need"] else ""
    if val == "-":
        held = "not measured"
    cpu = f"{s['cpu_ratio']:.2f}" if s.get("cpu_ratio") else ""
    return val, cpu, need, held


def print_table(results: list[Result], summary: list[dict[str, Any]]) -> None:
    head = f"{'case':<6} {'reader':<62} {'unit':<10} {'wall rate':>11} {'per CPU-s':>11} {'CPU/wall':>8} {'start s':>7}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in results:
        if r.case not in NO_RATE:
            c = cells(r)
            print(
                f"{r.case:<6} {describe(r)[:62]:<62} {r.unit:<10} {c[0][:40]:>11} {c[1]:>11} {c[2]:>8} {c[3]:>7}"
            )
    print("\nratios and goals (median wall rates; CPU ratio in brackets)")
    for s in summary:
        val, cpu, need, held = goal_cells(s)
        cpu = f"[{cpu}]" if cpu else ""
        print(f"  {s['goal']:<6} {s['what'][:70]:<70} {val:>10} {cpu:<7} {need:<12} {held}")


def _goal_table(summary: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| goal | comparison | value | CPU ratio | need | holds |",
        "|---|---|---:|---:|---:|---|",
    ]
    for s in summary:
        val, cpu, need, held = goal_cells(s)
        lines.append(f"| {s['goal']} | {s['what']} | {val} | {cpu} | {need} | {held} |")
    return lines


def _machine_line(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    v = ", ".join(f"{k} {x}" for k, x in m.get("versions", {}).items() if x)
    load = lambda x: "?" if not x else " / ".join(f"{a:.2f}" for a in x)  # noqa: E731
    return (
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('mem_gib', '?')} GiB, Python "
        f"{m['python']}; load average (1/5/15 min) at start {load(m.get('load_avg'))}, at end "
        f"{load(doc.get('load_end'))}; {v}."
    )


def markdown(doc: dict[str, Any], results: list[Result], summary: list[dict[str, Any]]) -> str:
    """One run as Markdown (``bench/results/latest.md``): machine, every row, goals, chart."""
    lines = [
        f"# treadle bench ({'tiny' if doc['tiny'] else 'full'} run, {doc['stamp']})",
        "",
        _machine_line(doc)
        + f" Median of {doc['runs']} interleaved rounds; wall rates exclude start-up (time to "
        "the first batch) and, for video, the next warm-up batches (the same for every "
        "reader); CPU counts the whole process tree (workers; for S3 also the server).",
        "",
        "| case | reader | unit | wall rate | per CPU-s | CPU/wall | start s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.case not in NO_RATE:
            lines.append(f"| {r.case} | {describe(r)} | {r.unit} | " + " | ".join(cells(r)) + " |")
    lines += ["", *_goal_table(summary)]
    if doc.get("chart"):
        lines += ["", f"![chart]({doc['chart']})"]
    return "\n".join(lines) + "\n"


def readme_block(doc: dict[str, Any], summary: list[dict[str, Any]], results_dir: str) -> str:
    """The README's bench part: which run, the judged goal rows and the peer ratios, the
    chart (``latest.png``)."""
    head = (
        f"Last committed {'tiny' if doc['tiny'] else 'full'} run ({doc['stamp']}, median of "
        f"{doc['runs']} rounds; [every row and the machine]({results_dir}/latest.md)). "
        + _machine_line(doc)
    )
    shown = [s for s in summary if s["need"] or s["goal"] == "peers"]  # judged, and the peers
    return "\n".join(
        [head, "", *_goal_table(shown), "", f"![bench chart]({results_dir}/latest.png)"]
    )


def compare(a: tuple[dict, list[dict]], b: tuple[dict, list[dict]]) -> str:
    """Two runs' goal tables as one: the second run's value beside the first's (the noise)."""
    (da, sa), (db, sb) = a, b
    lines = [
        f"# treadle bench: run A {da['stamp']} beside run B {db['stamp']}",
        "",
        f"A: {_machine_line(da)}",
        "",
        f"B: {_machine_line(db)}",
        "",
        "| goal | comparison | need | A | B | B / A | holds A | holds B |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    rows_a = {(s["goal"], s["what"]): s for s in sa}
    rows_b = {(s["goal"], s["what"]): s for s in sb}
    for k in list(rows_a) + [k for k in rows_b if k not in rows_a]:
        x, y = rows_a.get(k), rows_b.get(k)
        va, _, need, ha = goal_cells(x) if x else ("", "", "", "")
        vb, _, need_b, hb = goal_cells(y) if y else ("", "", "", "")
        noise = f"{_number(y) / _number(x):.2f}" if _number(x) and _number(y) else ""
        lines.append(
            f"| {k[0]} | {k[1]} | {need or need_b} | {va} | {vb} | {noise} | {ha} | {hb} |"
        )
    return "\n".join(lines) + "\n"


def _number(s: dict[str, Any] | None) -> float | None:
    """A goal row's ratio or time (None: no row, or not measured)."""
    return None if s is None else s.get("value") if "unit" in s else s.get("ratio")


def chart(results: list[Result], path: Path) -> str:
    """A PNG of the rates per case; '' when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.case not in NO_RATE and r.rate and r.status == "ok":
            sub = (
                ""
                if r.case == "mix"
                else f" {r.config.get('content') or r.config.get('size') or r.config.get('data')}"
            )
            groups.setdefault(r.case + sub, []).append(r)
    if not groups:
        return "nothing to chart"
    rows = sum(len(g) for g in groups.values())
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 2.2 + 0.35 * rows))
    axes = [axes] if len(groups) == 1 else list(axes)
    colour = {"treadle": "tab:blue", "limit": "tab:gray", "limit_rgb": "tab:gray"}
    for ax, (key, rs) in zip(axes, groups.items()):
        labels = [describe(r).split("] ", 1)[-1][:56] for r in rs]
        ax.barh(range(len(rs)), [r.rate for r in rs],
                color=[colour.get(r.name, "silver" if r.name.startswith("decode") else "tab:orange") for r in rs])  # fmt: skip
        ax.set_yticks(range(len(rs)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")  # limits are often 10-100x the loaders: keep every bar visible
        ax.set_xlim(left=min(r.rate for r in rs) / 4, right=max(r.rate for r in rs) * 3)
        for i, r in enumerate(rs):
            ax.text(r.rate, i, f" {r.rate:,.0f}", va="center", fontsize=6)
        ax.set_title(f"{key} ({rs[0].unit}, median wall, log scale)", fontsize=9)
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor log ticks' labels overlap
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""

"""Where the loader's CPU goes beyond the cache, thread by thread.

Issue 48's case (``beyond_cache``'s data, ``BlockShuffle`` with a lookahead, the chunk cache
bounded to 1/8 of the data files) against SeaweedFS with no proxy, from a cold cache. Each
thread's user and system time is read from ``/proc/self/task`` every 0.1 s (so threads that
end are counted up to their last sample), grouped by name (digits dropped), and printed per
sample delivered, with the voluntary context switches per batch.

    python bench/loader_threads.py [--steps 1000] [--runs 1] [--lookahead 16] [--block-rows 512]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import beyond_cache as bc  # noqa: E402
import case_mix as cm  # noqa: E402
import case_s3 as c3  # noqa: E402
from benchlib import cold_object_cache  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _name_os_threads() -> None:
    """Give each Python thread its Python name in ``/proc`` (15 bytes, as the kernel keeps)."""
    import ctypes

    libc = ctypes.CDLL(None)
    inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        libc.prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        inner(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


def _threads() -> dict[int, tuple[str, float, float, int]]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            base = f"/proc/self/task/{tid}"
            name = Path(f"{base}/comm").read_text().strip()
            f = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()
            ctx = [ln for ln in Path(f"{base}/status").read_text().splitlines()
                   if ln.startswith("voluntary_ctxt_switches")]  # fmt: skip
            out[int(tid)] = (name, int(f[11]) / TICK, int(f[12]) / TICK, int(ctx[0].split()[1]))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return out


class Sampler:
    """The last seen (name, user, system, switches) of every thread, sampled every 0.1 s."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, float, float, int]] = {}
        self.base = _threads()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self.seen.update(_threads())

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.seen.update(_threads())

    def groups(self) -> dict[str, list[float]]:
        g: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for tid, (name, u, s, c) in self.seen.items():
            b = self.base.get(tid, (name, 0.0, 0.0, 0))
            key = re.sub(r"[_-]?\d+(_\d+)?$", "", name)
            g[key][0] += u - b[1]
            g[key][1] += s - b[2]
            g[key][2] += c - b[3]
        return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--block-rows", type=int, default=512)
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--local", action="store_true", help="the same loader on local disk")
    a = ap.parse_args()
    _name_os_threads()
    import treadle as td
    from treadle.testing import SeaweedS3

    root = bc._data(a.rows)
    data = sum(p.stat().st_size for p in (root / "treadle").rglob("*.lance") if p.is_file())
    os.environ["TREADLE_CACHE_BYTES"] = str(data // 8)
    os.environ["TREADLE_CHUNK_CACHE_BYTES"] = str(data // 8)
    block = td.BlockShuffle(block_rows=a.block_rows)
    with SeaweedS3(bucket="bench") as s3:
        c3.upload(s3, root / "treadle", "mix")
        for r in range(a.runs):
            with cold_object_cache(), Sampler() as sm:
                t0 = time.perf_counter()
                wall, n, _ = (bc.run(root, None, a.steps, block) if a.local else
                              bc.run(root, s3, a.steps, block, a.lookahead))  # fmt: skip
                total = time.perf_counter() - t0
            batches = n / cm.BATCH
            print(f"run {r}: {n / wall:,.0f} samples/s ({total:.1f} s in all)")
            rows = sorted(sm.groups().items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
            all_cpu = 0.0
            for name, (u, s, c) in rows:
                all_cpu += u + s
                if u + s < 1e-9:
                    continue
                print(f"  {name:<28} user {u / n * 1e6:6.1f} us  sys {s / n * 1e6:6.1f} us "
                      f"a sample; {c / batches:6.1f} switches a batch")  # fmt: skip
            print(f"  {'process':<28} {all_cpu / n * 1e6:6.1f} us a sample (first batch included)")


if __name__ == "__main__":
    main()

"""Shared helpers of the benchmark suite: timing (wall + CPU of the whole process tree),
medians, result records.

CPU time counts this process *and* every live descendant (spawned DataLoader workers, the
S3 server is not a descendant of the measured loop's process tree unless started by it), read
from ``/proc`` at the start and the end of the measured loop, while the workers are alive.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _stat_cpu(path: str, fields_used: slice) -> float:
    """CPU seconds of a ``/proc`` ``stat`` file: the sum of the clock-tick fields
    ``fields_used`` (counted after the command name); 0.0 where it cannot be read."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return sum(int(x) for x in fields[fields_used]) / _TICK


def _proc_cpu(pid: int) -> float:
    # utime + stime + cutime + cstime: a descendant that exited and was reaped (a worker
    # forked from the forkserver) keeps counting, in its parent
    return _stat_cpu(f"/proc/{pid}/stat", slice(11, 15))


def _self_cpu() -> float:
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def thread_cpu(native_id: int) -> float:
    """CPU seconds used so far by one thread of this process (Linux; 0.0 elsewhere)."""
    return _stat_cpu(f"/proc/self/task/{native_id}/stat", slice(11, 13))  # utime + stime


def tree_cpu(pid: int | None = None, exclude: Iterable[int] = ()) -> float:
    """CPU seconds used so far by ``pid`` (default: this process) and its descendants, live
    ones and those that exited and were waited for."""
    skip = set(exclude)
    root = os.getpid() if pid is None else pid
    if root == os.getpid() and not os.path.exists("/proc/self/stat"):
        return time.process_time()
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        if p in skip:
            continue
        total += _self_cpu() if p == os.getpid() else _proc_cpu(p)
        todo += _children(p)
    return total


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    samples: int
    startup_s: float = 0.0  # from construction to the first item (not in wall_s)


@dataclass
class Result:
    case: str
    name: str  # e.g. "treadle", "mds", "limit"
    config: dict[str, Any]
    unit: str  # "samples/s", "frames/s", "MB/s"
    runs: list[Run] = field(default_factory=list)
    note: str = ""
    status: str = "ok"  # ok | not installed | failed: ...
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        """Median items per wall second."""
        if not self.runs:
            return None
        return statistics.median(r.samples / r.wall_s for r in self.runs if r.wall_s > 0)

    @property
    def cpu_rate(self) -> float | None:
        """Median items per CPU second (whole process tree)."""
        vals = [r.samples / r.cpu_s for r in self.runs if r.cpu_s > 0]
        return statistics.median(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_rate"] = self.rate
        d["median_cpu_rate"] = self.cpu_rate
        d["median_wall_s"] = statistics.median(r.wall_s for r in self.runs) if self.runs else None
        d["median_cpu_s"] = statistics.median(r.cpu_s for r in self.runs) if self.runs else None
        return d


def measure(
    make: Callable[[], Iterator[Any]],
    n_items: int,
    count: Callable[[Any], int],
    warmup: int = 0,
) -> Run:
    """Time ``n_items`` items of a fresh iterator, after its first item (start-up) and
    ``warmup`` more items (excluded from both the rate and the start-up time).

    ``count(item)`` says how many samples one item (a batch) holds. Timing stops when
    ``n_items`` samples have arrived, while worker processes are still alive.
    """
    t_start = time.perf_counter()
    it = make()
    first = next(it)
    del first
    startup = time.perf_counter() - t_start
    for _ in range(warmup):
        next(it)
    c0, t0 = tree_cpu(), time.perf_counter()
    got = 0
    for item in it:
        got += count(item)
        if got >= n_items:
            break
    wall, cpu = time.perf_counter() - t0, tree_cpu() - c0
    for _ in range(40):
        if cpu >= 0:
            break
        # a descendant (a worker) exited and its parent has not waited for it yet: its CPU
        # is in no process of the tree until then (CI measured -0.026 s once)
        time.sleep(0.005)
        cpu = tree_cpu() - c0
    close = getattr(it, "close", None)
    del it
    if close is not None:
        try:
            close()
        except Exception:
            pass
    return Run(wall, cpu, got, startup)


def timed(fn: Callable[[], int]) -> Run:
    """One call of ``fn`` (which returns how many items it produced)."""
    c0, t0 = tree_cpu(), time.perf_counter()
    n = fn()
    return Run(time.perf_counter() - t0, tree_cpu() - c0, n)


def batch_len(batch: Any) -> int:
    """Samples in a batch: a dict of tensors/arrays, a list/tuple of them."""
    if isinstance(batch, dict):
        v = next(iter(batch.values()))
    elif isinstance(batch, list | tuple):
        v = batch[0]
    else:
        v = batch
    return len(v)


@contextmanager
def cold_object_cache() -> Iterator[str]:
    """A fresh, empty treadle object cache (``TREADLE_CACHE_DIR``, see
    ``treadle.storage.filecache``) for one run on an object store, removed after it: every
    run copies the data files it maps (in its start-up) and none finds another's copies."""
    import shutil
    import tempfile

    old = os.environ.get("TREADLE_CACHE_DIR")
    d = tempfile.mkdtemp(prefix="treadle-bench-cache-")
    os.environ["TREADLE_CACHE_DIR"] = d
    try:
        yield d
    finally:
        if old is None:
            os.environ.pop("TREADLE_CACHE_DIR", None)
        else:
            os.environ["TREADLE_CACHE_DIR"] = old
        shutil.rmtree(d, ignore_errors=True)

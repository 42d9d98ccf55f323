"""Processes that must end: no hang in a forked DataLoader worker, no abort at exit.

- A default-context ``DataLoader`` over ``ScanDataset`` (Linux forks, while the start
  method reads as ``None``) fails at once with the documented error instead of hanging.
- A read that fails among many concurrent range reads leaves no task running on the I/O
  loop, and a process that catches the error and exits is not killed (SIGABRT/SIGSEGV) by
  a request completing in a dying interpreter: the siblings' obstore calls are never
  cancelled (a cancelled call's Rust task still takes the GIL, at a moment nobody can
  see); they run to their end, and exit waits for them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import treadle as td
from fault_proxy import FaultProxy
from treadle.storage import RangeRequest, Store
from treadle.storage.loop import _Loop, in_flight, request

HERE = Path(__file__).parent
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))

_SCAN_CHILD = """
import sys
import numpy as np, torch
import treadle as td
branch = td.Client(sys.argv[1], create=True).project("p").branch()
branch.table("t").append({"x": np.arange(64, dtype=np.float32)})
ds = td.ScanDataset(branch.table("t").pin().scan_request(["x"]), batch_size=4)
dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)  # default context
try:
    next(iter(dl))
except RuntimeError as e:
    print("REFUSED" if "spawn" in str(e) else f"OTHER {e}", flush=True)
"""


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the child and its forked workers
        proc.communicate()
        pytest.fail(f"the child process hung (killed after {timeout:.0f} s)")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow
def test_default_context_dataloader_fails_instead_of_hanging(tmp_path):
    got = _run([sys.executable, "-c", _SCAN_CHILD, str(tmp_path / "s")], timeout=120)
    assert got.returncode == 0 and got.stdout.strip() == "REFUSED", (got.stdout, got.stderr[-2000:])


@pytest.fixture(scope="module")
def slow_siblings(s3_server):
    """200 small objects under ``slow/`` whose GETs a proxy holds 0.5 s; ``missing`` is not."""
    root = s3_server.url(f"exit-{time.time_ns()}")
    opts = s3_server.storage_options()
    store = Store.open(root, opts)
    for i in range(200):
        store.put(f"slow/{i}", os.urandom(1000))
    with FaultProxy(
        s3_server.endpoint, rate=1.0, kinds=("delay",), delay_s=0.5, paths="/slow/"
    ) as px:
        yield root, px.options(opts)


def _requests(n: int) -> list[RangeRequest]:
    return [RangeRequest("missing", 0, 10)] + [RangeRequest(f"slow/{i}", 0, 1000) for i in range(n)]


def test_a_failed_read_leaves_nothing_running(slow_siblings):
    root, opts = slow_siblings
    store = Store.open(root, opts)
    with pytest.raises(td.NotFound, match="missing"):
        store.get_ranges(_requests(50))

    async def running() -> list[str]:
        me = asyncio.current_task()
        return [repr(t) for t in asyncio.all_tasks() if t is not me and not t.done()]

    left = asyncio.run_coroutine_threadsafe(running(), _Loop.get()).result(10)
    assert left == [], f"{len(left)} sibling reads still running after the error"
    deadline = time.monotonic() + 60
    while in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight() == 0, "the abandoned calls never ended"


def test_a_cancelled_caller_does_not_cancel_its_call(slow_siblings):
    """The call behind a cancelled wait runs to its end and delivers its bytes."""
    root, opts = slow_siblings
    store = Store.open(root, opts)
    calls: list[asyncio.Future] = []

    async def caller() -> None:
        import obstore

        from treadle.storage import loop

        before = set(loop._IN_FLIGHT)
        wait = asyncio.ensure_future(
            request(obstore.get_range_async(store._inner, "slow/7", start=0, end=10))
        )
        await asyncio.sleep(0)
        calls.extend(loop._IN_FLIGHT - before)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        assert wait.cancelled()
        await asyncio.wait(calls, timeout=30)

    asyncio.run_coroutine_threadsafe(caller(), _Loop.get()).result(60)
    assert len(calls) == 1 and not calls[0].cancelled()
    assert len(bytes(calls[0].result())) == 10


_EXIT_CHILD = """
import json, sys
import treadle as td  # imports torch: a loader process, with its long teardown
from treadle.storage import RangeRequest, Store
reqs = [RangeRequest("missing", 0, 10)] + [RangeRequest(f"slow/{i}", 0, 1000) for i in range(200)]
try:
    Store.open(sys.argv[1], json.loads(sys.argv[2])).get_ranges(reqs)
except td.NotFound:
    print("CAUGHT", flush=True)
"""


@pytest.mark.slow
def test_exit_after_a_failed_read_is_clean(slow_siblings):
    """Probabilistic by nature: before the first fix about 1 exit in 4 died here (-6 or
    -11); with cancelled calls (before they were left to end) about 1 in 50."""
    root, opts = slow_siblings
    args = [sys.executable, "-c", _EXIT_CHILD, root, json.dumps(opts)]
    results = []
    for _ in range(4):  # three at a time: 12 exits
        procs = [
            subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV
            )
            for _ in range(3)
        ]
        for p in procs:
            out, err = p.communicate(timeout=120)
            results.append((p.returncode, out.strip(), err[-500:]))
    bad = [r for r in results if r[0] != 0 or r[1] != "CAUGHT"]
    assert bad == [], bad

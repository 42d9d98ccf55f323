"""An iterator abandoned mid-way and finalized by the garbage collector on treadle's I/O loop
thread stops its readers without a deadlock (issue 49, item 0).

The garbage collector runs a suspended generator's ``finally`` on whichever thread it happens
to run on. Before :mod:`treadle.reaper`, a loader's finalizer joined its reader threads
there; a reader waiting on the I/O loop then waited for the thread that was waiting for it,
and the process hung at 0% CPU. Each case runs in a fresh process with a hang guard: the
iterator is put in a reference cycle, dropped, and collected on the I/O loop thread; then
every reader thread and worker process must be gone and the store must still answer.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading

import numpy as np
import pytest

import treadle as td
from script_helpers import run_script
from treadle import reaper
from treadle.errors import StorageError
from treadle.read import prefetch as prefetch_module
from treadle.storage.loop import _Loop

SCRIPT = textwrap.dedent(
    """
    import asyncio, faulthandler, gc, multiprocessing, sys, threading
    import numpy as np
    import treadle as td
    from treadle import reaper
    from treadle.read.prefetch import ordered_map
    from treadle.storage.loop import _Loop

    faulthandler.dump_traceback_later(60, exit=True)  # a hang prints every stack and fails


    def needs_io(batch, seeds):
        # reader-side work that waits on the I/O loop, as every object-store read does
        _Loop.run(asyncio.sleep(0.001))
        return batch


    def read_object(i):
        _Loop.run(asyncio.sleep(0.005))  # an import's read of a shard or file
        return i


    def abandoned(table, path):
        rows = td.Windows({"action": td.Rows(range(4))})
        video = td.Windows({"cam": td.Video(range(4))})
        windows = video if path.startswith("video") or path == "eval" else rows
        recipe = td.Recipe(seed=1, batch_size=4, components=[td.Component(table, windows)])
        if path == "rows":
            it = iter(td.TrainLoader(recipe, steps=1000, transform=needs_io))
        elif path == "rows-lookahead":
            it = iter(td.TrainLoader(recipe, steps=1000, transform=needs_io, lookahead=4))
        elif path == "video":
            it = iter(td.TrainLoader(recipe, steps=1000, transform=needs_io, video_threads=2))
        elif path == "video-workers":
            it = iter(td.TrainLoader(recipe, steps=1000, workers=2))
        elif path == "eval":
            it = iter(td.EvalLoader(recipe.plan(), transform=needs_io))
        elif path == "scan":
            it = iter(td.ScanDataset(table.scan_request(["cam", "action"]), batch_size=4))
        else:
            it = ordered_map(read_object, range(10_000), threads=4, leave_running=True)
        next(it)
        return it


    def main(root, path):
        table = td.Client(root).project("p").branch().table("cams")
        it = abandoned(table, path)
        cycle = [it]
        cycle.append(cycle)
        del it, cycle

        async def collect():
            return gc.collect()

        asyncio.run_coroutine_threadsafe(collect(), _Loop.get()).result(40)
        assert reaper.drain(40), "the reaper did not finish the abandoned iterator's cleanup"
        gc.collect()
        quiet = {"treadle-io", "treadle-reaper"}
        left = [t for t in threading.enumerate()
                if t.name.startswith("treadle") and t.name not in quiet]
        for t in left:  # told to stop by the cleanup: one may still be on its way out
            t.join(30)
        left = [t.name for t in left if t.is_alive()]
        assert not left, f"reader threads still running: {left}"
        assert not multiprocessing.active_children(), multiprocessing.active_children()
        frames = np.zeros((8, 32, 32, 3), np.uint8)  # the store still answers
        table.append_episode({"cam": td.VideoFrames(frames, fps=30),
                              "action": np.zeros((8, 3), np.float32)}, episode=f"after-{path}")
        print("ok", flush=True)


    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("abandoned") / "store"
    rng = np.random.default_rng(0)
    branch = td.Client(str(root), create=True).project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(3):
            frames = rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8)
            tx.table("cams").append_episode(
                {
                    "cam": td.VideoFrames(frames, fps=30),
                    "action": rng.random((40, 3), dtype=np.float32),
                },
                episode=f"e{e}",
            )
    return str(root)


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", ["rows", "rows-lookahead", "video", "video-workers", "eval", "scan", "import-map"]
)
def test_an_abandoned_iterator_collected_on_the_io_thread_does_not_hang(store, tmp_path, path):
    proc = run_script(tmp_path, SCRIPT, store, path, name="abandon.py", timeout=150)
    assert proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]
    assert "Fatal Python error" not in proc.stderr, proc.stderr[-3000:]


def test_a_store_call_on_the_io_thread_is_a_named_error_not_a_hang():
    async def inner():
        return 1

    async def call_from_the_loop():
        try:
            _Loop.run(inner())
        except StorageError as e:
            return str(e)
        return "no error"

    said = asyncio.run_coroutine_threadsafe(call_from_the_loop(), _Loop.get()).result(10)
    assert "treadle-io" in said and "wait for itself" in said


def test_a_pool_never_joins_its_threads_from_the_io_thread():
    pool = prefetch_module._DaemonPool(2, "treadle-test-pool")
    release = threading.Event()
    pool.submit(lambda _: release.wait(10), None)

    async def shut():
        try:
            pool.shutdown(wait=True)
        except RuntimeError as e:
            return str(e)
        return "joined"

    said = asyncio.run_coroutine_threadsafe(shut(), _Loop.get()).result(10)
    release.set()
    pool.shutdown(wait=True)  # from this thread it may wait
    assert "cannot wait for its threads" in said


def test_the_reaper_runs_cleanups_in_order_and_drain_waits_for_them():
    ran: list[int] = []
    gate = threading.Event()
    reaper.start()
    reaper.reap(gate.wait, 10)
    for i in range(5):
        reaper.reap(ran.append, i)
    assert ran == []  # nothing ran in place
    gate.set()
    assert reaper.drain(10)
    assert ran == [0, 1, 2, 3, 4]


def test_a_failing_cleanup_is_logged_and_the_next_ones_run(caplog):
    def boom() -> None:
        raise ValueError("cleanup failed")

    ran: list[str] = []
    reaper.start()
    with caplog.at_level("WARNING", logger="treadle"):
        reaper.reap(boom)
        reaper.reap(ran.append, "after")
        assert reaper.drain(10)
    assert ran == ["after"]
    assert "cleanup failed" in caplog.text


def test_a_generator_closed_early_hands_its_cleanup_to_the_reaper_in_order():
    """``closing`` runs a cleanup in place at the end, on the reaper when closed early, and
    after the cleanups of the generator it wraps (a reader closed after its pool stopped)."""
    order: list[str] = []
    gate = threading.Event()

    def inner():
        with reaper.closing(order.append, "inner"):
            yield 1
            yield 2

    def outer():
        gen = inner()
        with reaper.closing(order.append, "outer", inner=gen):
            yield from gen

    reaper.start()
    reaper.reap(gate.wait, 10)  # hold the reaper: nothing may run in the closing thread
    g = outer()
    next(g)
    g.close()
    assert order == []
    gate.set()
    assert reaper.drain(10)
    assert order == ["inner", "outer"]
    order.clear()
    assert list(outer()) == [1, 2] and order == ["inner", "outer"]  # at the end: in place


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_gets_its_own_reaper(tmp_path):
    script = """
        import os, sys
        from treadle import reaper
        reaper.start()
        pid = os.fork()
        if pid == 0:
            ran = []
            reaper.start()
            reaper.reap(ran.append, 1)
            ok = reaper.drain(10) and ran == [1]
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """
    proc = run_script(tmp_path, script, name="fork_reaper.py", timeout=60)
    assert "child 0" in proc.stdout

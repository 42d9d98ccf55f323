"""A loader iterated on another thread goes on (or ends silently) once the main thread ends.

When the main thread returns, Python shuts every ``concurrent.futures`` thread pool down
*before* it waits for the non-daemon threads still running: a pool's ``submit`` then raises
"cannot schedule new futures after (interpreter) shutdown". The video decoders' pool was
one: a non-daemon training thread failed with that error at its next batch, and a daemon
thread's printed it as a crash at exit. Decodes now run on the caller's thread then.
"""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from script_helpers import run_script
from treadle.concurrency import submit

SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys, threading, time
    import numpy as np
    import treadle as td

    faulthandler.dump_traceback_later(150, exit=True)
    branch = td.Client(sys.argv[1], create=True).project("p").branch()
    with branch.transaction("video") as tx:
        for e in range(2):
            tx.table("t").append_episode(
                {"action": np.zeros((30, 2), np.float32),
                 "cam": td.VideoFrames(np.zeros((30, 16, 16, 3), np.uint8), fps=30)},
                episode=f"e{e}",
            )
    w = td.Windows({"action": td.Rows(range(2)), "cam": td.Video(range(2))})
    r = td.Recipe(seed=1, batch_size=4, components=[td.Component(branch.table("t"), w)])
    daemon = sys.argv[2] == "daemon"
    got, main_left = [], threading.Event()

    def run():
        for batch in td.TrainLoader(r, steps=100_000 if daemon else 40, video_threads=2):
            assert batch["cam"].shape == (4, 2, 16, 16, 3)
            got.append(1)
            if len(got) == 3 and not daemon:  # the rest once the main thread is returning
                main_left.wait()
        print("thread done", len(got), flush=True)

    threading.Thread(target=run, daemon=daemon).start()
    while len(got) < 3:
        time.sleep(0.01)
    print("main returns", flush=True)
    main_left.set()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_non_daemon_thread_reads_on_after_the_main_thread_returned(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", "thread", name="after_main.py")
    assert proc.stdout.split("\n")[:2] == ["main returns", "thread done 40"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_daemon_thread_in_a_video_loader_ends_silently_at_exit(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", "daemon", name="daemon_exit.py")
    assert proc.stdout.strip() == "main returns"
    assert proc.stderr == "", proc.stderr[-3000:]


def test_a_pool_shut_down_before_exit_still_refuses_work():
    pool = ThreadPoolExecutor(1, thread_name_prefix="treadle-test")
    assert submit(pool, int, "7").result(10) == 7
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):  # a closed reader: never hidden
        submit(pool, int, "7")

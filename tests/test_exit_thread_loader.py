"""A script that ends while a daemon thread iterates a ``workers=N`` loader exits silently.

At interpreter exit multiprocessing's exit hook terminates the workers of a loader that
treadle's own hook cannot close (its generator runs on the other thread). Before the fix,
that thread, waiting for its next batch, saw the pipe close and printed "Exception in
thread ...: TreadleError: treadle worker process 1 exited (code -15) before it delivered
step 8": a crash report for an ordinary exit.
"""

from __future__ import annotations

import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import treadle as td


    def slow(batch, seeds):  # in the workers: the thread mostly waits for its next batch
        time.sleep(0.3)
        return batch


    if __name__ == "__main__":
        branch = td.Client(sys.argv[1], create=True).project("p").branch()
        with branch.transaction("rows") as tx:
            for e in range(2):
                tx.table("t").append_episode(
                    {"action": np.zeros((20, 2), np.float32)}, episode=f"e{e}"
                )
        w = td.Windows({"action": td.Rows(range(2))})
        r = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"), w)])
        got = []

        def run():
            for batch in td.TrainLoader(r, steps=1000, workers=2, prefetch=1, transform=slow):
                got.append(len(batch["_moment"]))

        threading.Thread(target=run, daemon=True).start()
        while len(got) < 3:
            time.sleep(0.01)
        print("exiting with the thread in the loader", flush=True)
    """
)


@pytest.mark.slow
def test_exit_with_a_worker_loader_on_a_daemon_thread_prints_nothing(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="thread_exit.py", timeout=240)
    assert proc.stdout.strip() == "exiting with the thread in the loader"
    assert proc.stderr == "", proc.stderr[-3000:]

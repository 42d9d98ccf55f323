"""A process forked while loaders run (a user forks for eval): the child cannot go on with
the parent's iterators (a named ForkError, never a hang nor the parent's batches), and a
child that exits normally leaves the parent's worker processes running.

Before the fix a ``workers=0`` loader's (or a ``ScanDataset``'s) iterator resumed in the
child waited forever for reader threads that are not there; a ``workers=2`` one took batches out of the parent's
pipes (the parent then failed: "worker process 0 sent batch 5, not step 3"); and the child's
``atexit`` (multiprocessing's) sent SIGTERM to the parent's workers, so the parent's loader
failed at its next batch from them ("worker process 0 exited (code -15)").
"""

from __future__ import annotations

import json
import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import treadle as td
    from treadle.read.prefetch import prefetch

    root = sys.argv[1]
    branch = td.Client(root, create=True).project("p").branch()
    with branch.transaction("rows") as tx:
        for e in range(2):
            tx.table("t").append_episode(
                {"action": np.arange(40, dtype=np.float32).reshape(20, 2),
                 "cam": td.VideoFrames(np.zeros((20, 16, 16, 3), np.uint8), fps=30)},
                episode=f"e{e}",
            )
    windows = td.Windows({"action": td.Rows(range(2))})
    recipe = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"), windows)])
    live = {
        "workers0": iter(td.TrainLoader(recipe, steps=1000)),
        "workers2": iter(td.TrainLoader(recipe, steps=1000, workers=2, prefetch=2)),
        "prefetch": prefetch(iter(range(1000)), 2),
        "scan": iter(td.ScanDataset(branch.table("t").scan_request(["cam", "action"]), batch_size=2)),
    }
    for it in live.values():
        for _ in range(3):
            next(it)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an eval that looks at the parent's iterators, then exits normally
        os.close(r)
        signal.alarm(30)  # a hang ends the child (SIGALRM) instead of the test run
        seen = {}
        for name, it in live.items():
            try:
                next(it)
                seen[name] = "a batch"
            except Exception as e:
                seen[name] = f"{type(e).__name__}: {e}"
        os.write(w, json.dumps(seen).encode())
        sys.exit(0)  # atexit runs here, as at the end of any script
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    parent = []
    for _ in range(40):  # more than the workers' slots hold: they must still be running
        parent.append(next(live["workers2"])["_moment"].tolist())
    print(json.dumps({"child": child, "status": status, "parent": len(parent)}))
    """
)


@pytest.mark.slow
def test_a_forked_child_cannot_use_the_parents_iterators_nor_end_its_workers(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="fork_live.py", timeout=240)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == 0, out  # the child was not killed by its alarm (a hang)
    assert set(out["child"]) == {"workers0", "workers2", "prefetch", "scan"}, out
    for name, seen in out["child"].items():
        assert seen.startswith("ForkError: "), (name, seen)
        assert "forked" in seen and "'spawn'" in seen, (name, seen)
    assert out["parent"] == 40
    assert "exited (code" not in proc.stderr, proc.stderr[-3000:]

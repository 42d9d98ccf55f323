"""A script that leaves loader iterators (and a bare prefetch) unfinished exits silently.

Before the fix, interpreter teardown finalised the suspended generators with module
globals already None and printed ``Exception ignored in: <generator object
StepLoader.__iter__ ...> AttributeError: 'NoneType' object has no attribute 'pop'``.
"""

from __future__ import annotations

import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import treadle as td
    from treadle.read.prefetch import prefetch

    branch = td.Client(sys.argv[1], create=True).project("p").branch()
    with branch.transaction("rows") as tx:
        for e in range(2):
            tx.table("t").append_episode(
                {"action": np.zeros((6, 2), np.float32),
                 "cam": td.VideoFrames(np.zeros((6, 16, 16, 3), np.uint8), fps=30)},
                episode=f"e{e}",
            )
    w = td.Windows({"action": td.Rows(range(2))})
    r = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"), w)])
    alive = []
    for workers in (0, 2):
        it = iter(td.TrainLoader(r, steps=10, workers=workers))
        next(it)
        alive.append(it)
    scan = iter(td.ScanDataset(branch.table("t").scan_request(["cam", "action"]), batch_size=2))
    next(scan)  # (its video decode of the next batch waits on the reader's threads)
    alive.append(scan)
    bare = prefetch(iter(range(100)), 2)
    next(bare)
    print("left alive", len(alive) + 1, flush=True)
    """
)


@pytest.mark.slow
def test_unfinished_loader_iterators_print_nothing_at_exit(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="alive.py")
    assert proc.stdout.strip() == "left alive 4"
    assert proc.stderr == ""

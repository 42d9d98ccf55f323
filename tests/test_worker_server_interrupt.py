"""A Ctrl-C while the worker processes' server starts neither kills it nor prints a traceback.

A terminal's Ctrl-C goes to the whole process group: the training process and the server
that ``workers=N`` loaders fork their workers from, which imports treadle's read path for a
second or more when the first such loader is made. Before the fix the server died there
(with "Traceback ... KeyboardInterrupt" on stderr, or silently before Python's handler was
set) and the loader started another, which imported again. Here the interrupt is sent to
the server alone, as it starts.
"""

from __future__ import annotations

import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import treadle as td
    from multiprocessing import forkserver
    from treadle.workers.processes import context

    branch = td.Client(sys.argv[1], create=True).project("p").branch()
    with branch.transaction("rows") as tx:
        for e in range(2):
            tx.table("t").append_episode({"action": np.zeros((20, 2), np.float32)}, episode=f"e{e}")
    context()  # starts the server: it now imports for a second or more
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGINT)  # the group's Ctrl-C, as the server sees it
    w = td.Windows({"action": td.Rows(range(2))})
    r = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"), w)])
    batches = list(td.TrainLoader(r, steps=6, workers=2))
    print("batches", len(batches), flush=True)
    print("same server", forkserver._forkserver._forkserver_pid == server, flush=True)
    """
)


@pytest.mark.slow
def test_an_interrupt_while_the_worker_server_imports_is_dropped(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="server_int.py", timeout=240)
    # before, the server died (and the loader started another, importing again)
    assert proc.stdout.split("\n")[:2] == ["batches 6", "same server True"], proc.stdout
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]

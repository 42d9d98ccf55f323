"""A training process ended by a signal leaves no ``/tmp/pymp-*`` folder behind.

A ``workers=N`` loader starts multiprocessing's forkserver, whose socket lives in a folder
multiprocessing makes (``pymp-*`` in the temp folder) and removes at a normal exit only: a
SIGTERM (the default action: no ``atexit``), the OOM killer's SIGKILL or a crash left it,
one per run. The server outlives its parent and removes it. Each case runs the training
script in a new session with a temp folder of its own, signals it, waits (bounded) for its
processes to be gone and looks in that folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import treadle as td

SCRIPT = textwrap.dedent(
    """
    import faulthandler, multiprocessing, signal, sys, time
    from multiprocessing import forkserver
    import treadle as td

    faulthandler.dump_traceback_later(120, exit=True)
    if sys.argv[2] == "handler":  # the user's own handler: it must still be called
        def on_term(signum, frame):
            print("user handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
    t = td.Client(sys.argv[1]).project("p").branch().table("t")
    w = td.Windows({"action": td.Rows(range(2))})
    r = td.Recipe(seed=1, batch_size=2, components=[td.Component(t, w)])
    it = iter(td.TrainLoader(r, steps=10_000, workers=2))
    next(it)  # read here while the server imports
    if sys.argv[3] == "late":
        for _ in range(4):
            next(it)  # from the workers
    pids = [forkserver._forkserver._forkserver_pid]
    pids += [p.pid for p in multiprocessing.active_children()]
    print("ready", *pids, flush=True)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("signals") / "store"
    branch = td.Client(str(root), create=True).project("p").branch()
    with branch.transaction("rows") as tx:
        for e in range(2):
            tx.table("t").append_episode({"action": np.zeros((40, 2), np.float32)}, episode=f"e{e}")
    return str(root)


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie no init reaps counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _run_and_signal(
    tmp_path: Path, store: str, how: str, sig: int, when: str = "late"
) -> tuple[int, str, Path]:
    temp = tmp_path / "temp"
    temp.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), store, how, when],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TMPDIR=str(temp)), start_new_session=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), line + proc.stderr.read()[-3000:]
        pids = [int(p) for p in line.split()[1:]]
        if how == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 60  # a hang guard, not a timing claim
        while not all(map(_gone, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(_gone, pids)), f"processes of the loader still running: {pids}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out + err, temp


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.skipif(sys.platform != "linux", reason="forkserver, /proc")
@pytest.mark.parametrize(
    ("how", "sig", "when"),
    [
        ("one", signal.SIGTERM, "early"),  # the server still importing
        ("one", signal.SIGTERM, "late"),
        ("group", signal.SIGTERM, "early"),  # a batch system's cancel: the server's too
        ("group", signal.SIGTERM, "late"),
        ("one", signal.SIGKILL, "late"),  # the OOM killer
    ],
)
def test_a_signalled_training_process_leaves_no_multiprocessing_folder(
    tmp_path, store, how, sig, when
):
    code, said, temp = _run_and_signal(tmp_path, store, how, sig, when)
    assert code == -sig, said[-3000:]  # still the signal's death, as a supervisor expects
    assert [p.name for p in temp.iterdir()] == [], said[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.skipif(sys.platform != "linux", reason="forkserver, /proc")
def test_the_users_sigterm_handler_still_runs(tmp_path, store):
    code, said, temp = _run_and_signal(tmp_path, store, "handler", signal.SIGTERM)
    assert code == 3 and "user handler" in said, said[-3000:]
    assert [p.name for p in temp.iterdir()] == [], said[-3000:]

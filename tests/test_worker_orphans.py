"""A ``workers=N`` loader with ``lookahead`` killed (the OOM killer) while its workers wait
for the stage's fetches: the workers end, they are not left waiting forever.

A worker ahead of the stage's fetches waits at the shared window (polling its words) and
never looked at its pipes there; a loader that died never sets the words again, so such a
worker (and the workers' server, which waits for every worker) ran on, polling, for good.
It was also left by a script that ended while a daemon thread iterated such a loader (a
worker started by the loader's starter thread after the exit had ended the others). Here
the stage's fetches never end (a read hung on a dead server), the loader is killed with
SIGKILL, and every process it started must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import treadle as td
from treadle.storage import Store

SCRIPT = textwrap.dedent(
    """
    import faulthandler, json, multiprocessing, sys, threading, time
    from multiprocessing import forkserver
    import treadle as td
    from treadle.read import lookahead

    faulthandler.dump_traceback_later(120, exit=True)
    real = lookahead.Lookahead._fetch

    def hung(self, steps, now):  # every round after step 0's never ends
        if steps and 0 not in steps:
            threading.Event().wait()
        return real(self, steps, now)

    lookahead.Lookahead._fetch = hung
    client = td.Client(sys.argv[1], storage_options=json.loads(sys.argv[2]))
    comps = [td.Component(client.project("p").branch().table("a"), None)]
    recipe = td.Recipe(seed=4, batch_size=16, components=comps)
    it = iter(td.TrainLoader(recipe, steps=60, workers=2, lookahead=4))
    next(it)  # step 0, read here
    while len(multiprocessing.active_children()) < 2:
        time.sleep(0.05)
    pids = [p.pid for p in multiprocessing.active_children()]
    print("ready", forkserver._forkserver._forkserver_pid, *pids, flush=True)
    next(it)  # waits for the stage, as its workers do
    """
)


@pytest.fixture(scope="module")
def s3_table(s3_server, tmp_path_factory) -> tuple[str, dict]:
    path = tmp_path_factory.mktemp("orphans")
    image = np.random.default_rng(7).integers(0, 256, (1200, 16, 16, 3), dtype=np.uint8)
    td.Client(str(path), create=True).project("p").branch().table("a").append({"image": image})
    url = s3_server.url(f"orphans-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return url, s3_server.storage_options()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform != "linux", reason="forkserver, /proc")
def test_workers_waiting_for_the_stage_end_when_the_loader_is_killed(
    s3_table, tmp_path, monkeypatch
):
    url, options = s3_table
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 << 20))
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "16KB")
    script = tmp_path / "killed.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), url, json.dumps(options)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), line + proc.stderr.read()[-3000:]
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(1)  # the workers reach the window (they wait there either way)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)  # (its workers hold its output pipes: no communicate)
        deadline = time.monotonic() + 60  # a hang guard, not a timing claim
        while not all(map(_gone, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if not _gone(p)]
        assert not left, f"processes of the killed loader still running: {left} of {pids}"
    finally:
        for pid in [proc.pid, *locals().get("pids", [])]:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()
        proc.wait(60)

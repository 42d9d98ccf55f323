"""A process forked while a ``workers=N`` loader with ``lookahead`` runs, at a moment a
thread of the parent holds the stage's lock: the child's exit (its ``atexit`` closes the
iterators it inherited) neither waits for that lock (forever: the thread that would release
it is not in the child) nor stops the parent's stage.

Which lock a thread holds at a fork is a matter of timing; here a thread of the parent holds
it on purpose while the parent forks, as the stage's thread does in each round (its
condition: telling the workers how far it fetched) and the thread following the workers does
at each step they read. Before the fix the child hung at exit.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import treadle as td
from script_helpers import run_script
from treadle.storage import Store

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    import treadle as td

    client = td.Client(sys.argv[1], storage_options=json.loads(sys.argv[2]))
    comps = [td.Component(client.project("p").branch().table("a"), None)]
    recipe = td.Recipe(seed=4, batch_size=16, components=comps,
                       shuffle=td.BlockShuffle(block_rows=64, window_blocks=2))
    loader = td.TrainLoader(recipe, steps=60, prefetch=2, workers=2, lookahead=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    stage = loader.lookahead_stage
    lock = stage._cond
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(40)  # a hang ends the child (SIGALRM) instead of the test run
        if os.environ.get("CLOSE_STAGE"):  # the stage closed itself (as ``tracked`` does)
            stage.close()
            os._exit(0)
        sys.exit(0)  # atexit closes the inherited iterator
    release.set()
    _, status = os.waitpid(pid, 0)
    rest = sum(1 for _ in it)  # the parent's loader goes on
    print(json.dumps({"status": status, "rest": rest}))
    """
)


@pytest.fixture(scope="module")
def s3_table(s3_server, tmp_path_factory) -> tuple[str, dict]:
    """One table of 768-byte rows on S3 (a lookahead fetches only from object stores)."""
    path = tmp_path_factory.mktemp("forkla")
    image = np.random.default_rng(7).integers(0, 256, (1200, 16, 16, 3), dtype=np.uint8)
    td.Client(str(path), create=True).project("p").branch().table("a").append({"image": image})
    url = s3_server.url(f"forkla-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return url, s3_server.storage_options()


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_forked_childs_exit_never_waits_for_the_parents_lookahead_stage(
    s3_table, tmp_path, monkeypatch
):
    url, options = s3_table
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 << 20))
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "16KB")
    proc = run_script(tmp_path, SCRIPT, url, json.dumps(options), name="fork_la.py", timeout=240)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == 0, (out, proc.stderr[-3000:])  # not its alarm (-14: a hang)
    assert out["rest"] == 57, out


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_forked_child_closing_the_stage_itself_neither_waits_nor_stops_it(
    s3_table, tmp_path, monkeypatch
):
    """``Lookahead.close`` in a forked child (``tracked``'s ``finally``, any caller) took the
    stage's lock that a thread of the parent held at the fork: the child hung."""
    url, options = s3_table
    monkeypatch.setenv("TREADLE_CHUNK_CACHE_BYTES", str(64 << 20))
    monkeypatch.setenv("TREADLE_CHUNK_BYTES", "16KB")
    monkeypatch.setenv("CLOSE_STAGE", "1")
    proc = run_script(tmp_path, SCRIPT, url, json.dumps(options), name="fork_la.py", timeout=240)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == 0, (out, proc.stderr[-3000:])  # not its alarm (-14: a hang)
    assert out["rest"] == 57, out

"""A process forked while another thread holds one of treadle's module locks still works.

A forked child inherits every lock in the state it had at the fork, but not the thread
that held it: before the fix, a child forked while ``_Loop._lock`` was held (a thread of
the parent starting the I/O loop, say) waited forever in its first object-store call.
Each script runs in its own process (pytest's may already have used obstore, which a
forked child may not: see test_forks.py), and joins its child with a 60 s hang guard.
"""

from __future__ import annotations

import json
import os

from script_helpers import run_script

SCRIPT = """
    import json, multiprocessing, sys
    from treadle import fastpaths
    from treadle.gpu import fallback
    from treadle.storage import filecache
    from treadle.storage.loop import _Loop
    from treadle.storage.store import Store
    from treadle.workers import processes

    def locks():
        return [_Loop._lock, filecache._LOCK, fastpaths._LOCK, fallback._warned_lock,
                processes._starting]

    root = sys.argv[1]

    def child():
        store = Store.open(root)  # a local root: its missing() runs on the I/O loop
        assert store.missing(["nope", "here"]) == ["nope"]
        fastpaths.reasons()
        fallback.warn_once("fork-test", "a warning")
        assert isinstance(filecache.file_cache(), filecache.FileCache)
        for lock in locks():  # every module lock a child may take is free in it
            assert lock.acquire(timeout=10), lock

    # no store call in the parent: a child forked after one gets a ForkError (test_forks)
    open(f"{root}/here", "wb").write(b"1")
    held = locks()
    for lock in held:  # as if other threads were inside them when the process forked
        lock.acquire()
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join(60)  # a hang guard, not a speed limit
    hung = p.is_alive()
    if hung:
        p.kill()
        p.join()
    for lock in held:
        lock.release()
    print(json.dumps({"hung": hung, "exitcode": p.exitcode}))
"""


def test_a_child_forked_while_locks_are_held_reads(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    env = {**os.environ, "TREADLE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_script(tmp_path, SCRIPT, root, name="fork_lock.py", env=env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"hung": False, "exitcode": 0}

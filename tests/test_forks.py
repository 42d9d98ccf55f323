"""A read in a process forked after its parent read is a named ForkError, never a hang.

obstore's runtime threads do not survive ``os.fork()``: before the guard, every entry
point below blocked forever in ``Store.get`` in the child. One subprocess reads once, then
forks one child per entry point; each child has an alarm so a hang fails instead of
stalling the suite.
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
    import torch
    import treadle as td

    root = sys.argv[1]
    branch = td.Client(root, create=True).project("p").branch()
    with branch.transaction("rows") as tx:
        for e in range(2):
            tx.table("t").append_episode(
                {"action": np.arange(12, dtype=np.float32).reshape(6, 2)}, episode=f"e{e}"
            )
    windows = td.Windows({"action": td.Rows(range(2))})

    def recipe(b):
        return td.Recipe(seed=1, batch_size=2, components=[td.Component(b.table("t"), windows)])

    loader = td.TrainLoader(recipe(branch), steps=2)
    next(iter(loader))  # the parent has read: obstore's runtime now runs in this process
    record = loader.plan.record.to_json()

    class InWorker(torch.utils.data.IterableDataset):
        def __iter__(self):
            b = td.Client(root).project("p").branch()
            yield from td.TrainLoader(recipe(b), steps=1)

    def num_moments():
        return branch.table("t").num_moments()

    def train_loader():
        return next(iter(td.TrainLoader(recipe(branch), steps=1)))

    def from_record():
        return td.Plan.from_record(record, td.Client(root))

    ENTRIES = {"num_moments": num_moments, "train_loader": train_loader,
               "from_record": from_record}

    def outcome(fn):
        try:
            fn()
            return "no error"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    out = {}
    for name, fn in ENTRIES.items():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child (SIGALRM) instead of the test run
            os.write(w, outcome(fn).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out[name] = f.read()
        os.waitpid(pid, 0)
        out[name] = out[name] or "hung"
    # a TrainLoader made inside a default-context (on Linux: fork) DataLoader worker
    dl = torch.utils.data.DataLoader(InWorker(), batch_size=None, num_workers=1, timeout=20)
    out["dataloader_worker"] = outcome(lambda: next(iter(dl)))
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_every_read_in_a_forked_child_is_a_fork_error(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="forks.py")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"num_moments", "train_loader", "from_record", "dataloader_worker"}
    for entry, seen in out.items():
        assert seen.startswith("ForkError: "), (entry, seen)
        assert "forked" in seen and "'spawn'" in seen, (entry, seen)

"""treadle inside a torch ``DataLoader`` with worker processes: an iterator abandoned mid-epoch
lets torch's workers end by themselves (exit code 0), never stuck in treadle code.

torch's shutdown waits for each worker a while (``MP_STATUS_CHECK_INTERVAL``, 5 s), then
terminates it (exit code -15); here that wait is raised to 120 s so that a worker stuck in
treadle's code (a reader's thread, a lock, a pipe) shows as a terminated worker rather than
as a slow one. Both on-ramps: ``ScanDataset`` and a ``TrainLoader`` made in the worker.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import gc, json, sys
    import numpy as np
    import torch
    import torch.utils.data._utils as torch_utils
    import treadle as td

    torch_utils.MP_STATUS_CHECK_INTERVAL = 120.0  # a stuck worker: terminated (-15), not slow
    ROOT = sys.argv[1]


    def table():
        return td.Client(ROOT).project("p").branch().table("t")


    class InWorker(torch.utils.data.IterableDataset):
        def __iter__(self):
            w = td.Windows({"action": td.Rows(range(2))})
            r = td.Recipe(seed=1, batch_size=2, components=[td.Component(table(), w)])
            yield from td.TrainLoader(r, steps=1000, prefetch=4)


    def abandoned(ds):
        dl = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
        )
        it = iter(dl)
        for _ in range(4):
            next(it)
        workers = list(it._workers)
        del it, dl
        gc.collect()
        return [w.exitcode for w in workers]


    if __name__ == "__main__":
        branch = td.Client(ROOT, create=True).project("p").branch()
        with branch.transaction("rows") as tx:
            for e in range(2):
                tx.table("t").append_episode(
                    {"action": np.zeros((40, 2), np.float32)}, episode=f"e{e}"
                )
        scan = td.ScanDataset(table().scan_request(["action"]), batch_size=2)
        print(json.dumps({"scan": abandoned(scan), "train": abandoned(InWorker())}))
    """
)


@pytest.mark.slow
def test_torch_workers_end_by_themselves_when_their_iterator_is_abandoned(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="torch_exit.py", timeout=400)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"scan": [0, 0], "train": [0, 0]}, (out, proc.stderr[-3000:])

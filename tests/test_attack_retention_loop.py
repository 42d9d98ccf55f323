"""gc --keep-days 0 at zero grace, in a loop, beside writers on two branches and four
checkpointing runs (two per branch), on local disk, S3 and Azurite.

The zero-grace loop of test_gc_zero_grace runs without retention; here every gc also
expires what nothing pins, so runs race it: a save may be refused (ExpiredCommit: the
run's commit went before its first checkpoint pinned it), but gc never raises, every
checkpoint whose save returned resumes with the batch the run saw next, and every head
reads back whole.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest
import torch

import treadle as td
from treadle.catalog.gc import collect_garbage

STEPS, APPENDS = 6, 8


def _gc_loop(client: td.Client, stop: threading.Event, errors: list, runs: list) -> None:
    project = client.project("p")
    while not stop.is_set():
        try:
            collect_garbage(project, timedelta(0), keep_days=0)
            runs.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"gc: {type(e).__name__}: {e}")


def _writer(client: td.Client, branch: str, errors: list) -> None:
    t = client.project("p").branch(branch).table("t")
    for i in range(APPENDS):
        try:
            t.append({"x": np.full(4, i, dtype=np.float32)})
        except Exception as e:  # noqa: BLE001
            errors.append(f"writer {branch}: {type(e).__name__}: {e}")


def _run(client: td.Client, branch: str, seen: dict, saved: list, errors: list) -> None:
    b = client.project("p").branch(branch)
    try:
        plan = td.Recipe(seed=1, batch_size=4, components=[td.Component(b.table("t"))]).plan()
        loader = td.TrainLoader(plan, steps=STEPS, prefetch=1)
        ckpts = td.Checkpoints(b, table="ck")
        for step, batch in enumerate(loader):
            seen[(plan.run_id, step)] = batch["x"].clone()
            if step + 1 < STEPS:
                try:
                    saved.append(ckpts.save(step + 1, {}, loader))
                except td.ExpiredCommit:
                    pass  # the run's commit went first: refused, named (tested elsewhere)
    except Exception as e:  # noqa: BLE001
        errors.append(f"run {branch}: {type(e).__name__}: {e}")


@pytest.mark.slow
def test_retention_in_a_loop_beside_checkpointing_runs(any_root):
    root, opts = any_root

    def client() -> td.Client:
        return td.Client(root, storage_options=opts)

    project = client().project("p")
    project.branch().table("t").append({"x": np.arange(40, dtype=np.float32)})
    project.create_branch("exp")
    stop, errors, gcs, seen, saved = threading.Event(), [], [], {}, []
    gc = threading.Thread(target=_gc_loop, args=(client(), stop, errors, gcs))
    gc.start()
    work = [threading.Thread(target=_writer, args=(client(), b, errors)) for b in ("main", "exp")]
    work += [
        threading.Thread(target=_run, args=(client(), b, seen, saved, errors))
        for b in ("main", "exp", "main", "exp")
    ]
    for t in work:
        t.start()
    for t in work:
        t.join()
    stop.set()
    gc.join()
    collect_garbage(client().project("p"), timedelta(0), keep_days=0)  # once more, after all
    assert errors == [] and gcs, errors[:5]
    for row in saved:  # every checkpoint whose save returned resumes where its run was
        again = td.TrainLoader.from_state(row.loader_state, client(), steps=row.step + 1)
        assert torch.equal(next(iter(again))["x"], seen[(row.run_id, row.step)]), row.step
    fresh = client().project("p")
    for b in ("main", "exp"):
        head = fresh.branch(b).head()
        assert fresh.table_at("t", head.tables["t"]).to_arrow(["x"]).num_rows == 40 + 4 * APPENDS

"""gc at a zero grace, in a loop, beside writers, a checkpointing run and a pinned reader.

gc (``older_than=0``) runs every 0.1 s while three writers append video episodes and
rows, a training run (a ``TrainLoader`` reading video pinned at its start) saves
checkpoints, on local disk, S3 and Azurite. Afterwards every commit of the branch reads
back whole (rows, every data file, every frame of every stream), every checkpoint
resumes with the batch the run saw at that step, and gc never raised: gc's safety
holds by its protocol (leases honoured whatever the grace, heads, tags, pins and
leases re-read after choosing what to delete), not by the grace.
"""

from __future__ import annotations

import json
import random
import threading
from datetime import timedelta

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

import treadle as td
import treadle.video as tv
from treadle.catalog.gc import collect_garbage
from treadle.plan.windows import Video
from treadle.video._testing import synthetic_frames

FRAMES, ROWS, WRITERS, PER_WRITER, STEPS, EVERY = 6, 5, 3, 9, 10, 2


def _frames(seed: int) -> np.ndarray:
    return synthetic_frames(FRAMES, 32, 32, seed=seed)


def _writer(root: str, opts, w: int, failures: list) -> None:
    rng = random.Random(1000 + w)
    main = td.Client(root, storage_options=opts).project("p").branch()
    try:
        for i in range(PER_WRITER):
            if rng.random() < 0.6:
                seed = 100 * w + i
                cols = {"cam": td.VideoFrames(_frames(seed), fps=10), "a": np.ones((FRAMES, 2))}
                main.table("v").append_episode(cols, episode=f"e{seed}", message=f"v e{seed}")
            else:
                rows = {"w": np.full(ROWS, w), "i": np.full(ROWS, i)}
                main.table("t").append(rows, message=f"t {w} {i}")
    except BaseException as e:  # noqa: BLE001 - reported by the test
        failures.append(f"writer {w}: {type(e).__name__}: {e}")


def _run(root: str, opts, seen: dict, failures: list) -> None:
    """A training run on ``v`` as it is now (pinned), checkpointing every ``EVERY`` steps."""
    main = td.Client(root, storage_options=opts).project("p").branch()
    windows = td.Windows({"cam": td.Video([0, 1]), "a": td.Rows([0])})
    try:
        plan = td.Recipe(seed=3, batch_size=2, components=[td.Component(main.table("v"), windows)])
        loader = td.TrainLoader(plan, steps=STEPS + 1)  # the batch after the last one too
        ckpt = td.Checkpoints(main)
        for step, batch in enumerate(loader):
            seen[step] = batch["cam"].clone()
            if (step + 1) % EVERY == 0 and step < STEPS:
                ckpt.save(step + 1, {"w": torch.full((2,), float(step))}, loader)
    except BaseException as e:  # noqa: BLE001
        failures.append(f"run: {type(e).__name__}: {e}")


def _gc_loop(root: str, opts, stop: threading.Event, errors: list, runs: list) -> None:
    project = td.Client(root, storage_options=opts).project("p")
    while not stop.is_set():
        try:
            collect_garbage(project, timedelta(0))
            runs.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"gc: {type(e).__name__}: {e}")
        stop.wait(0.1)


def _check(project: td.Project, commit, older: list, decoded: set) -> None:
    """``commit`` reads back whole: its rows, and every frame of every stream it names."""
    msgs = [c.message for c in [commit, *older]]
    eps = sorted(m.split()[1] for m in msgs if m.startswith("v "))
    n_t = sum(m.startswith("t ") for m in msgs)
    where = f"commit {commit.short_id} ({commit.message})"
    t = project.table_at("t", commit.tables["t"]).to_arrow(["w"])  # every data file
    assert t.num_rows == ROWS * (1 + n_t), where
    v = project.table_at("v", commit.tables["v"]).to_arrow(["episode", "cam"])
    got = sorted(set(v.column("episode").to_pylist()))
    assert got == sorted(["e0", *eps]), where
    with tv.VideoReader(project.client.store, prefix=project.prefix) as reader:
        for ep in got:
            rows = v.filter(pc.equal(v.column("episode"), ep)).column("cam")
            key, idx = tv.index_from_arrow(rows)
            if key in decoded:
                continue
            n = len(idx)
            [frames] = reader.read([tv.WindowRequest(key, idx, range(n), Video(range(n)))])
            ref = _frames(int(ep[1:])).astype(np.int16)
            diff = np.abs(np.asarray(frames).astype(np.int16) - ref).mean()
            assert np.asarray(frames).shape == ref.shape and diff < 12, (where, ep)
            decoded.add(key)
    if "checkpoints" in commit.tables:
        project.table_at("checkpoints", commit.tables["checkpoints"]).to_arrow(["step"])


@pytest.mark.slow
def test_gc_at_zero_grace_in_a_loop_loses_nothing(any_root):
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"w": np.full(ROWS, -1), "i": np.full(ROWS, -1)}, message="t -1 -1")
    cols = {"cam": td.VideoFrames(_frames(0), fps=10), "a": np.ones((FRAMES, 2))}
    main.table("v").append_episode(cols, episode="e0", message="v0")
    stop, errors, runs, failures, seen = threading.Event(), [], [], [], {}
    gc = threading.Thread(target=_gc_loop, args=(root, opts, stop, errors, runs))
    gc.start()
    threads = [threading.Thread(target=_writer, args=(root, opts, w, failures)) for w in range(3)]
    threads.append(threading.Thread(target=_run, args=(root, opts, seen, failures)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    gc.join()

    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    unreadable, decoded = [], set()
    for k, commit in enumerate(log[:-3]):  # less "create project", t -1 and v0
        try:
            _check(project, commit, log[k + 1 : -3], decoded)
        except Exception as e:  # noqa: BLE001 - counted, then asserted
            unreadable.append(f"{commit.short_id} {commit.message}: {type(e).__name__}: {e}")
    resumed = _resume_every_checkpoint(project, seen, unreadable)
    bad = f"{len(unreadable)} of {len(log) - 3} commits unreadable: {unreadable[:3]}"
    fails = f"{len(failures)} writer/run failures, {len(errors)} gc errors (of {len(runs)} runs)"
    assert not unreadable and not failures and not errors, (bad, fails, failures[:3], errors[:3])
    assert len(log) - 3 >= 30 and resumed == STEPS // EVERY and len(runs) >= 3, (len(log), runs)


def _resume_every_checkpoint(project: td.Project, seen: dict, unreadable: list) -> int:
    """Every saved checkpoint resumes: its loader gives the batch the run saw at its step."""
    head = project.branch().head()
    if "checkpoints" not in head.tables:
        unreadable.append("no checkpoint was committed")
        return 0
    rows = project.table_at("checkpoints", head.tables["checkpoints"]).to_arrow()
    resumed = 0
    for text in rows.column("loader_state").to_pylist():
        state = json.loads(text)
        step = state["step"]
        try:
            loader = td.TrainLoader.from_state(state, project.client, steps=step + 1)
            batch = next(iter(loader))
            assert torch.equal(batch["cam"], seen[step]), f"checkpoint at step {step}"
            resumed += 1
        except Exception as e:  # noqa: BLE001
            unreadable.append(f"checkpoint at step {step}: {type(e).__name__}: {e}")
    return resumed

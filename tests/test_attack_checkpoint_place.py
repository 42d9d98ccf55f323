"""A checkpoint row pins its run's commits only in the project the run reads (the one gc
--keep-days looks in): a row saved anywhere else would protect nothing, so it is refused
before anything is written (before: saved silently; gc --keep-days then expired the run's
commit and the resume failed reading a data file gc had deleted)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch

import treadle as td


def _loader(project: td.Project) -> td.TrainLoader:
    t = project.branch().table("t")
    t.append({"x": np.arange(40, dtype=np.float32)})
    plan = td.Recipe(seed=1, batch_size=4, components=[td.Component(t)]).plan()
    loader = td.TrainLoader(plan, steps=2)
    next(iter(loader))
    return loader


@pytest.mark.parametrize("where", ["other project", "other root, same project name"])
def test_a_checkpoint_outside_the_runs_project_is_refused(tmp_path, where):
    client = td.Client(str(tmp_path / "a"), create=True)
    project = client.project("p")
    loader = _loader(project)
    if where == "other project":
        elsewhere = client.project("ckpts").branch()
    else:
        elsewhere = td.Client(str(tmp_path / "b"), create=True).project("p").branch()
    ckpts = td.Checkpoints(elsewhere)
    with pytest.raises(td.PlanError, match="pins nothing"):
        ckpts.save(1, {"w": torch.zeros(1)}, loader)
    with pytest.raises(td.NotFound):  # nothing was saved: not even the project exists
        ckpts.latest()
    # the same row in the run's own project pins its commit through gc --keep-days 0
    row = td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(1)}, loader)
    project.branch().table("t").append({"x": np.arange(4, dtype=np.float32)})
    assert project.gc(timedelta(0), keep_days=0).expired_commits == []
    again = td.TrainLoader.from_state(row.loader_state, td.Client(str(tmp_path / "a")))
    assert next(iter(again))["x"].shape == (4,)


def test_gc_still_runs_after_a_checkpoint_came_too_late(local_root, monkeypatch):
    """A checkpoint row that landed after gc decided to expire its run's commit (its save
    raised ExpiredCommit, "cannot resume") stays in the checkpoint table. Every later
    gc --keep-days read that row's pins and raised CorruptData ("version ... manifest is
    missing"): gc was blocked for good. A pin of an expired commit now pins nothing (the
    save said so); the head stays whole."""
    from test_retention import _run_on_c2, _save_in_thread

    project, c2, loader, _ = _run_on_c2(local_root, None)
    threads, errors = _save_in_thread(project, loader, "decided", monkeypatch)
    assert c2.id in project.gc(older_than=timedelta(0), keep_days=0).expired_commits
    threads[0].join()
    monkeypatch.undo()
    assert len(errors) == 1 and "cannot resume" in str(errors[0])
    project.branch().table("t").append({"x": np.arange(3, dtype=np.int64)})
    again = td.Client(local_root).project("p")
    report = again.gc(older_than=timedelta(0), keep_days=0)  # before: CorruptData
    assert c2.id not in report.kept_versions and report.kept_versions["t"]
    head = again.branch().head()
    assert again.table_at("t", head.tables["t"]).to_arrow(["x"]).num_rows > 0
    assert (
        again.table_at("checkpoints", head.tables["checkpoints"]).to_arrow(["step"]).num_rows == 1
    )

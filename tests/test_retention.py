"""Tags and retention: ``gc --keep-days`` expires only old commits nothing pins.

Branch heads, tags and the commits/table versions named by run records in checkpoint
rows survive the strictest retention (``keep_days=0``, no grace); any other commit
then raises ``ExpiredCommit`` naming it. Without ``keep_days`` every commit stays
readable. Local disk and S3.
"""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest
import torch

import treadle as td
from treadle.cli import main


def _rows(i: int) -> dict:
    return {"x": np.arange(3 * i, 3 * i + 3, dtype=np.int64)}


def _history(root: str, opts):
    """c1 (tagged), c2 (a run's pin, checkpointed), c3 (nothing pins it), c4 (head)."""
    project = td.Client(root, storage_options=opts).project("p")
    t = project.branch().table("t")
    c1 = t.append(_rows(0))
    c2 = t.append(_rows(1))
    plan = td.Recipe(seed=1, batch_size=2, components=[td.Component(t)]).plan()
    loader = td.TrainLoader(plan, steps=1)
    next(iter(loader))
    td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader)
    c3 = t.append(_rows(2))
    c4 = t.append(_rows(3))
    return project, t, (c1, c2, c3, c4)


def test_tags_and_checkpointed_runs_survive_the_strictest_retention(any_root):
    root, opts = any_root
    project, t, (c1, c2, c3, c4) = _history(root, opts)
    assert project.tag("v1", c1.id[:8]).id == c1.id
    project.tag("v1", c1.id)  # the same tag again: fine
    with pytest.raises(td.AlreadyExists, match="tag 'v1'.*never move"):
        project.tag("v1", c3.id)
    assert project.tags() == {"v1": c1.id}

    report = project.gc(older_than=timedelta(0), keep_days=0)
    assert c3.id in report.expired_commits and c1.id not in report.expired_commits
    assert c2.id not in report.expired_commits and c4.id not in report.expired_commits
    assert t.at(c1.id).to_arrow(["x"]).column("x").to_pylist() == [0, 1, 2]
    assert t.at(c2.id).num_moments == 6  # the run's pinned commit
    assert t.at(c4.id).num_moments == 12
    row = td.Checkpoints(project.branch()).latest()
    assert row is not None
    pinned = row.record["tables"][0]
    assert project.table_at("t", pinned["version"]).num_moments == 6
    assert pinned["commit"] == c2.id

    fresh = td.Client(root, storage_options=opts).project("p")  # no cached handles
    with pytest.raises(td.ExpiredCommit, match=rf"commit {c3.id[:8]}.*expired by retention"):
        fresh.branch().table("t").at(c3.id).to_arrow()
    with pytest.raises(td.ExpiredCommit, match=c3.id[:8]):
        fresh.tag("late", c3.id)  # an expired commit cannot be tagged back to life
    # a later gc without retention neither fails on nor revives what expired
    fresh.gc(older_than=timedelta(0))
    assert fresh.branch().table("t").at(c1.id).num_moments == 3


def test_without_keep_days_every_commit_stays_readable(any_root):
    root, opts = any_root
    project, t, commits = _history(root, opts)
    report = project.gc(older_than=timedelta(0))
    assert report.expired_commits == []
    fresh = td.Client(root, storage_options=opts).project("p")
    for i, c in enumerate(commits):
        assert fresh.branch().table("t").at(c.id).num_moments == 3 * (i + 1)


def test_young_commits_are_kept(local_root):
    project, t, commits = _history(local_root, None)
    report = project.gc(older_than=timedelta(0), keep_days=1)
    assert report.expired_commits == []
    assert t.at(commits[2].id).num_moments == 9


def test_tag_and_keep_days_on_the_command_line(local_root, capsys):
    project, t, (c1, c2, c3, c4) = _history(local_root, None)
    assert main(["--root", local_root, "tag", "p", "release", c1.id[:8]]) == 0
    assert f"release -> {c1.short_id}" in capsys.readouterr().out
    assert main(["--root", local_root, "--json", "tag", "p"]) == 0
    assert json.loads(capsys.readouterr().out) == {"release": c1.id}
    assert main(["--root", local_root, "tag", "p", "release", c3.id[:8]]) == 1
    assert "never move" in capsys.readouterr().err
    args = ["--root", local_root, "--json", "gc", "p", "--older-than-hours", "0"]
    assert main([*args, "--keep-days", "0"]) == 0
    assert c3.id in json.loads(capsys.readouterr().out)["expired_commits"]
    assert td.Client(local_root).project("p").branch().table("t").at(c1.id).num_moments == 3


def _run_on_c2(root: str, opts):
    """c1, c2 (a run trains on it, no checkpoint yet), c3 (the head)."""
    project = td.Client(root, storage_options=opts).project("p")
    t = project.branch().table("t")
    t.append(_rows(0))
    c2 = t.append(_rows(1))
    loader = td.TrainLoader(td.Recipe(seed=1, batch_size=2, components=[td.Component(t)]), steps=2)
    first = next(iter(loader))
    t.append(_rows(2))
    return project, c2, loader, first


def _resumes(root: str, opts, first) -> None:
    """The latest checkpoint (a fresh client) resumes: step 1 of the same run."""
    client = td.Client(root, storage_options=opts)
    row = td.Checkpoints(client.project("p").branch()).latest()
    assert row is not None and row.step == 1
    again = td.TrainLoader.from_state({**row.loader_state, "step": 0}, client, steps=1)
    assert torch.equal(next(iter(again))["x"], first["x"])


def test_checkpoint_saved_mid_gc_keeps_its_runs_commit(any_root, monkeypatch):
    """The run's first checkpoint lands after gc read the heads and pins, before it
    deletes: gc reads the pins again and keeps the run's commit."""
    import treadle.catalog.gc as gc

    root, opts = any_root
    project, c2, loader, first = _run_on_c2(root, opts)
    real, calls = gc.plan_retention, []

    def then_save(*a, **k):
        out = real(*a, **k)
        if not calls:  # gc has read heads and pins once: the save lands now
            td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader)
        calls.append(1)
        return out

    monkeypatch.setattr(gc, "plan_retention", then_save)
    report = project.gc(older_than=timedelta(0), keep_days=0)
    monkeypatch.undo()
    assert c2.id not in report.expired_commits, report.expired_commits
    fresh = td.Client(root, storage_options=opts).project("p")
    assert fresh.branch().table("t").at(c2.id).num_moments == 6
    _resumes(root, opts, first)


def _save_in_thread(project, loader, at: str, monkeypatch):
    """Make gc's seam ``at`` start a checkpoint save and wait until its commit landed."""
    import threading

    import treadle.catalog.gc as gc

    errors: list[BaseException] = []

    def save() -> None:
        try:
            td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader)
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            errors.append(e)

    def seam(point: str) -> None:
        if point != at:
            return
        head = project.branch().commit_id
        threads.append(threading.Thread(target=save))
        threads[0].start()
        while project.branch().commit_id == head and threads[0].is_alive():
            threading.Event().wait(0.01)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(gc, "_at", seam)
    return threads, errors


def test_checkpoint_saved_while_expiry_is_pending_keeps_its_runs_commit(local_root, monkeypatch):
    """The save lands after gc marked the run's commit pending, before its second read
    of the pins: the commit is kept and the saver (which waited for gc to decide) is told
    nothing."""
    project, c2, loader, first = _run_on_c2(local_root, None)
    threads, errors = _save_in_thread(project, loader, "pending", monkeypatch)
    report = project.gc(older_than=timedelta(0), keep_days=0)
    threads[0].join()
    assert not errors and c2.id not in report.expired_commits
    markers = project.client.store.list("projects/p/retention")
    assert markers and not [k for k in markers if "pending" in k or c2.id in k], markers
    _resumes(local_root, None, first)


def test_checkpoint_saved_after_gc_decided_is_told_it_cannot_resume(local_root, monkeypatch):
    """The save lands after gc's last read of the pins: gc expires the commit, and the
    saver gets ExpiredCommit naming it instead of a checkpoint that would fail later."""
    project, c2, loader, _ = _run_on_c2(local_root, None)
    threads, errors = _save_in_thread(project, loader, "decided", monkeypatch)
    report = project.gc(older_than=timedelta(0), keep_days=0)
    threads[0].join()
    assert c2.id in report.expired_commits
    assert len(errors) == 1 and isinstance(errors[0], td.ExpiredCommit), errors
    assert c2.id[:8] in str(errors[0]) and "cannot resume" in str(errors[0])


def test_checkpoint_of_an_expired_commit_is_refused(local_root):
    """gc expired the run's commit before its first checkpoint: the save raises, naming
    the commit, and commits nothing."""
    project, c2, loader, _ = _run_on_c2(local_root, None)
    assert c2.id in project.gc(older_than=timedelta(0), keep_days=0).expired_commits
    head = project.branch().commit_id
    with pytest.raises(td.ExpiredCommit, match=rf"{c2.id[:8]}.*nothing was saved"):
        td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader)
    assert project.branch().commit_id == head


def _pin_while_gc_decides(local_root, monkeypatch, pin, key):
    """gc of ``_run_on_c2``'s store, ``pin(project, c2)`` run on a thread of its own once
    gc has decided to expire c2, until ``key`` is written: (project, c2, gc's report, the
    errors ``pin`` raised)."""
    import threading

    import treadle.catalog.gc as gc

    project, c2, _, _ = _run_on_c2(local_root, None)
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    where = key(project)

    def run() -> None:
        try:
            pin(td.Client(local_root).project("p"), c2)
        except BaseException as e:  # noqa: BLE001 - asserted by the callers
            errors.append(e)

    def seam(point: str) -> None:
        if point == "decided":
            threads.append(threading.Thread(target=run))
            threads[0].start()
            while not project.client.store.exists(where) and threads[0].is_alive():
                threading.Event().wait(0.01)

    monkeypatch.setattr(gc, "_at", seam)
    report = project.gc(older_than=timedelta(0), keep_days=0)
    threads[0].join()
    return project, c2, report, errors


def test_tag_made_after_gc_decided_is_refused_and_removed(local_root, monkeypatch):
    """A tag written after gc's last read of the pins cannot save the commit: the tagger
    gets ExpiredCommit naming it, and the tag does not stay behind naming a gone commit."""
    project, c2, report, errors = _pin_while_gc_decides(
        local_root, monkeypatch, lambda p, c2: p.tag("late", c2.id),
        lambda project: f"{project.prefix}/tags/late.json",
    )  # fmt: skip
    assert c2.id in report.expired_commits
    assert len(errors) == 1 and isinstance(errors[0], td.ExpiredCommit), errors
    assert c2.id[:8] in str(errors[0]) and project.tags() == {}


def test_a_branch_from_an_expired_commit_is_refused(local_root, monkeypatch):
    """create_branch from an expired commit made a branch whose head read nothing (an append
    on it failed on a missing data file); it is ExpiredCommit naming the commit, and no
    branch. One made after a gc decided is told so (its ref stays: refs are never deleted).
    Fails before: the branch was made both times, silently."""
    from treadle import layout

    project, c2, report, errors = _pin_while_gc_decides(
        local_root, monkeypatch, lambda p, c2: p.create_branch("late", from_=c2.id),
        lambda project: layout.ref_key(project.prefix, "late", 0),
    )  # fmt: skip
    assert c2.id in report.expired_commits
    assert len(errors) == 1 and isinstance(errors[0], td.ExpiredCommit), errors
    assert "'late' was made" in str(errors[0]) and c2.id[:8] in str(errors[0])
    with pytest.raises(td.ExpiredCommit, match=c2.id[:8]):
        project.create_branch("old", from_=c2.id)
    assert "old" not in project.branches()

"""Two gc --keep-days runs at once and a checkpoint saved between them.

gc X reads the pins, marks the run's commit pending, reads the pins again (no checkpoint
yet) and is about to make the mark final. gc Y read the pins before the checkpoint too
and marked the same commit pending. The checkpoint lands; its save waits while the commit
is pending. Y reads the pins again, sees the checkpoint, keeps the commit and drops *the*
pending mark, the one X wrote too: the save saw no mark left and returned, then X made
its mark final and deleted the commit's versions. A checkpoint whose save returned could
not resume (its run's table version gone). Each gc's pending mark is now its own: a
save waits until every gc that is deciding has decided.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch

import treadle as td
import treadle.catalog.gc as gc
from test_retention import _resumes, _run_on_c2


def test_a_checkpoint_between_two_gcs_is_kept_or_refused(local_root, monkeypatch):
    project, c2, loader, first = _run_on_c2(local_root, None)
    at: dict[str, threading.Event] = {}
    go: dict[str, threading.Event] = {}
    for k in ("X:decided", "Y:pending", "X:go", "Y:go"):
        (go if k.endswith(":go") else at)[k] = threading.Event()

    def seam(point: str) -> None:
        me = threading.current_thread().name
        if f"{me}:{point}" in at:
            at[f"{me}:{point}"].set()
            assert go[f"{me}:go"].wait(60)

    monkeypatch.setattr(gc, "_at", seam)
    reports: dict[str, object] = {}

    def run(name: str) -> None:
        fresh = td.Client(local_root).project("p")
        reports[name] = fresh.gc(older_than=timedelta(0), keep_days=0)

    x = threading.Thread(target=run, args=("X",), name="X")
    x.start()
    assert at["X:decided"].wait(60)  # X read the pins twice: no checkpoint
    y = threading.Thread(target=run, args=("Y",), name="Y")
    y.start()
    assert at["Y:pending"].wait(60)  # Y read them once and marked c2 pending
    saved: list[object] = []

    def save() -> None:
        try:
            saved.append(td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader))
        except td.ExpiredCommit as e:
            saved.append(e)

    head = project.branch().commit_id
    s = threading.Thread(target=save)
    s.start()
    while project.branch().commit_id == head:  # the row is committed: Y's re-read sees it
        threading.Event().wait(0.01)
    go["Y:go"].set()
    y.join(60)
    s.join(2)  # before: the save returned here, while X was still deciding
    go["X:go"].set()
    x.join(60)
    s.join(60)
    monkeypatch.undo()
    assert len(saved) == 1
    if isinstance(saved[0], td.ExpiredCommit):  # told at once: the commit is gone
        assert c2.id in reports["X"].expired_commits
        assert "cannot resume" in str(saved[0])
    else:  # the save returned: the checkpoint resumes
        _resumes(local_root, None, first)


def test_a_dead_gcs_pending_marker_is_not_waited_for_again(local_root, monkeypatch):
    """A gc that died between its pending and final markers leaves its pending marker, and
    no later gc drops another's: a save pinning that commit must not wait out the settle
    time (5 minutes) every time once the marker is older than that."""
    import os
    import time

    import treadle.catalog.expiry as expiry
    from treadle import layout

    project, c2, loader, first = _run_on_c2(local_root, None)
    key = layout.pending_key(project.prefix, c2.id, "dead-gc")
    project.client.store.put(key, b"{}")
    old = time.time() - 2 * expiry._SETTLE_S
    os.utime(os.path.join(local_root, key), (old, old))

    def no_wait(s: float) -> None:
        raise AssertionError("settle waited on a dead gc's pending marker")

    monkeypatch.setattr(expiry.time, "sleep", no_wait)
    td.Checkpoints(project.branch()).save(1, {"w": torch.zeros(2)}, loader)
    monkeypatch.undo()
    _resumes(local_root, None, first)

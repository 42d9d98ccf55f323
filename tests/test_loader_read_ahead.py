"""``TrainLoader(read_ahead=)`` / ``EvalLoader(read_ahead=)``: the object-store read-ahead
reaches every reader the loader makes (its own thread's, and each worker's through its job),
with the same batches; a value that cannot work is named when the loader is made.

Before: only ``SampleReader(read_ahead=)`` had the setting; a loader always used the default
(1 batch on a local store, 8 on an object store)."""

from __future__ import annotations

import pytest

import treadle as td
import treadle.read.steps as steps_mod
import treadle.torch.delivery as delivery
from loader_helpers import batch_hash, make_project, recipe


@pytest.fixture(scope="module")
def branch(tmp_path_factory):
    return make_project(str(tmp_path_factory.mktemp("ahead") / "store"), episodes=2, frames=16)


@pytest.fixture
def seen(monkeypatch):
    """The ``read_ahead`` of every SampleReader made in this process."""
    got: list[int] = []

    class Spy(steps_mod.SampleReader):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            got.append(self.read_ahead)

    monkeypatch.setattr(steps_mod, "SampleReader", Spy)
    return got


def test_train_loader_read_ahead_reaches_its_reader_with_the_same_batches(branch, seen):
    plan = recipe(branch).plan()
    want = [batch_hash(b) for b in td.TrainLoader(plan, steps=4)]
    assert seen == [1]  # a local store's default
    got = [batch_hash(b) for b in td.TrainLoader(plan, steps=4, read_ahead=3)]
    assert seen == [1, 3] and got == want


def test_eval_loader_read_ahead_reaches_its_reader(branch, seen):
    comp = td.Component(branch.table("failed"), td.Windows({"cam": td.Video(range(4))}))
    want = [batch_hash(b) for b in td.EvalLoader(comp, 8)]
    got = [batch_hash(b) for b in td.EvalLoader(comp, 8, read_ahead=5)]
    assert seen == [1, 5] and got == want


def test_workers_get_read_ahead_in_their_job(branch, monkeypatch):
    jobs = []

    def capture(job, workers, first=None):
        jobs.append(job)
        return iter(())

    monkeypatch.setattr(delivery, "read_in_processes", capture)
    plan = recipe(branch).plan()
    assert list(td.TrainLoader(plan, steps=4, workers=2, read_ahead=6)) == []
    assert list(td.TrainLoader(plan, steps=4, workers=2)) == []
    assert [j.read_ahead for j in jobs] == [6, None]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "8"])
def test_a_read_ahead_that_cannot_work_is_named(branch, bad):
    with pytest.raises(td.PlanError, match="read_ahead must be"):
        td.TrainLoader(recipe(branch), steps=1, read_ahead=bad)

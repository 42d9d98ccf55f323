"""TrainLoader resume at the loader level: positions moved while a loader is iterated."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("resume") / "store")
    rng = np.random.default_rng(0)
    branch = td.Client(root, create=True).project("p").branch()
    with branch.transaction("data") as tx:
        for name, lengths in (("a", (17, 23)), ("b", (29, 11))):
            for e, n in enumerate(lengths):
                act = rng.random((n, 3), dtype=np.float32)
                tx.table(name).append_episode({"act": act}, episode=f"{name}{e}")
    w = td.Windows({"act": td.Rows(range(-2, 3), pad=True)})
    comps = [td.Component(branch.table("a"), w, weight=0.3),
             td.Component(branch.table("b"), w, weight=0.7)]  # fmt: skip
    return td.Recipe(seed=9, batch_size=4, components=comps).plan()


@pytest.mark.parametrize("workers", [0, 2])
def test_load_state_dict_inside_the_loop_continues_at_its_step(plan, workers):
    """A rollback inside the loop (load an earlier checkpoint's state and go on): before,
    the live iterator went on with the batches it had read ahead (steps 4, 5 labelled 2,
    3: the state said one step while the model trained on another), and a rollback after
    the last batch was ignored. Now the loop continues at the state's step."""
    want = [b["_moment"].tolist() for b in td.TrainLoader(plan, steps=6)]
    loader = td.TrainLoader(plan, steps=6, workers=workers, prefetch=3)
    got, saved, rolled = [], {}, set()
    for batch in loader:
        got.append(batch["_moment"].tolist())
        saved.setdefault(loader.step, loader.state_dict())
        for at, back in ((4, 2), (6, 1)):  # mid-run, and after the last batch
            if loader.step == at and at not in rolled:
                rolled.add(at)
                loader.load_state_dict(saved[back])
    assert got == want[:4] + want[2:] + want[1:]
    assert loader.state_dict()["step"] == 6


def test_a_checkpoint_of_another_recipe_names_what_differs(tmp_path):
    """A checkpoint row loaded into a loader of another recipe: the error named two run ids
    and every field that could differ; now it names the ones that do."""
    branch = td.Client(str(tmp_path / "s"), create=True).project("p").branch()
    for name in ("a", "b"):
        branch.table(name).append_episode({"x": np.arange(12, dtype=np.float32)}, episode="e")

    def loader(weight):
        comps = [td.Component(branch.table("a"), weight=weight), td.Component(branch.table("b"))]
        return td.TrainLoader(td.Recipe(seed=1, batch_size=4, components=comps), steps=4)

    run = loader(1.0)
    next(iter(run))
    td.Checkpoints(branch).save(1, {}, run)
    state = td.Checkpoints(branch).latest().loader_state
    with pytest.raises(td.PlanError, match=r"components\[0\]\.weight: 1 in the state, 3 here"):
        loader(3.0).load_state_dict(state)
    branch.table("b").append_episode({"x": np.arange(5, dtype=np.float32)}, episode="f")
    with pytest.raises(td.PlanError, match=r"\(components\[1\]\.version: 1 in the state, 2 here\)"):
        loader(1.0).load_state_dict(state)


def test_a_state_past_steps_is_refused(plan):
    """steps= given as the steps left (2) to a state at step 4 of 6: the loader delivered
    nothing, and a training loop over it ended at once without a word."""
    state = td.TrainLoader(plan, steps=6).state_dict()
    state["step"] = 4
    client = plan.table(0).project.client
    with pytest.raises(td.PlanError, match=r"step 4, past this loader's steps=2: .*total"):
        td.TrainLoader.from_state(state, client, steps=2)
    with pytest.raises(td.PlanError, match=r"step 4, past this loader's steps=3"):
        td.TrainLoader(plan, steps=3).load_state_dict(state)
    assert len(td.TrainLoader.from_state(state, client, steps=4)) == 0  # a finished run


def test_iterating_a_finished_run_again_is_an_error_not_no_batches(plan):
    """``for epoch in ...: for b in loader`` over one TrainLoader(steps=N) trained N steps,
    then gave no batch at every later epoch, silently. A break mid-run, then iterating
    again, still continues the run; a rollback still goes back."""
    loader = td.TrainLoader(plan, steps=4)
    first = []
    for batch in loader:
        first.append(batch["_moment"].tolist())
        if loader.step == 2:
            break
    first += [b["_moment"].tolist() for b in loader]  # continues at step 2
    assert len(first) == 4
    with pytest.raises(td.PlanError, match=r"delivered its run \(steps=4\).*from_state"):
        iter(loader)
    state = loader.state_dict()
    state["step"] = 3
    loader.load_state_dict(state)
    assert [b["_moment"].tolist() for b in loader] == first[3:]
    client = plan.table(0).project.client
    more = td.TrainLoader.from_state(loader.state_dict(), client, steps=5)
    assert len(list(more)) == 1

"""transform=fn: seeds from (run seed, global position), the same output at any rank count,
after a resume and in workers; the shipped augmentations are seed-driven and vectorised."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import make_project, recipe
from treadle import transforms as tf
from treadle.plan.seeds import sample_seeds

AUG = tf.Augment(
    "cam", [tf.RandomResizedCrop((16, 16)), tf.HorizontalFlip(), tf.BrightnessContrast()]
)


def with_seeds(batch, seeds):
    """A transform that also shows its seeds (module level: it pickles into workers)."""
    out = AUG(batch, seeds)
    out["seed"] = torch.from_numpy(seeds.view(np.int64).copy())
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("aug") / "store")
    return root, make_project(root, episodes=2, frames=12)


def _by_position(loader, world: int, rank: int, b: int) -> dict[int, str]:
    """Global position -> hash of the transformed sample."""
    out = {}
    for batch in loader:
        step = loader.step - 1
        for j in range(len(batch["_moment"])):
            if "_valid" in batch and not batch["_valid"][j]:
                continue  # eval padding: a valid sample of another position read again
            h = hashlib.sha256()
            for k in sorted(batch):
                h.update(batch[k][j].contiguous().numpy().tobytes())
            out[step * b + rank + world * j] = h.hexdigest()[:16]
    return out


def test_seeds_are_a_pure_function_of_seed_and_position():
    a = sample_seeds(7, np.arange(10))
    assert a.dtype == np.uint64 and len(set(a.tolist())) == 10
    np.testing.assert_array_equal(a[3:5], sample_seeds(7, np.array([3, 4])))
    assert not np.array_equal(a, sample_seeds(8, np.arange(10)))


def test_same_transformed_samples_at_one_and_two_ranks_and_after_resume(project):
    root, branch = project
    plan = recipe(branch, batch_size=4).plan()
    one = _by_position(td.TrainLoader(plan, steps=4, transform=with_seeds), 1, 0, 4)
    two: dict[int, str] = {}
    for r in (0, 1):
        ld = td.TrainLoader(plan, steps=4, rank=r, world_size=2, transform=with_seeds)
        two.update(_by_position(ld, 2, r, 4))
    assert one == two and len(one) == 16
    ld = td.TrainLoader(plan, steps=2, transform=with_seeds)
    list(ld)
    resumed = td.TrainLoader.from_state(
        ld.state_dict(), td.Client(root), steps=4, transform=with_seeds
    )
    tail = _by_position(resumed, 1, 0, 4)
    assert tail == {p: h for p, h in one.items() if p >= 8}
    # the seed each sample saw is the plan's, by global position
    batch = next(iter(td.TrainLoader(plan, steps=1, rank=1, world_size=2, transform=with_seeds)))
    want = sample_seeds(plan.seed, plan.batch(0, 1, 2).position).view(np.int64)
    np.testing.assert_array_equal(batch["seed"].numpy(), want)
    assert tuple(batch["cam"].shape) == (2, 4, 16, 16, 3) and batch["cam"].dtype == torch.uint8


@pytest.mark.slow
def test_workers_give_the_same_transformed_batches(project):
    root, branch = project
    plan = recipe(branch, batch_size=4).plan()
    ref = _by_position(td.TrainLoader(plan, steps=3, transform=with_seeds), 1, 0, 4)
    got = _by_position(td.TrainLoader(plan, steps=3, workers=2, transform=with_seeds), 1, 0, 4)
    assert got == ref
    comp = td.Component(branch.table("nominal"), td.Windows({"cam": td.Video(range(2))}))
    e0 = _by_position(td.EvalLoader(comp, 4, transform=with_seeds), 1, 0, 4)
    e2 = _by_position(td.EvalLoader(comp, 4, transform=with_seeds, workers=2), 1, 0, 4)
    assert e0 == e2 and len(e0) == 22


def test_eval_transform_seeds_follow_eval_positions(project):
    root, branch = project
    comp = td.Component(branch.table("nominal"), td.Windows({"cam": td.Video(range(2))}))
    a = _by_position(td.EvalLoader(comp, 4, transform=with_seeds, seed=3), 1, 0, 4)
    b: dict[int, str] = {}
    for r in (0, 1):
        b.update(_by_position(td.EvalLoader(comp, 4, transform=with_seeds, seed=3, rank=r,
                                            world_size=2), 2, r, 4))  # fmt: skip
    assert a == b


def _drop_one(batch, seeds):
    return {k: v[:-1] for k, v in batch.items()}


def test_bad_transforms_are_named_errors(project):
    root, branch = project
    plan = recipe(branch, batch_size=4).plan()
    with pytest.raises(td.PlanError, match=r"step 0 returned list, not a dict"):
        next(iter(td.TrainLoader(plan, steps=1, transform=lambda b, s: [b])))
    with pytest.raises(
        td.PlanError,
        match=r"step 0 changed the batch length of key '(_component|_moment|action|cam)'",
    ):
        next(iter(td.TrainLoader(plan, steps=1, transform=_drop_one)))
    with pytest.raises(td.PlanError, match="cannot be pickled"):
        td.TrainLoader(plan, steps=1, workers=2, transform=lambda b, s: b)
    with pytest.raises(td.PlanError, match="callable"):
        td.TrainLoader(plan, steps=1, transform=3)
    comp = td.Component(branch.table("nominal"), td.Windows({"cam": td.Video(range(2))}))
    with pytest.raises(td.PlanError, match="eval step 0 changed the batch length"):
        next(iter(td.EvalLoader(comp, 4, transform=_drop_one)))


def _fail_at_step_1(batch, seeds):
    if int(seeds[0]) == int(sample_seeds(2048, np.array([4]))[0]):  # step 1's first sample
        raise ValueError("bad sample")
    return batch


def test_an_error_in_a_transform_names_its_step(project):
    """The user's exception comes through as itself, with a note naming the step (before,
    neither the message nor a note said which batch: a long run could not be replayed)."""
    root, branch = project
    plan = recipe(branch, batch_size=4, seed=2048).plan()
    got = []
    with pytest.raises(ValueError, match="bad sample") as e:
        for b in td.TrainLoader(plan, steps=3, transform=_fail_at_step_1):
            got.append(b)
    assert len(got) == 1
    assert "in the transform at step 1" in getattr(e.value, "__notes__", [])


def test_augmentations_are_seeded_and_vectorised():
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, (5, 3, 20, 24, 3), dtype=np.uint8)
    seeds = sample_seeds(1, np.arange(5))
    for op in (tf.RandomResizedCrop((10, 12)), tf.HorizontalFlip(), tf.BrightnessContrast()):
        whole = op(video, seeds)
        assert isinstance(whole, np.ndarray) and whole.dtype == np.uint8
        # the batch at once == each sample alone (vectorised, no cross-sample state)
        each = np.concatenate([op(video[i : i + 1], seeds[i : i + 1]) for i in range(5)])
        np.testing.assert_array_equal(whole, each)
        np.testing.assert_array_equal(op(torch.from_numpy(video), seeds).numpy(), whole)
        assert not np.array_equal(whole, op(video, sample_seeds(2, np.arange(5))))
    flipped = tf.HorizontalFlip(p=1.0)(video, seeds)
    np.testing.assert_array_equal(flipped, video[:, :, :, ::-1])
    # full-frame crop is the identity (up to resampling at the same size)
    same = tf.RandomResizedCrop((20, 24), scale=(1.0, 1.0), ratio=(24 / 20, 24 / 20))(video, seeds)
    np.testing.assert_array_equal(same, video)
    with pytest.raises(td.PlanError, match="seeds for a batch"):
        tf.HorizontalFlip()(video, seeds[:2])


def test_float_input_is_not_changed_in_place():
    x = torch.rand(2, 3, 8, 8, 3)
    before = x.clone()
    seeds = sample_seeds(0, np.arange(2))
    for op in (tf.RandomResizedCrop((4, 4)), tf.HorizontalFlip(p=1.0), tf.BrightnessContrast()):
        out = op(x, seeds)
        assert out.dtype == torch.float32
        assert torch.equal(x, before)

"""``EvalLoader``: every eligible moment of one component exactly once, in table order.

Positions ``0 .. N-1`` are the component's eligible moments in table order
(:meth:`treadle.plan.plan.Plan.eligible_moments`, pure). Rank ``r`` of ``W`` takes positions
``r, r + W, r + 2W, ...`` in batches of ``batch_size / W`` (so step ``k`` of every rank
together covers positions ``k * batch_size .. (k + 1) * batch_size - 1``). Every rank gets
the same number of batches, ``ceil(N / batch_size)``, each of ``batch_size / W`` samples, so
a per-batch collective (``all_reduce``, ``all_gather``) never waits on a rank that is done:
positions past ``N - 1`` are padding (position ``p % N`` read again) marked
``batch["_valid"] == False``; the valid samples of all ranks are each eligible moment exactly
once. Batches carry the same columns as ``TrainLoader``'s (the same reader), and
``_moment`` is the moment's row in the pinned table. ``state_dict()`` counts delivered
batches; ``from_state`` continues mid-pass at any world size dividing ``batch_size``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.exclude import drawn_from
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.read.steps import EvalSamples, eval_positions, eval_samples
from treadle.torch.delivery import StepLoader
from treadle.torch.hook import Transform
from treadle.torch.loader import check_state

__all__ = ["EvalLoader", "EvalSamples", "eval_positions", "eval_samples", "eval_steps"]

_STATE_KEYS = {"record", "step", "eval"}


def eval_steps(batch_size: int, rank: int, world: int, total: int) -> int:
    """Batches rank ``rank`` reads in one pass: ``ceil(total / batch_size)``, the same on every
    rank (``rank`` and ``world`` do not change it)."""
    return -(-total // batch_size)


def _eval_plan(component: Component | Plan, batch_size: int | None, seed: int) -> Plan:
    if isinstance(component, Plan):
        plan = component
    elif isinstance(component, Component):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise PlanError(f"EvalLoader batch_size must be an integer, got {batch_size!r}")
        plan = Recipe(seed=seed, batch_size=int(batch_size), components=[component]).plan()
    else:
        raise PlanError(f"EvalLoader takes a td.Component, got {type(component).__name__}")
    if plan.num_components != 1:
        raise PlanError(f"an eval plan has one component, this one has {plan.num_components}")
    return plan


class EvalLoader(StepLoader):
    """Iterate one pass over every eligible moment of ``component`` for this rank.

    ``batch_size`` is the global batch (``batch_size % world_size == 0``; each rank gets
    ``batch_size / world_size`` per step, the last ones padded: ``batch["_valid"]``, bool
    ``[b]``, is False for padding; weight a metric by it). ``transform``, ``workers``, ``prefetch``,
    ``video_threads`` and ``read_ahead`` (batches fetched ahead of the one being assembled)
    work as in ``TrainLoader``; ``seed`` only feeds the transform's seeds.
    """

    sampler = staticmethod(eval_samples)
    label = "eval step"

    def __init__(
        self,
        component: Component | Plan,
        batch_size: int | None = None,
        *,
        device: str | torch.device = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        transform: Transform | None = None,
        workers: int = 0,
        prefetch: int = 2,
        video_threads: int | None = None,
        seed: int = 0,
        read_ahead: int | None = None,
    ):
        super().__init__(lambda: _eval_plan(component, batch_size, seed), device=device,
                         rank=rank, world_size=world_size, prefetch=prefetch, workers=workers,
                         video_threads=video_threads, transform=transform,
                         read_ahead=read_ahead)  # fmt: skip
        plan = self.plan
        self.num_moments = drawn_from(plan).eligible(0)  # a derived run's: kept moments
        self.steps = eval_steps(plan.batch_size, self.rank, self.world_size, self.num_moments)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"record", "step", "eval": 1}``."""
        return {"record": self.plan.record.to_dict(), "step": self._next_step, "eval": 1}

    @classmethod
    def from_state(cls, state: dict[str, Any], client: Any, **kwargs: Any) -> EvalLoader:
        """An eval loader for the pass in ``state`` (its pinned versions), at its step."""
        record, step = check_state(state, _STATE_KEYS, "eval loader")
        loader = cls(Plan.from_record(record, client), **kwargs)
        loader._next_step = step
        return loader

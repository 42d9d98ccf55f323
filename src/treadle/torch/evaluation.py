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

One component of a mix: ``EvalLoader(plan, batch_size, only="so100")`` reads that
component's moments with the whole plan's reader, so the batch has the keys, masks and
flags the plan's ``TrainLoader`` gives (``<col>_dim_mask``, ``<col>_is_present``,
``<col>_is_pad``, zeros of an optional column the robot lacks) and ``_component`` is its
index in ``plan.components``: a model trained on the mix evaluates on one robot as it is.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch

from treadle.errors import PlanError
from treadle.plan.batch import check_rank
from treadle.plan.exclude import drawn_from
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.read.budget import check_batch_fits
from treadle.read.steps import EvalSamples, eval_positions, eval_samples
from treadle.torch.delivery import StepLoader
from treadle.torch.hook import Transform
from treadle.torch.loader import check_state

__all__ = ["EvalLoader", "EvalSamples", "eval_positions", "eval_samples", "eval_steps"]

_STATE_KEYS = {"record", "step", "eval"}
_MIX_KEYS = _STATE_KEYS | {"component", "batch_size"}  # one component of a mix


def eval_steps(batch_size: int, rank: int, world: int, total: int) -> int:
    """Batches rank ``rank`` reads in one pass: ``ceil(total / batch_size)``, the same on every
    rank (``rank`` and ``world`` do not change it)."""
    return -(-total // batch_size)


def _batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise PlanError(f"EvalLoader batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise PlanError(f"EvalLoader batch_size must be >= 1, got {batch_size}")
    return int(batch_size)


def _eval_plan(
    component: Component | Plan, batch_size: int | None, seed: int, only: str | int | None
) -> Plan:
    if isinstance(component, Plan):
        plan = component
    elif isinstance(component, Component):
        if only is not None:
            raise PlanError("EvalLoader only= picks a component of a plan; give it the plan")
        plan = Recipe(seed=seed, batch_size=_batch_size(batch_size), components=[component]).plan()
    else:
        raise PlanError(f"EvalLoader takes a td.Component, got {type(component).__name__}")
    if plan.num_components != 1 and only is None:
        raise PlanError(
            f"this plan has {plan.num_components} components ({plan.components}): name the one "
            "to evaluate, EvalLoader(plan, batch_size, only=<name or index>)"
        )
    return plan


def _pick(plan: Plan, only: str | int | None) -> int:
    """The index in ``plan.components`` of ``only`` (a name or an index)."""
    if only is None:
        return 0
    if isinstance(only, str):
        if only not in plan.components:
            raise PlanError(
                f"EvalLoader only={only!r}: the plan's components are {plan.components}"
            )
        return plan.components.index(only)
    if isinstance(only, bool) or not isinstance(only, (int, np.integer)):
        raise PlanError(f"EvalLoader only= takes a component name or index, got {only!r}")
    if not 0 <= only < plan.num_components:
        raise PlanError(f"EvalLoader only={only}: components are 0..{plan.num_components - 1}")
    return int(only)


class EvalLoader(StepLoader):
    """Iterate one pass over every eligible moment of ``component`` for this rank.

    ``batch_size`` is the global batch (``batch_size % world_size == 0``; each rank gets
    ``batch_size / world_size`` per step, the last ones padded: ``batch["_valid"]``, bool
    ``[b]``, is False for padding; weight a metric by it). ``transform``, ``workers``, ``prefetch``,
    ``video_threads``, ``lookahead`` and ``read_ahead`` (batches fetched ahead of the one being assembled)
    work as in ``TrainLoader``; ``seed`` only feeds the transform's seeds.

    ``component`` may be a plan: one of one component, or of several with ``only=`` naming
    the one to evaluate (a name in ``plan.components`` or an index; ``batch_size`` defaults
    to the plan's, and a given one is this pass's at any world size dividing it): batches
    then have the plan's keys and masks, as training does.
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
        only: str | int | None = None,
        lookahead: int | None = None,
    ):
        # a plan's own batch size unless one is asked (a Component's plan is built with it)
        asked = batch_size is not None and isinstance(component, Plan)
        self._asked = _batch_size(batch_size) if asked else None
        super().__init__(lambda: _eval_plan(component, batch_size, seed, only), device=device,
                         rank=rank, world_size=world_size, prefetch=prefetch, workers=workers,
                         video_threads=video_threads, transform=transform,
                         read_ahead=read_ahead, lookahead=lookahead)  # fmt: skip
        plan = self.plan
        self.component = _pick(plan, only)
        self.batch_size = plan.batch_size if self._asked is None else self._asked
        self._mix = only is not None or self._asked is not None
        if self._mix:  # one component (of a mix), the plan's reader, this pass's batch size
            self.sampler = partial(eval_samples, component=self.component,
                                   batch_size=self.batch_size)  # fmt: skip
        self.num_moments = drawn_from(plan).eligible(self.component)  # a derived run's: kept
        self.steps = eval_steps(self.batch_size, self.rank, self.world_size, self.num_moments)

    def _over(self) -> str:
        return (
            f"this EvalLoader has delivered its pass ({self.steps} batches of "
            f"{self.num_moments} moments): make a new EvalLoader for each validation pass"
        )

    def _check_world(self, plan: Plan) -> None:
        """As a ``TrainLoader``'s, with this pass's batch size (a mix's may be its own)."""
        b = plan.batch_size if self._asked is None else self._asked
        check_batch_fits(plan, b // max(1, self.world_size))
        check_rank(self.rank, self.world_size, b)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"record", "step", "eval": 1}`` (and ``"component"``,
        ``"batch_size"`` for one component of a mix)."""
        out = {"record": self.plan.record.to_dict(), "step": self._next_step, "eval": 1}
        if self._mix:
            out.update(component=self.component, batch_size=self.batch_size)
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], client: Any, **kwargs: Any) -> EvalLoader:
        """An eval loader for the pass in ``state`` (its pinned versions), at its step."""
        mix = isinstance(state, dict) and "component" in state
        record, step = check_state(state, _MIX_KEYS if mix else _STATE_KEYS, "eval loader")
        if mix:
            kwargs.update(only=state["component"], batch_size=state["batch_size"])
        loader = cls(Plan.from_record(record, client), **kwargs)
        loader._next_step = step
        return loader

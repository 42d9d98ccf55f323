"""``TrainLoader``: the plan's batches for this rank, as device tensors, resumable.

A thin adapter: step ``k``'s samples are ``plan.batch(k, rank, world_size)``; the shared
delivery loop (:mod:`treadle.torch.delivery`) hands the reader
(:class:`treadle.read.sample_reader.SampleReader`) exactly the steps to deliver and decides
*where* that work runs:

- ``workers=0``: one background thread reads up to ``prefetch`` steps ahead into a
  bounded queue (I/O and decode overlap with the training step).
- With ``device="cuda"``, video is decoded by NVDEC straight into device tensors when
  the hardware can (``treadle.gpu.select_backend``), else on the CPU with a one-time
  warning; the same frames either way.
- ``workers=N``: N worker processes forked from a preloaded server (not from this process:
  Lance is not fork-safe; :mod:`treadle.workers.processes`); worker ``k`` reads steps
  ``start+k, start+k+N, ...`` and hands each batch over through a reused shared-memory
  slot; the loader takes them back in step order. Use it when decode needs more than one
  core (PyAV decode does not run in parallel across Python threads). Without a
  ``transform``, the loader reads the first step itself while its workers start.

Order is always the plan's order. ``state_dict()`` counts batches *delivered* to the
caller, never those prefetched, so a resumed loader continues with exactly the next
batch, at any world size that divides the batch size.
"""

from __future__ import annotations

from typing import Any

import torch

from treadle.errors import PlanError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Recipe
from treadle.plan.record import RunRecord
from treadle.read.columns import output_columns
from treadle.read.steps import train_samples
from treadle.torch.delivery import StepLoader, default_rank_world
from treadle.torch.hook import Transform

__all__ = ["TrainLoader", "default_rank_world", "train_samples"]

_STATE_KEYS = {"record", "step"}


def _train_plan(recipe_or_plan: Recipe | Plan) -> Plan:
    if isinstance(recipe_or_plan, Recipe):
        return recipe_or_plan.plan()
    if isinstance(recipe_or_plan, Plan):
        return recipe_or_plan
    raise PlanError(
        f"TrainLoader takes a td.Recipe or td.Plan, got {type(recipe_or_plan).__name__}"
    )


class TrainLoader(StepLoader):
    """Iterate device batches ``dict[str, torch.Tensor]`` of a recipe or plan for this rank.

    Every window column is stacked as ``[b, time, ...]`` (video ``uint8 [b, T, H, W, 3]``
    unless its spec's transform says otherwise), every other column as ``[b, ...]``, plus
    ``_component`` and ``_moment`` (int64 ``[b]``); ``b = batch_size / world_size``.

    ``steps`` bounds the run (None: forever). ``prefetch`` is how many steps are read
    ahead; ``workers`` > 0 reads in that many worker processes; ``video_threads`` decode
    threads per reader (default: one per core, up to 4; 1 per worker process).
    ``read_ahead``: how many batches' row takes and video bytes each reader fetches while
    one is assembled (None: 1 on a local store, ``CONCURRENCY.cloud_read_ahead``, 8, on an
    object store, where each request waits a round trip; fewer while that many batches'
    bytes exceed ``CONCURRENCY.read_ahead_bytes``); decoded frames are never read ahead.
    ``lookahead``: on an object store, fetch the chunks that the next ``lookahead`` steps'
    rows need into the node's chunk cache (:mod:`treadle.read.lookahead`; None: off;
    ``workers=0`` only); rows of tables past the object cache are then read from it.
    ``transform``: ``fn(batch, seeds) -> batch`` on the reader side (:mod:`treadle.torch.hook`).
    """

    sampler = staticmethod(train_samples)

    def __init__(
        self,
        recipe_or_plan: Recipe | Plan,
        *,
        device: str | torch.device = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        steps: int | None = None,
        prefetch: int = 2,
        workers: int = 0,
        video_threads: int | None = None,
        transform: Transform | None = None,
        read_ahead: int | None = None,
        lookahead: int | None = None,
    ):
        super().__init__(lambda: _train_plan(recipe_or_plan), device=device, rank=rank,
                         world_size=world_size, prefetch=prefetch, workers=workers,
                         video_threads=video_threads, transform=transform,
                         read_ahead=read_ahead, lookahead=lookahead)  # fmt: skip
        if steps is not None and (int(steps) < 0):
            raise PlanError(f"steps must be >= 0, got {steps}")
        self.steps = None if steps is None else int(steps)
        self._columns = output_columns(self.plan)  # fail now on components that cannot stack

    def _over(self) -> str:
        return (
            f"this TrainLoader has delivered its run (steps={self.steps}): to train on, "
            "make a loader with a larger steps= (TrainLoader.from_state(loader."
            "state_dict(), client, steps=...) continues this run), or "
            "load_state_dict() an earlier state to go back"
        )

    # -- resume ------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"record": <run record>, "step": <next step not yet delivered>}``.

        ``steps=`` is not in it (it is no part of the run): pass it to
        :meth:`from_state` again, or the resumed loader runs forever."""
        return {"record": self.plan.record.to_dict(), "step": self._next_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly at ``state["step"]``; the state must come from this run.

        Also inside the loop (a rollback): the live iterator drops what it read ahead and
        goes on at that step."""
        record, step = check_state(state)
        if record.run_id != self.plan.run_id:
            differ = "; ".join(record_differences(record.identity(), self.plan.record.identity()))
            raise PlanError(
                f"loader state is from run {record.run_id}, this loader plans run "
                f"{self.plan.run_id} ({differ or 'their records differ'}); build the loader "
                "with TrainLoader.from_state(state, client) instead"
            )
        self._resume_at(step)

    @classmethod
    def from_state(cls, state: dict[str, Any], client: Any, **kwargs: Any) -> TrainLoader:
        """A loader for the run in ``state`` (its pinned versions), continuing at its step.

        ``kwargs`` are ``TrainLoader``'s (``device``, ``rank``, ``world_size``, ...), none of
        them kept in ``state``: pass ``steps=`` again (the same total, counted from step 0,
        not the steps left), or the resumed loader runs forever. It cannot warn: a state
        looks the same whether its loader had ``steps=`` or none."""
        record, step = check_state(state)
        loader = cls(Plan.from_record(record, client), **kwargs)
        loader._resume_at(step)
        return loader

    def _resume_at(self, step: int) -> None:
        # a state past steps= delivered nothing, silently: steps= given as the steps left
        if self.steps is not None and step > self.steps:
            raise PlanError(
                f"loader state is at step {step}, past this loader's steps={self.steps}: "
                "steps= is the run's total, counted from step 0 (not the steps left)"
            )
        self._next_step = step


def check_state(
    state: Any, keys: set[str] = _STATE_KEYS, what: str = "loader"
) -> tuple[RunRecord, int]:
    """The run record and step of a loader's ``state_dict`` (with exactly ``keys``)."""
    if not isinstance(state, dict) or set(state) != keys:
        raise PlanError(f"{what} state must be a dict with keys {sorted(keys)}")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PlanError(f"{what} state step must be an integer >= 0, got {step!r}")
    return RunRecord.from_json(state["record"]), step


def record_differences(theirs: Any, ours: Any, path: str = "", most: int = 4) -> list[str]:
    """Where two run identities (``RunRecord.identity()``) differ, at most ``most``:
    ``"seed: 3 in the state, 4 here"``."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        pairs = [(f"{path}.{k}" if path else str(k), theirs.get(k), ours.get(k))
                 for k in sorted(set(theirs) | set(ours)) if k != "run_id"]  # fmt: skip
    elif isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        pairs = [(f"{path}[{i}]", a, b) for i, (a, b) in enumerate(zip(theirs, ours))]
    else:
        if theirs == ours:
            return []
        return [f"{path}: {_short(theirs)} in the state, {_short(ours)} here"]
    out: list[str] = []
    for where, a, b in pairs:
        out += record_differences(a, b, where, most - len(out))
        if len(out) >= most:
            break
    return out[:most]


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) > 16:  # a commit id
        return repr(value[:12]) + "..."
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

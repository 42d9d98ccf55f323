"""The demo behind ``treadle demo``: what it does is in :mod:`treadle.cli.cmd_demo`'s docstring
(the command's ``--help``); this module makes the project, trains, and replays the crash."""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch
from tqdm import tqdm

import treadle as td
from treadle.plan.card import render_card

PROJECT = "robotics"
TABLES = {"failed_grasps": 6, "nominal_grasps": 14}  # episodes per table
FRAMES, SIZE = 72, 64
_T = TypeVar("_T")


class Phase:
    """Progress of one phase: a tqdm bar on a terminal, else one line when it ends.

    ``quiet`` silences both. The bar goes to stderr (tqdm's ``disable=None``: only when
    stderr is a TTY); the line goes to stdout with the rest of the demo's report.
    """

    def __init__(self, desc: str, total: int, unit: str, quiet: bool) -> None:
        self.desc, self.total, self.unit, self.quiet = desc, total, unit, quiet
        self.done = 0
        self.note = ""
        self._t0 = time.perf_counter()
        self._bar = tqdm(total=total, desc=desc, unit=unit, disable=True if quiet else None)

    def update(self, n: int = 1) -> None:
        self.done += n
        self._bar.update(n)

    def set_note(self, note: str) -> None:
        """A short status (``loss 0.0123``) shown on the bar and in the closing line."""
        self.note = note
        self._bar.set_postfix_str(note, refresh=False)

    def iterate(self, items: Iterable[_T]) -> Iterator[_T]:
        for item in items:
            yield item
            self.update()

    def close(self, failed: bool = False) -> None:
        """End the bar; off a terminal, print the phase's line unless it ``failed`` (a
        "0/20 episodes" line above the error read as a phase that had finished)."""
        self._bar.close()
        if not self.quiet and self._bar.disable and not failed:
            note = f", {self.note}" if self.note else ""
            secs = time.perf_counter() - self._t0
            print(f"{self.desc}: {self.done}/{self.total} {self.unit}{note} ({secs:.1f} s)")
            sys.stdout.flush()

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(failed=kind is not None)


def _episode(rng: np.random.Generator, failed: bool) -> dict[str, Any]:
    """A dot that moves with the first two action dimensions (and jitters on failures)."""
    action = np.cumsum(rng.normal(0, 0.08, (FRAMES, 7)), axis=0).astype(np.float32)
    action = np.tanh(action)
    frames = np.zeros((FRAMES, SIZE, SIZE, 3), np.uint8)
    frames[..., 2] = 40
    xy = ((action[:, :2] + 1) / 2 * (SIZE - 8)).astype(int)
    if failed:
        xy = np.clip(xy + rng.integers(-6, 7, xy.shape), 0, SIZE - 8)
    for t, (x, y) in enumerate(xy):
        frames[t, y : y + 8, x : x + 8] = (250, 200, 30)
    return {"wrist_camera": td.VideoFrames(frames, fps=30), "action": action}


def ensure_project(client: td.Client, quiet: bool = False) -> td.Branch:
    """The demo project, created on first use (one commit for both tables)."""
    branch = client.project(PROJECT).branch("main")
    have = set(branch.tables()) if branch.project.exists() else set()
    if set(TABLES) <= have:
        return branch
    rng = np.random.default_rng(2048)
    total = sum(TABLES.values())
    with Phase("creating demo episodes", total, "episodes", quiet) as bar:
        with branch.transaction("demo: synthetic grasp episodes") as tx:
            for name, n in TABLES.items():
                for e in range(n):
                    ep = _episode(rng, failed=name.startswith("failed"))
                    tx.table(name).append_episode(ep, episode=f"{name}-{e:04d}")
                    bar.update()
    return branch


# padded: the last moments of every episode are anchors too (the card keeps 100%)
WINDOWS = td.Windows(
    {
        "wrist_camera": td.Video(range(0, 8, 2), pad=True),
        "action": td.Rows(range(8), pad=True),
    }
)


def build_recipe(branch: td.Branch) -> td.Recipe:
    windows = WINDOWS
    return td.Recipe(
        seed=2048,
        batch_size=32,
        components=[
            td.Component(branch.table("failed_grasps"), windows, weight=0.3),
            td.Component(branch.table("nominal_grasps"), windows, weight=0.7),
        ],
    )


class TinyPolicy(torch.nn.Module):
    """Frames -> next 8 actions: pooled pixels through a small MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4 * 3 * 16 * 16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8 * 7)
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        b, t, h, w, c = frames.shape
        x = frames.permute(0, 1, 4, 2, 3).float().div(255).reshape(b * t, c, h, w)
        x = torch.nn.functional.adaptive_avg_pool2d(x, 16).reshape(b, -1)
        return self.net(x).reshape(b, 8, 7)


def _hash(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(batch[k].contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def _interleave(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Global batch from rank batches: rank r holds slots r, r+W, ..."""
    w = len(parts)
    out = {}
    for k in parts[0]:
        stacked = torch.stack([p[k] for p in parts], dim=1)  # [b, W, ...]
        out[k] = stacked.reshape(-1, *parts[0][k].shape[1:]) if w else stacked
    return out


def run(
    root: str | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    steps: int = 200,
    checkpoint_every: int = 50,
    check: int = 6,
    quiet: bool = False,
) -> int:
    """The whole demo (the module docstring's four parts); 0 when every batch matches."""
    t0 = time.perf_counter()
    client = td.Client(root, storage_options or None, create=True)
    print(f"store: {client.root}")
    branch = ensure_project(client, quiet)
    recipe = build_recipe(branch)
    plan = recipe.plan()
    print()
    print(render_card(plan.record, world_size=2, plan=plan))
    print()

    torch.manual_seed(0)
    policy = TinyPolicy()
    ckpts = td.Checkpoints(branch, table="checkpoints")
    crash_at = max(1, steps - check)
    # actions normalised with the nominal table's statistics (computed once per version)
    stats = plan.table(1).stats(["action"])["action"]
    norm = (torch.from_numpy(stats.mean).float(), torch.from_numpy(stats.std).float() + 1e-6)
    seen = _train(plan, policy, ckpts, norm, steps, checkpoint_every, crash_at, quiet)
    print(f"checkpoint rows saved every {checkpoint_every} steps and at step {crash_at}")
    _validate(plan, policy, norm)

    # A crash: everything in memory is gone. Restart from the latest checkpoint row, on 2 ranks.
    row = ckpts.latest(plan.run_id)
    if row is None:
        print("no checkpoint row was saved (run more steps)")
        return 1
    ok = _replay(client, row, seen, steps)
    restored = TinyPolicy()
    restored.load_state_dict(row.model_state()["policy"])
    print(f"\n{'every batch matches' if ok else 'MISMATCH'}; policy restored from row at step "
          f"{row.step}; {time.perf_counter() - t0:.0f}s in all")  # fmt: skip
    return 0 if ok else 1


def _train(
    plan: td.Plan,
    policy: TinyPolicy,
    ckpts: td.Checkpoints,
    norm: tuple[torch.Tensor, torch.Tensor],
    steps: int,
    checkpoint_every: int,
    crash_at: int,
    quiet: bool,
) -> dict[int, str]:
    """Train ``steps`` steps, saving checkpoint rows up to ``crash_at``; each step's batch hash."""
    mean, std = norm
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    loader = td.TrainLoader(plan, steps=steps, prefetch=4)
    seen: dict[int, str] = {}
    bar = Phase("training", steps, "steps", quiet)
    for batch in bar.iterate(loader):
        step = loader.step - 1
        seen[step] = _hash(batch)
        pred = policy(batch["wrist_camera"])
        loss = torch.nn.functional.mse_loss(pred, (batch["action"] - mean) / std)
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_note(f"loss {loss.item():.4f}")
        if loader.step <= crash_at and (
            loader.step % checkpoint_every == 0 or loader.step == crash_at
        ):
            ckpts.save(loader.step, {"policy": policy.state_dict()}, loader)
    bar.close()
    return seen


def _validate(plan: td.Plan, policy: TinyPolicy, norm: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Every eligible moment of the failed grasps once, in table order."""
    mean, std = norm
    val = td.EvalLoader(td.Component(plan.table(0), WINDOWS), 64)
    total, n = 0.0, 0
    with torch.no_grad():
        for vb in val:
            err = (policy(vb["wrist_camera"]) - (vb["action"] - mean) / std) ** 2
            valid = vb["_valid"]  # the last batch is padded: padding counts for nothing
            total += float(err.mean(dim=(1, 2))[valid].sum())
            n += int(valid.sum())
    print(f"validation on failed_grasps: {n} moments once each, loss {total / n:.4f}")


def _replay(client: td.Client, row: td.CheckpointRow, seen: dict[int, str], steps: int) -> bool:
    """Restart from ``row`` on 2 ranks; whether every global batch equals the one trained on."""
    restart = row.loader_state["step"]
    state = row.loader_state
    print(
        f"\nsimulated crash after step {steps - 1}; restarting from the latest checkpoint row "
        f"(step {restart}) on 2 ranks instead of 1"
    )
    ranks = [
        td.TrainLoader.from_state(state, client, rank=r, world_size=2, steps=steps)
        for r in range(2)
    ]
    ok = True
    for step, parts in zip(range(restart, steps), zip(*ranks)):
        again = _hash(_interleave(list(parts)))
        same = again == seen[step]
        ok &= same
        print(f"  step {step:>4}: before {seen[step]}  after restart {again}  "
              f"{'match' if same else 'DIFFERENT'}")  # fmt: skip
    return ok

"""Checkpoints as rows: one row per checkpoint, written in one commit.

A row holds the run id, the step, the run record, the loader position and the
model/optimizer state (``torch.save`` bytes, with its sha256, checked on read). Only the checkpoint table changes, so
no run's pinned tables (and so no run id) move when a checkpoint is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from treadle.errors import CorruptData, NotFound, PlanError

_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("time", pa.float64()),
        pa.field("record", pa.string()),
        pa.field("loader_state", pa.string()),
        pa.field("state", pa.large_binary()),
        pa.field("state_sha256", pa.string()),
    ]
)
_META = ["run_id", "step", "time"]


@dataclass(frozen=True)
class CheckpointRow:
    """One saved checkpoint."""

    run_id: str
    step: int
    time: float
    record: dict[str, Any]
    loader_state: dict[str, Any]
    state_bytes: bytes

    def model_state(self, map_location: str | torch.device = "cpu") -> Any:
        """The saved model/optimizer state (``torch.load`` with ``weights_only=True``)."""
        return torch.load(
            io.BytesIO(self.state_bytes), map_location=map_location, weights_only=True
        )


class Checkpoints:
    """Checkpoint rows in table ``table`` of ``branch``."""

    def __init__(self, branch: Any, table: str = "checkpoints"):
        self.branch = branch
        self.table = branch.table(table)

    def save(self, step: int, model_state: Any, loader: Any) -> CheckpointRow:
        """Store one row (one commit): ``model_state`` and ``loader``'s position."""
        state = loader.state_dict()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise PlanError(f"checkpoint step must be an integer >= 0, got {step!r}")
        buf = io.BytesIO()
        torch.save(model_state, buf)
        run_id = loader.run_id
        row = CheckpointRow(run_id, int(step), time.time(), state["record"], state, buf.getvalue())
        data = pa.table(
            {
                "run_id": [row.run_id],
                "step": [row.step],
                "time": [row.time],
                "record": [json.dumps(row.record, sort_keys=True)],
                "loader_state": [json.dumps(state, sort_keys=True)],
                "state": pa.array([row.state_bytes], pa.large_binary()),
                "state_sha256": [hashlib.sha256(row.state_bytes).hexdigest()],
            },
            schema=_SCHEMA,
        )
        self.table.append(data, message=f"checkpoint run {run_id[:8]} step {row.step}")
        return row

    def latest(self, run_id: str | None = None) -> CheckpointRow | None:
        """The checkpoint with the highest step (of ``run_id`` if given); None if none."""
        if run_id is not None and not re.fullmatch(r"[0-9a-f]{4,64}", str(run_id)):
            raise PlanError(f"run_id must be hex, got {run_id!r}")
        try:
            table = self.table.pin()
        except NotFound:
            return None
        meta = table.to_arrow(_META)
        runs = np.asarray(meta.column("run_id").to_pylist(), dtype=object)
        steps = meta.column("step").to_numpy()
        mask = np.ones(len(steps), bool) if run_id is None else runs == run_id
        if not mask.any():
            return None
        rows = np.flatnonzero(mask)
        best = rows[np.lexsort((rows, steps[rows]))[-1]]  # highest step, then latest row
        got = table.take([int(best)]).to_pylist()[0]
        state = bytes(got["state"])
        if hashlib.sha256(state).hexdigest() != got["state_sha256"]:
            raise CorruptData(
                f"checkpoint table {self.table.name!r}: the state of run {got['run_id']} step "
                f"{got['step']} does not match its sha256 (stored bytes are damaged)"
            )
        return CheckpointRow(
            got["run_id"],
            int(got["step"]),
            float(got["time"]),
            json.loads(got["record"]),
            json.loads(got["loader_state"]),
            state,
        )

"""Checkpoints as rows: one row per checkpoint, written in one commit.

A row holds the run id, the step, the time, the run record, the loader position and
the model/optimizer state (``torch.save`` bytes). Every field is covered by a sha256
digest stored beside it (the ``digests`` column); :meth:`Checkpoints.latest` checks the
run id, step and time of every row before choosing one and the rest of the chosen row
before returning it, so a flipped bit never resumes a run at another step or position.
Only the checkpoint table changes, so no run's pinned tables (and so no run id) move
when a checkpoint is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from treadle.catalog.expiry import expired_key, settle
from treadle.errors import CorruptData, ExpiredCommit, NotFound, PlanError

_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("time", pa.float64()),
        pa.field("record", pa.string()),
        pa.field("loader_state", pa.string()),
        pa.field("state", pa.large_binary()),
        pa.field("digests", pa.string()),
    ]
)
_META = ["run_id", "step", "time"]  # checked for every row: they choose the row
_FIELDS = [*_META, "record", "loader_state", "state"]


def _field_bytes(name: str, value: Any) -> bytes:
    """The bytes a field's digest is computed from (as stored in its column)."""
    if name == "step":
        return str(int(value)).encode()
    if name == "time":
        return float(value).hex().encode()
    if name == "state":
        return bytes(value)
    return str(value).encode()


def _digest(name: str, value: Any) -> str:
    return hashlib.sha256(name.encode() + b"\0" + _field_bytes(name, value)).hexdigest()


def _size(n: int) -> str:
    """``n`` bytes, readably (``64.0 MB``)."""
    scaled = float(n)
    for unit in ("B", "KB", "MB"):
        if scaled < 1000:
            return f"{n} B" if unit == "B" else f"{scaled:.1f} {unit}"
        scaled /= 1000
    return f"{scaled:.1f} GB"


@dataclass(frozen=True)
class CheckpointRow:
    """One saved checkpoint."""

    run_id: str
    step: int
    time: float
    record: dict[str, Any] = field(repr=False)
    loader_state: dict[str, Any] = field(repr=False)
    state_bytes: bytes = field(repr=False)

    def model_state(self, map_location: str | torch.device = "cpu") -> Any:
        """The saved model/optimizer state (``torch.load`` with ``weights_only=True``)."""
        return torch.load(
            io.BytesIO(self.state_bytes), map_location=map_location, weights_only=True
        )

    def __repr__(self) -> str:  # short whatever the state's size; nothing but ids and sizes
        return (
            f"CheckpointRow(step={self.step}, run={self.run_id[:8]}, "
            f"state={_size(len(self.state_bytes))})"
        )


class Checkpoints:
    """Checkpoint rows in table ``table`` of ``branch``."""

    def __init__(self, branch: Any, table: str = "checkpoints"):
        self.branch = branch
        self.table = branch.table(table)

    def __repr__(self) -> str:
        return f"Checkpoints({self.branch.project.name}/{self.table.name} @ {self.branch.name})"

    @property
    def _where(self) -> str:
        b = self.branch
        return (
            f"checkpoint table {self.table.name!r} of project {b.project.name!r} branch {b.name!r}"
        )

    def save(self, step: int, model_state: Any, loader: Any) -> CheckpointRow:
        """Store one row (one commit): ``model_state`` and ``loader``'s position."""
        state = loader.state_dict()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise PlanError(f"checkpoint step must be an integer >= 0, got {step!r}")
        buf = io.BytesIO()
        torch.save(model_state, buf)
        run_id = loader.run_id
        row = CheckpointRow(run_id, int(step), time.time(), state["record"], state, buf.getvalue())
        values = {
            "run_id": row.run_id,
            "step": row.step,
            "time": row.time,
            "record": json.dumps(row.record, sort_keys=True),
            "loader_state": json.dumps(state, sort_keys=True),
            "state": row.state_bytes,
        }
        digests = json.dumps({k: _digest(k, v) for k, v in values.items()}, sort_keys=True)
        data = pa.table(
            {
                **{k: [v] for k, v in values.items() if k != "state"},
                "state": pa.array([row.state_bytes], pa.large_binary()),
                "digests": [digests],
            },
            schema=_SCHEMA,
        )
        self._check_place(loader, row.record)
        pins = self._pins(row.record)
        project, prefix = self.branch.project, self.branch.project.prefix
        gone = [c for c in pins if project.client.store.exists(expired_key(prefix, c))]
        if gone:
            raise ExpiredCommit(self._expired(gone[0], "nothing was saved"))
        self.table.append(data, message=f"checkpoint run {run_id[:8]} step {row.step}")
        late = settle(project.place, pins)  # a gc --keep-days that decided before it saw this row
        if late:
            raise ExpiredCommit(self._expired(late[0], "the row was saved but cannot resume"))
        return row

    def _check_place(self, loader: Any, record: dict[str, Any]) -> None:
        """Refuse a row outside the run's project (another project or another root): gc
        --keep-days reads the pins of the project it collects, so the row would pin nothing
        and the run's commits could be expired under it."""
        ours = self.branch.project
        tables = getattr(getattr(loader, "plan", None), "tables", None) or ()
        theirs = getattr(tables[0], "project", None) if tables else None
        store = getattr(getattr(theirs, "client", None), "store", None)
        # the place, not the root URL: one bucket name on two servers is two stores
        root = getattr(store, "place", None)
        here = ours.client.store.place
        name = record.get("project")
        if (name is None or name == ours.name) and (root is None or root == here):
            return
        shown = f"project {name!r}" + (f" under {root!r}" if root != here else "")
        raise PlanError(
            f"{self._where} (under {here!r}): run {str(record.get('run_id', ''))[:8]}"
            f" reads {shown}, so a checkpoint row here pins nothing (gc --keep-days could "
            "expire the commits the run resumes from); save its checkpoints in a branch of "
            "the run's own project"
        )

    def _pins(self, record: dict[str, Any]) -> list[str]:
        """The commits of this project the run record names (what its checkpoint pins)."""
        if record.get("project") not in (None, self.branch.project.name):
            return []
        return sorted({str(t["commit"]) for t in record.get("tables", []) if t.get("commit")})

    def _expired(self, commit_id: str, what: str) -> str:
        return (
            f"{self._where}: the run's commit {commit_id[:8]} was expired by retention (gc "
            f"--keep-days) before this checkpoint pinned it, so its table versions are gone: "
            f"{what}; tag commits a run trains on (project.tag) to keep them"
        )

    def latest(self, run_id: str | None = None) -> CheckpointRow | None:
        """The checkpoint with the highest step (of ``run_id`` if given).

        None only when there is no checkpoint (no table yet, or no row of ``run_id``); a
        project or branch that does not exist is :class:`NotFound` naming it.
        A head commit that cannot be read, an unreadable table or a row whose fields do
        not match their digests raise (:class:`CorruptData` names the table, the row
        and the field): a resuming job must never silently start over.
        """
        if run_id is not None and not re.fullmatch(r"[0-9a-f]{4,64}", str(run_id)):
            raise PlanError(f"run_id must be hex, got {run_id!r}")
        commit_id = self.branch.commit_id  # NotFound: no such project or branch (a typo)
        try:
            head = self.branch.project.load_commit(commit_id)
        except NotFound as e:
            raise CorruptData(f"{self._where}: the branch head cannot be read ({e})") from None
        if self.table.name not in head.tables:
            return None
        table = self.branch.project.table_at(self.table.name, head.tables[self.table.name], head.id)
        missing = [f for f in _SCHEMA.names if f not in table.schema.names]
        if missing:
            raise CorruptData(
                f"{self._where} (commit {head.short_id}) lacks the columns {missing} of a "
                "checkpoint table (not a checkpoint table, or written without digests)"
            )
        meta = table.to_arrow([*_META, "digests"]).to_pylist()
        for i, got in enumerate(meta):
            self._check(i, got, _META)
        runs = np.asarray([m["run_id"] for m in meta], dtype=object)
        steps = np.asarray([m["step"] for m in meta], dtype=np.int64)
        mask = np.ones(len(steps), bool) if run_id is None else runs == run_id
        if not mask.any():
            return None
        rows = np.flatnonzero(mask)
        best = int(rows[np.lexsort((rows, steps[rows]))[-1]])  # highest step, then latest row
        got = table.take([best]).to_pylist()[0]
        self._check(best, got, _FIELDS)
        return CheckpointRow(
            got["run_id"],
            int(got["step"]),
            float(got["time"]),
            json.loads(got["record"]),
            json.loads(got["loader_state"]),
            bytes(got["state"]),
        )

    def _check(self, row: int, got: dict[str, Any], fields: list[str]) -> None:
        """Raise :class:`CorruptData` naming the first of ``fields`` that fails its digest."""
        where = f"{self._where}: row {row} (step {got.get('step')} as stored)"
        try:
            digests = json.loads(got["digests"])
            want = {f: str(digests[f]) for f in _FIELDS}
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(f"{where}: its digests are unreadable ({type(e).__name__})") from None
        for f in fields:
            if got[f] is None or _digest(f, got[f]) != want[f]:
                raise CorruptData(
                    f"{where}: field {f!r} does not match its sha256 digest (the stored "
                    "field or its digest is damaged)"
                )

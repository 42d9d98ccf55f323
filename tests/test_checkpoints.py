"""Checkpoint rows read back faithfully, or not at all.

Every field of a row is covered by a digest checked on read: a flipped bit anywhere
(written behind treadle's back, as a new newest row) raises ``CorruptData`` naming the
table, the row and the field instead of resuming at another step. ``latest()`` is None
only when there is no checkpoint; a missing head commit raises. Reprs stay short.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import treadle as td

FIELDS = ["run_id", "step", "time", "record", "loader_state", "state", "digests"]


def _saved(root: str, steps: tuple[int, ...] = (1, 2)) -> tuple[td.Branch, td.Checkpoints]:
    branch = td.Client(root, create=True).project("p").branch()
    branch.table("t").append({"x": np.arange(10, dtype=np.float32)})
    plan = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"))]).plan()
    loader = td.TrainLoader(plan, steps=max(steps))
    ckpts = td.Checkpoints(branch)
    for i, _ in enumerate(loader, start=1):
        if i in steps:
            ckpts.save(i, {"w": torch.full((3,), float(i))}, loader)
    return branch, ckpts


def _flip_digit(text: str) -> str:
    """One bit flipped in the last digit of ``text``: still valid JSON/hex, another value."""
    i = max(i for i, ch in enumerate(text) if ch.isdigit())
    return text[:i] + chr(ord(text[i]) ^ 1) + text[i + 1 :]


def _flipped(name: str, value):
    if name == "step":
        return value ^ 1
    if name == "time":
        (bits,) = struct.unpack("<q", struct.pack("<d", value))
        return struct.unpack("<d", struct.pack("<q", bits ^ 1))[0]
    if name == "state":
        data = bytearray(value)
        data[len(data) // 2] ^= 0x10
        return bytes(data)
    return _flip_digit(value)


@pytest.mark.parametrize("field", FIELDS)
def test_a_flipped_bit_in_any_field_is_caught(tmp_path, field):
    branch, ckpts = _saved(str(tmp_path / "s"))
    good = ckpts.latest()
    assert good is not None and good.step == 2 and good.loader_state["step"] == 2
    row = branch.table("checkpoints").to_arrow().slice(1, 1)  # the step-2 row
    i = row.schema.get_field_index(field)
    value = row.column(field)[0].as_py()
    bad = row.set_column(
        i, row.schema.field(i), pa.array([_flipped(field, value)], row.schema[i].type)
    )
    assert bad.column(field)[0].as_py() != value
    branch.table("checkpoints").append(bad)  # the newest row, of the highest step
    with pytest.raises(td.CorruptData) as ei:
        ckpts.latest()
    msg = str(ei.value)
    assert "checkpoint table 'checkpoints'" in msg and "row 2" in msg, msg
    # a damaged digest makes its field fail: the message says it may be either
    assert (f"field {field!r}" if field != "digests" else "field '") in msg, msg
    assert "digest" in msg, msg


def test_loader_state_flip_does_not_resume_elsewhere(tmp_path):
    """The issue's case: '"step": 2' flipped to '"step": 3' in the loader state."""
    branch, ckpts = _saved(str(tmp_path / "s"))
    row = branch.table("checkpoints").to_arrow().slice(1, 1)
    state = json.loads(row.column("loader_state")[0].as_py())
    assert state["step"] == 2
    text = json.dumps(dict(state, step=3), sort_keys=True)
    i = row.schema.get_field_index("loader_state")
    branch.table("checkpoints").append(row.set_column(i, "loader_state", pa.array([text])))
    with pytest.raises(td.CorruptData, match=r"row 2 .*field 'loader_state'"):
        ckpts.latest()


def test_latest_is_none_only_without_a_checkpoint(tmp_path):
    root = str(tmp_path / "s")
    branch = td.Client(root, create=True).project("p").branch()
    with pytest.raises(td.NotFound, match="project 'p' not found"):
        td.Checkpoints(branch).latest()  # a project never written (a typo?): not "no checkpoint"
    branch.table("data").append({"x": [1]})
    assert td.Checkpoints(branch).latest() is None  # no checkpoint table
    branch, ckpts = _saved(root)
    assert ckpts.latest("abcd1234") is None  # no row of that run
    head = branch.commit_id
    Path(root, f"projects/p/commits/{head}.json").unlink()
    fresh = td.Client(root).project("p").branch()  # nothing cached
    with pytest.raises(td.CorruptData) as ei:
        td.Checkpoints(fresh).latest()
    msg = str(ei.value)
    assert "checkpoint table 'checkpoints'" in msg and head in msg, msg


def test_unreadable_checkpoint_table_raises(tmp_path):
    root = str(tmp_path / "s")
    _, ckpts = _saved(root)
    for f in Path(root, "projects/p/tables/checkpoints.lance/data").iterdir():
        f.unlink()
    fresh = td.Client(root).project("p").branch()
    with pytest.raises(td.TreadleError, match="checkpoints"):
        td.Checkpoints(fresh).latest()


def test_a_table_without_digests_is_refused(tmp_path):
    branch, _ = _saved(str(tmp_path / "s"))
    branch.table("other").append({"run_id": ["ab12"], "step": [3]})
    with pytest.raises(td.CorruptData, match=r"'other'.*lacks the columns"):
        td.Checkpoints(branch, table="other").latest()


def test_repr_is_short_whatever_the_state(tmp_path):
    branch, ckpts = _saved(str(tmp_path / "s"), steps=(1,))
    loader = td.TrainLoader(
        td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"))]), steps=1
    )
    big = {"w": torch.zeros(4 << 20, dtype=torch.uint8)}  # a 4 MB state
    saved = ckpts.save(7, big, loader)
    back = ckpts.latest()
    assert back is not None and back.step == 7
    for row in (saved, back):
        text = repr(row)
        assert len(text) < 120, text[:300]
        assert "step=7" in text and row.run_id[:8] in text and "4.2 MB" in text, text
    assert "checkpoints" in repr(ckpts) and len(repr(ckpts)) < 100


def test_latest_finds_a_derived_runs_checkpoint_and_it_resumes(tmp_path):
    client = td.Client(str(tmp_path), create=True)
    branch = client.project("p").branch()
    t = branch.table("t")
    for e in range(3):
        t.append_episode({"x": np.arange(6, dtype=np.float32) + 10 * e}, episode=f"e{e}")
    parent = td.Recipe(seed=1, batch_size=4, components=[td.Component(t)]).plan()
    derived = parent.exclude(episodes={"t": ["e1"]}, from_step=1)
    ckpts = td.Checkpoints(branch)
    loader = td.TrainLoader(derived, steps=4)
    seen = []
    for i, batch in enumerate(loader, start=1):
        seen.append(batch["x"].tolist())
        if i == 2:
            ckpts.save(i, {"w": torch.zeros(1)}, loader)
    assert ckpts.latest(parent.run_id) is None
    row = ckpts.latest(derived.run_id)
    assert row is not None and row.run_id == derived.run_id and row.step == 2
    assert row.record["derived"]["parent"] == parent.run_id
    again = td.TrainLoader.from_state(row.loader_state, client, steps=4)
    assert again.run_id == derived.run_id
    assert [b["x"].tolist() for b in again] == seen[2:]
    assert not any(10 <= x < 20 for step in seen[1:] for x in step)  # e1 left out from step 1

"""Non-tensor columns (a ``task`` string, variable-length lists) as Python lists, and
``_episode``/``_frame`` in every batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from treadle.errors import PlanError

LENGTHS = (5, 8, 3)


def _branch(root):
    branch = td.Client(root).project("robotics").branch()
    with branch.transaction("episodes") as tx:
        for e, n in enumerate(LENGTHS):
            tx.table("demo").append_episode(
                {
                    "task": f"task of episode {e}",
                    "value": np.arange(n, dtype=np.int64) + 100 * e,
                    "tokens": pa.array([list(range(f % 4)) for f in range(n)]),
                },
                episode=f"ep-{e}",
            )
    return branch


def _reference(branch):
    t = branch.table("demo").to_arrow()
    return {k: t.column(k).to_pylist() for k in t.column_names}


def _check(batch, ref, offsets=None):
    m = batch["_moment"].tolist()
    assert isinstance(batch["task"], list) and len(batch["task"]) == len(m)
    starts = np.cumsum((0, *LENGTHS))[:-1]
    e = (np.searchsorted(starts, m, side="right") - 1).tolist()
    assert batch["_episode"].tolist() == e
    assert batch["_frame"].tolist() == [ref["frame"][i] for i in m]
    assert batch["_episode"].dtype == batch["_frame"].dtype == batch["_moment"].dtype
    for i, row in enumerate(m):
        if offsets is None:
            assert batch["task"][i] == ref["task"][row]
            assert batch["tokens"][i] == ref["tokens"][row]
        else:
            assert batch["task"][i] == [ref["task"][row + o] for o in offsets]
            assert batch["tokens"][i] == [ref["tokens"][row + o] for o in offsets]


def test_strings_and_lists_arrive_with_their_sample(tmp_path):
    branch = _branch(str(tmp_path))
    ref = _reference(branch)
    # no windows: every column at the moment, the string one included (refused before)
    plan = td.Recipe(3, 4, [td.Component(branch.table("demo"))]).plan()
    for batch in td.TrainLoader(plan, steps=4):
        _check(batch, ref)
    offsets = [0, 1]
    windows = td.Windows(
        {"task": td.Rows(offsets), "tokens": td.Rows(offsets), "value": td.Rows(offsets)}
    )
    plan = td.Recipe(3, 4, [td.Component(branch.table("demo"), windows)]).plan()
    for batch in td.TrainLoader(plan, steps=4):
        _check(batch, ref, offsets)
        np.testing.assert_array_equal(
            batch["value"].numpy(),
            np.asarray(ref["value"])[batch["_moment"].numpy()[:, None] + offsets],
        )


def test_a_string_column_in_a_video_spec_is_refused(tmp_path):
    branch = _branch(str(tmp_path))
    windows = td.Windows({"task": td.Video([0])})
    with pytest.raises(PlanError, match=r"component 0 \(table 'demo'\).*'task'.*not a video"):
        td.Recipe(3, 4, [td.Component(branch.table("demo"), windows)]).plan()


@pytest.mark.slow
def test_strings_arrive_through_worker_processes(tmp_path):
    branch = _branch(str(tmp_path))
    ref = _reference(branch)
    plan = td.Recipe(3, 4, [td.Component(branch.table("demo"))]).plan()
    threads = list(td.TrainLoader(plan, steps=3))
    procs = list(td.TrainLoader(plan, steps=3, workers=1))
    for a, b in zip(threads, procs, strict=True):
        _check(b, ref)
        assert a["task"] == b["task"] and a["tokens"] == b["tokens"]
        assert a["_episode"].tolist() == b["_episode"].tolist()

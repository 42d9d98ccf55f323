"""Changing a table while another process appends to it (issue 47, section 4).

Two writer processes on one branch, 20 operations each, on local disk, S3 and Azurite:
one appends episodes, the other adds columns and updates them. An append that loses the
race to an ``add_column`` is rebased (its episodes take the column's default); an
``add_column`` or ``update`` that loses to an append is a ``CommitConflict`` and, retried,
lands. Checked episode by episode against a replay of the branch's commits: no episode
lost, and every column holds, for every episode that existed when it was written, the
value written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from test_evolve import check_rows

OPS = 20
HERE = Path(__file__).resolve().parent


def _start(root: str, options: dict | None, role: str, barrier: Path) -> subprocess.Popen:
    args = {"root": root, "options": options, "role": role, "ops": OPS, "barrier": str(barrier)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "WRITER_ARGS": json.dumps(args)}
    return subprocess.Popen(
        [sys.executable, str(HERE / "concurrent_writer.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _finish(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def replay(
    branch: td.Branch, start: str, ops: dict[str, dict]
) -> dict[str, dict[str, list[float]]]:
    """Per episode and column, the values each frame should hold after the commits of
    ``ops`` (commit id -> what it wrote), oldest first; every commit on the branch after
    ``start`` is one of them."""
    want: dict[str, dict[str, list[float]]] = {"a": {}}
    columns: list[str] = []
    log = [c.id for c in reversed(branch.log())]
    for commit in log[log.index(start) + 1 :]:
        op = ops.pop(commit)
        if "episode" in op:
            want[op["episode"]] = {c: [-1.0] * 3 for c in columns}
        elif "add" in op:
            columns.append(op["add"])
            assert set(op["episodes"]) <= set(want)  # it saw no episode from the future
            for ep, cols in want.items():
                cols[op["add"]] = [op["value"] if ep in op["episodes"] else -1.0] * 3
        else:  # an update of frame 0 of every episode the table had
            for cols in want.values():
                cols[op["update"]][0] = op["value"]
    assert ops == {}, f"operations whose commit is not on the branch: {ops}"
    return want


@pytest.mark.slow
def test_add_column_and_update_beside_an_appending_process(any_root, tmp_path):
    root, options = any_root
    t = td.Client(root, storage_options=options).project("p").branch().table("t")
    start = t.append_episode({"x": np.zeros(3)}, episode="a").id
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    writers = [_start(root, options, role, barrier) for role in ("append", "label")]
    try:
        appended, labelled = (_finish(p) for p in writers)
    finally:
        for proc in writers:
            if proc.poll() is None:  # the other one failed: do not leave this one running
                proc.kill()
                proc.wait()
    assert [op["episode"] for op in appended] == [f"n{i}" for i in range(OPS)]
    assert len(labelled) == OPS
    branch = t.branch
    want = replay(branch, start, {op["commit"]: op for op in appended + labelled})
    table = t.pin()
    check_rows(table)
    assert list(table.episodes().names) == ["a"] + [f"n{i}" for i in range(OPS)]
    columns = [f"c{i}" for i in range(0, OPS, 2)]
    got = table.to_arrow(["episode", "x", *columns]).to_pydict()
    for ep, cols in want.items():  # episode by episode
        rows = [r for r, name in enumerate(got["episode"]) if name == ep]
        assert [got["x"][r] for r in rows] == [0.0 if ep == "a" else float(ep[1:])] * 3, ep
        for col in columns:
            assert [got[col][r] for r in rows] == cols[col], (ep, col)
    conflicts = sum(op["conflicts"] for op in appended + labelled)
    order = "".join("A" if c.changes["t"] == ("append",) else "L" for c in branch.log()[::-1][2:])
    rebased = appended[-1]["rebased"]
    print(f"{root}: {conflicts} conflicts retried, {rebased} appends rebased; {order}")


def test_stale_values_conflict_and_appends_rebase_over_added_columns(any_root):
    """A per-moment array written against a table that gained rows since is a
    CommitConflict with nothing committed (retried, it lands); an append staged before an
    ``add_column``/``annotate`` landed is rebased (its episode takes the default or null);
    one staged before a rename is a CommitConflict, and retried it lands."""
    from test_evolve import media

    root, options = any_root
    branch = td.Client(root, storage_options=options).project("p").branch()
    t = branch.table("t")
    t.append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    stored = media(branch)
    with pytest.raises(td.CommitConflict, match="retry"):
        with branch.transaction("label") as tx:
            tx.table("t").add_column("p", np.zeros(3, np.float32))
            appended = t.append_episode({"x": np.arange(2.0)}, episode="b")  # meanwhile
    assert branch.commit_id == appended.id and t.schema.names == ["episode", "frame", "x"]
    with pytest.raises(td.SchemaMismatch, match="appended since"):  # made for 3 moments
        t.add_column("p", np.zeros(3, np.float32))
    assert branch.commit_id == appended.id
    t.add_column("p", np.ones(5, np.float32))  # made again for the new head, it lands

    with branch.transaction("collect") as tx:
        tx.table("t").append_episode({"x": np.arange(2.0)}, episode="c")
        t.add_column("ok", {"a": True}, default=False)  # other writers, meanwhile
        t.annotate("phase", {"a": [(0.0, 0.1, "reach")]})
    assert tx.commit.changes == {"t": ("append",)}
    got = t.to_arrow(["episode", "p", "ok", "phase"]).to_pydict()
    assert got == {
        "episode": ["a"] * 3 + ["b"] * 2 + ["c"] * 2,
        "p": [1.0] * 5 + [None] * 2,
        "ok": [True] * 3 + [False] * 4,
        "phase": ["reach"] + [None] * 6,
    }
    with pytest.raises(td.CommitConflict, match="retry"):
        with branch.transaction("collect") as tx:
            tx.table("t").append_episode({"x": np.arange(2.0)}, episode="d")
            t.rename_columns({"ok": "good"})
    t.append_episode({"x": np.arange(2.0)}, episode="d")
    assert t.to_arrow(["good"]).column(0).to_pylist()[-2:] == [False, False]
    check_rows(t.pin())
    assert media(branch) == stored

"""``treadle bench`` runs end to end on tiny sizes and writes well-formed JSON.

No timing is asserted anywhere: only that every case ran (or says why not), that the
numbers are finite and positive, and that the summary names each goal. Also checks that
the batch reader's one-take-per-row-group path returns exactly the rows of each window.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from treadle.read.batch import BatchReader

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.s3
def test_bench_tiny_end_to_end(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "treadle.cli", "bench", "--tiny", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ratios and goals" in proc.stdout

    files = sorted(out.glob("tiny-*.json"))
    assert len(files) == 1 and (out / "latest-tiny.json").is_file()
    doc = json.loads(files[0].read_text())
    assert doc["tiny"] is True and doc["cases"] == ["mix", "video", "s3", "plan"]
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["versions"]["treadle"]
    by_case: dict[str, list[dict]] = {}
    for r in doc["results"]:
        by_case.setdefault(r["case"], []).append(r)
        assert r["unit"] in ("samples/s", "frames/s", "batches/s")
        assert (
            r["status"] == "ok"
            or r["status"] in ("not installed",)
            or r["status"].startswith(("failed", "not run"))
        )
        for run in r["runs"]:
            assert run["wall_s"] > 0 and run["samples"] > 0 and run["cpu_s"] >= 0
        if r["status"] == "ok" and r["runs"]:
            assert math.isfinite(r["median_rate"]) and r["median_rate"] > 0
    assert set(by_case) == {"mix", "video", "s3", "plan"}

    def ok(case: str, name: str) -> list[dict]:
        return [r for r in by_case[case] if r["name"] == name and r["status"] == "ok" and r["runs"]]

    # treadle and the limit ran in every case; the peers ran or say why not
    for case in ("mix", "video", "s3"):
        assert ok(case, "treadle") and ok(case, "limit"), case
    assert len(ok("plan", "treadle")) == 11
    for peer in ("mds", "wds", "hf", "lance"):
        rs = [r for r in by_case["mix"] if r["name"] == peer]
        assert rs and all(r["status"] in ("ok", "not installed") for r in rs), rs
    assert {r["config"]["workers"] for r in ok("mix", "treadle")} == {0, 2}
    # the video peers: torchcodec and SPDL only ran after their first batch equalled
    # treadle's frames (a mismatch is "failed: ... differs"); CI installs all three
    for peer in ("torchcodec", "spdl", "lerobot"):
        rs = [r for r in by_case["video"] if r["name"] == peer]
        assert rs and all(r["status"] in ("ok", "not installed") for r in rs), rs
        if os.environ.get("CI"):
            assert all(r["status"] == "ok" and r["runs"] for r in rs), rs
    assert {r["config"]["threads"] for r in ok("video", "torchcodec")} <= {1, 2}

    goals = {s["goal"] for s in doc["summary"]}
    assert goals == {"mix", "video", "s3", "plan"}
    for s in doc["summary"]:
        if s.get("ratio") is not None:
            assert s["ratio"] > 0
            assert isinstance(s["holds"], bool) if s["need"] else s["holds"] is None
    if doc["chart"]:
        assert (out / doc["chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_cli_is_registered():
    from treadle.cli import build_parser

    args = build_parser().parse_args(["bench", "--tiny", "--cases", "plan"])
    assert args.tiny and args.cases == "plan"


def test_row_columns_share_one_take_and_keep_their_rows(tmp_path, monkeypatch):
    """Columns with the same offsets come from one take; every window holds its own rows."""
    rng = np.random.default_rng(3)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    data = {}
    for name in ("a", "b"):
        for e, n in enumerate((9, 14)):
            cols = {
                "action": rng.random((n, 7), dtype=np.float32),
                "state": rng.integers(0, 1000, (n, 2, 3)).astype(np.int32),
                "reward": rng.random(n),
            }
            branch.table(name).append_episode(cols, episode=f"{name}{e}")
            data[(name, e)] = cols
    windows = td.Windows(
        {"action": td.Rows(range(3)), "state": td.Rows(range(3)), "reward": td.Rows([2, 0])}
    )
    recipe = td.Recipe(
        seed=5,
        batch_size=8,
        components=[
            td.Component(branch.table("a"), windows, weight=0.25),
            td.Component(branch.table("b"), windows, weight=0.75),
        ],
    )
    plan = recipe.plan()
    reader = BatchReader(plan)
    takes: list[list[str]] = []
    for c in range(plan.num_components):
        t = plan.table(c)
        orig = t.take

        def spy(rows, columns=None, orig=orig):
            takes.append(list(columns))
            return orig(rows, columns)

        monkeypatch.setattr(t, "take", spy)
    names = ("a", "b")
    for step in range(6):
        out = reader.read(step)
        for i, (c, m) in enumerate(zip(out["_component"], out["_moment"])):
            eps = plan.table(int(c)).episodes()
            e = int(np.searchsorted(eps.starts, m, side="right") - 1)
            f = int(m - eps.starts[e])
            cols = data[(names[int(c)], e)]
            np.testing.assert_array_equal(out["action"][i], cols["action"][f : f + 3])
            np.testing.assert_array_equal(out["state"][i], cols["state"][f : f + 3])
            np.testing.assert_array_equal(out["reward"][i], cols["reward"][[f + 2, f]])
    reader.close()
    # one take per component and set of rows (same offsets), never one per column
    assert {tuple(sorted(c)) for c in takes} == {("action", "state"), ("reward",)}


def test_read_ahead_gives_the_same_batches_in_any_order(tmp_path):
    """Row-only plans read one step ahead; any order of steps gives the batches of the plan."""
    rng = np.random.default_rng(4)
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for name in ("a", "b"):
        branch.table(name).append(
            {"x": rng.random((50, 3), dtype=np.float32), "y": rng.integers(0, 9, 50)}
        )
    recipe = td.Recipe(
        seed=1,
        batch_size=8,
        components=[td.Component(branch.table(n), None, weight=w) for n, w in (("a", 1), ("b", 2))],
    )
    plan = recipe.plan()

    def fresh(step: int, rank: int = 0, world: int = 1) -> dict:
        r = BatchReader(plan)
        try:
            return r.read(step, rank, world)
        finally:
            r.close()

    reader = BatchReader(plan)
    assert reader._rows_only  # noqa: SLF001
    orders = [(0, 1, 2, 3), (0, 2, 4, 6, 8), (5, 3, 4, 10, 11, 12, 2), (7, 7, 8)]
    for steps in orders:
        for s in steps:
            got, want = reader.read(s), fresh(s)
            assert got.keys() == want.keys()
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
    for s in (0, 1, 2):  # another rank and world size after the read-ahead of rank 0
        got, want = reader.read(s, 1, 2), fresh(s, 1, 2)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    reader.close()

"""Writes cost the same whatever the history's length (issue 13).

One long-lived writer makes 2,000 single-episode commits of tiny rows: the table's
metadata bytes per commit, its largest fragment id, its fragment count and the
writer's memory stay within fixed bounds (no timings), and every commit reads back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import treadle as td

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import case_scale  # noqa: E402

N, ROWS = 2000, 4


@pytest.mark.slow
def test_two_thousand_commits_stay_small_and_all_read_back(local_root):
    out = case_scale.commit_many(local_root, N, rows=ROWS, every=200)
    first, last = out["points"][0], out["points"][-1]
    assert last["commits"] == N
    # manifests list O(log rows) fragments: bytes per commit do not grow with history
    # (was ~27 KB/commit at 600 commits and growing linearly)
    assert last["metadata_bytes"] <= 4_000 * N, last
    assert last["max_fragment_id"] <= 2 * N, last  # was k(k+1)/2: 2,001,000
    assert last["fragments"] <= 12, last  # log2(2000 * ROWS / ROWS) + 1
    assert last["rss_mib"] - first["rss_mib"] <= 64, out["points"]  # no per-version cache
    fresh = td.Client(local_root).project("scale")
    t = fresh.branch().table("t")
    for k, cid in enumerate(out["commits"]):
        pinned = t.at(cid)
        assert pinned.num_moments == ROWS * (k + 1), k
        row = pinned.take([ROWS * k], ["episode", "frame", "state"]).to_pylist()[0]
        assert row == {"episode": f"e{k}", "frame": 0, "state": float(k)}, k

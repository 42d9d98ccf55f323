"""``treadle bench`` runs end to end on tiny sizes and writes well-formed JSON.

No timing is asserted anywhere: only that every case ran (or says why not), that the
numbers are finite and positive, and that the summary names each goal. (The reader's
take grouping and read-ahead are specified in ``tests/test_read_reader.py``.)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.s3
def test_bench_tiny_end_to_end(tmp_path):
    out = tmp_path / "results"
    # its temporary files in the test's folder: MosaicML Streaming's file locks
    # (/tmp/000000_cache_filelock, ...) and SPDL's glog files (/tmp/__main__.py.<host>.*,
    # named after `python -m`'s __main__.py) were left in /tmp ("t": a short path, as
    # SeaweedFS's unix sockets in it must be)
    (tmp_path / "t").mkdir()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp_path / "t")}
    cmd = [sys.executable, "-m", "treadle.cli", "bench", "--tiny", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ratios and goals" in proc.stdout

    files = sorted(out.glob("tiny-*.json"))
    assert len(files) == 1 and (out / "latest-tiny.json").is_file()
    assert (out / "latest-tiny.md").read_text().startswith("# treadle bench (tiny run")
    doc = json.loads(files[0].read_text())
    assert doc["tiny"] is True and doc["cases"] == ["mix", "video", "s3", "cloud", "plan", "cold"]
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["versions"]["treadle"]
    by_case: dict[str, list[dict]] = {}
    for r in doc["results"]:
        by_case.setdefault(r["case"], []).append(r)
        assert r["unit"] in ("samples/s", "frames/s", "batches/s", "batch")
        assert (
            r["status"] == "ok"
            or r["status"] in ("not installed",)
            or r["status"].startswith(("failed", "not run"))
        )
        for run in r["runs"]:
            assert run["wall_s"] > 0 and run["samples"] > 0 and run["cpu_s"] >= 0
        if r["status"] == "ok" and r["runs"]:
            assert math.isfinite(r["median_rate"]) and r["median_rate"] > 0
    assert set(by_case) == {"mix", "video", "s3", "cloud", "plan", "cold"}

    def ok(case: str, name: str) -> list[dict]:
        return [r for r in by_case[case] if r["name"] == name and r["status"] == "ok" and r["runs"]]

    # treadle and the limit ran in every case; the peers ran or say why not
    for case in ("mix", "video", "s3", "cloud"):
        assert ok(case, "treadle") and ok(case, "limit"), case
    # at cloud latency, each data set read both locally and on S3, the S3 rows with their
    # requests and bytes per batch
    cloud = ok("cloud", "treadle")
    assert {(r["config"]["data"], r["config"]["where"]) for r in cloud} >= {
        ("mix", "local"),
        ("mix", "s3"),
    }
    assert all(r["extra"]["requests_per_batch"] > 0 for r in cloud if r["config"]["where"] == "s3")
    assert {r["config"]["cores"] for r in ok("video", "limit_rgb")} == {1}  # goal 1's limit
    assert len(doc["machine"]["load_avg"]) == len(doc["load_end"]) == 3
    plans = ok("plan", "treadle")
    assert len(plans) == 13  # ... the 3-stage schedule build and the OXE-sized weigh_by build
    oxe = [r for r in plans if r["config"].get("what") == "build oxe26 weigh_by=moments"]
    assert len(oxe) == 1 and max(oxe[0]["extra"]["warning_chars"], default=0) < 1000
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
    assert goals == {"video", "peers", "mix", "s3", "cloud", "start", "plan", "cold"}
    assert {r["config"]["recipe"] for r in ok("cold", "treadle")} == {"mix", "video"}
    for s in doc["summary"]:
        number = s.get("value") if "unit" in s else s.get("ratio")
        if number is not None:
            assert number > 0
            assert isinstance(s["holds"], bool) if s["need"] else s["holds"] is None
    judged = [
        s for s in doc["summary"] if s["goal"] in ("video", "mix", "s3", "cloud", "start", "cold")
    ]
    assert all(s["ratio" if "unit" not in s else "value"] is not None for s in judged), judged
    if doc["chart"]:
        assert (out / doc["chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "latest-tiny.png").read_bytes() == (out / doc["chart"]).read_bytes()


def test_bench_cli_is_registered():
    from treadle.cli import build_parser

    args = build_parser().parse_args(["bench", "--tiny", "--cases", "plan"])
    assert args.tiny and args.cases == "plan"


def test_scale_case_runs_on_tiny_sizes(tmp_path):
    """bench/case_scale.py (the DROID-shaped case) runs end to end: it broke once when a
    helper it imported was removed, and no test ran it."""
    root = tmp_path / "stores"
    root.mkdir()
    cmd = [sys.executable, str(ROOT / "bench" / "case_scale.py"), "--commits", "3",
           "--episodes", "300", "--video-episodes", "40", "--frames", "24", "--root", str(root),
           "--out", str(tmp_path / "scale")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "scale.json").read_text())
    measured = doc["readers"]["measured"] if "readers" in doc else doc["measured"]
    assert measured["plan_moments"] == 300 * 24
    assert measured["reader_index_bytes_per_frame"] > 0


@pytest.mark.slow
@pytest.mark.s3
def test_video_beyond_cache_runs_every_part_on_tiny_sizes(tmp_path):
    """bench/beyond_cache_video.py (issue 48's video rows) runs every part end to end: the
    full shuffle's GET limit over its windows' byte ranges, 2- and 30-frame windows and
    ``workers=2``, each S3 row with the same batches as its local row."""
    cmd = [sys.executable, str(ROOT / "bench" / "beyond_cache_video.py"), "--episodes", "4",
           "--frames", "60", "--steps", "2", "--rounds", "1", "--batch", "8",
           "--long-frames", "30", "--long-steps", "2", "--block-rows", "60"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TREADLE_BENCH_DATA": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = proc.stdout.splitlines()
    (limit,) = [r for r in rows if "limit: random single-range GETs x64" in r]
    assert float(limit.split("x64")[1].split()[0].replace(",", "")) > 0
    s3 = [r for r in rows if " S3 " in r]
    # per order: 2-frame S3 and S3 +L4, 30-frame S3 and S3 +L4, workers=2 S3 +L4
    assert len(s3) == 10, proc.stdout
    assert all(r.count("same batches") == 1 for r in s3), proc.stdout
    assert sum("x GET limit" in r for r in s3) == 2  # the full shuffle's 2-frame rows
    assert sum(" 30f " in r for r in s3) == 4 and sum(" w2 " in r for r in s3) == 2

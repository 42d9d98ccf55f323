"""bench/case_images.py's ratios (issue 44 §2) from synthetic results (no timing).

A Run(wall, cpu, n) has the rate n / wall and n / cpu frames per CPU-second; every number
below is chosen, none is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)

from benchlib import Result, Run  # noqa: E402


def res(name, rate, cpu_rate, window="single", **config):
    r = Result("images", name, {"window": window, "batch": 64, **config}, "frames/s")
    r.runs = [Run(1.0, rate / cpu_rate, rate)]
    return r


def test_rows_against_the_limit_times_cores_and_s3_against_its_local_twin():
    import case_images as ci

    t = dict(workers=0, threads=2)
    results = [
        res("limit", 100.0, 100.0, cores=1),
        res("limit", 50.0, 50.0, window="window4", cores=1),
        res("treadle", 180.0, 90.0, where="local", **t),
        res("treadle", 162.0, 90.0, where="s3", **t),
        res("treadle", 150.0, 100.0, where="s3", workers=2, threads=1),  # no local twin
        res("hf", 25.0, 20.0, where="local", workers=0, threads=1),
    ]
    lines = ci.ratios(results)
    assert len(lines) == 4  # the limits are the denominators, not rows
    local, s3, lone, hf = (r.extra["ratio"] for r in results[2:])
    assert local == "0.900 (CPU 0.900) x limit x 2"
    assert s3 == "0.810 (CPU 0.900) x limit x 2; 0.900 (CPU 1.000) x local"
    assert lone.endswith("; - x local")
    assert hf == "0.250 (CPU 0.200) x limit x 1"
    assert "images treadle single s3 workers=0 threads=2: 162 frames/s" in lines[1]

"""bench/case_augment.py runs (tiny) and reports both readers; no timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_case_augment_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_BENCH_DATA", str(tmp_path))
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("case_augment", None)
    import case_augment

    plain, augmented = case_augment.run(tiny=True, runs=1, log=lambda m: None)
    assert plain.status == augmented.status == "ok"
    assert plain.rate > 0 and augmented.rate > 0
    assert augmented.extra["augmented_over_plain"] > 0

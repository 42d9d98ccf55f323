"""Statistics of integer columns past 2**53 (nanosecond timestamps, uint64 ids): min and max
are the column's own values, in its dtype, wherever a user reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import treadle as td
from treadle.stats.column_stats import ColumnStats
from treadle.ui import browse

N = 60
STAMP = 1_700_000_000_123_456_789  # a ROS header stamp in ns: float64 rounds it (ulp 256)
TS = STAMP + np.arange(N, dtype=np.int64) * 33_333_333 + 1  # odd: none is a float64
COLUMNS = {
    "ts": TS,
    "u64": np.uint64(2**63) + np.arange(N, dtype=np.uint64) * np.uint64(7) + np.uint64(1),
    "i8": (np.arange(N) - 30).astype(np.int8),
    "pair": np.stack([TS, TS[::-1] + 3], axis=1),  # a tensor column of stamps
}


@pytest.fixture(scope="module")
def stamps(tmp_path_factory):
    branch = td.Client(str(tmp_path_factory.mktemp("ints")), create=True).project("p").branch()
    branch.table("t").append_episode(COLUMNS, episode="e0")
    return branch


def _exact(s: ColumnStats, x: np.ndarray) -> None:
    # dtype first: numpy compares an int64 with a float64 after rounding the int64
    assert s.min.dtype == x.dtype and s.max.dtype == x.dtype
    assert s.min.tolist() == x.min(axis=0).tolist()
    assert s.max.tolist() == x.max(axis=0).tolist()


@pytest.mark.parametrize("column", list(COLUMNS))
def test_table_stats_min_max_of_integers_are_exact(stamps, column):
    t = stamps.table("t").pin()
    x = COLUMNS[column]
    _exact(t.stats([column])[column], x)
    _exact(t.stats([column])[column], x)  # the second call reads the kept result back
    kept = ColumnStats.from_dict(json.loads(json.dumps(t.stats([column])[column].to_dict())))
    _exact(kept, x)
    np.testing.assert_allclose(kept.mean, x.astype(np.float64).mean(axis=0), rtol=1e-15)


@pytest.mark.parametrize("components", [1, 2])
def test_plan_stats_min_max_of_integers_are_exact(stamps, components):
    w = td.Windows({c: td.Rows([0]) for c in COLUMNS})
    comps = [td.Component(stamps.table("t"), w) for _ in range(components)]
    plan = td.Recipe(seed=5, batch_size=4, components=comps).plan()
    for _ in range(2):  # computed, then read back as kept for the run
        with pytest.warns(UserWarning, match="'u64'"):  # std 7e-17 of its scale: flat, rightly
            got = plan.stats(list(COLUMNS))
        for c, x in COLUMNS.items():
            _exact(got[c], x)


def test_plan_stats_min_max_per_offset_are_exact(stamps):
    w = td.Windows({"ts": td.Rows([-1, 0])})
    plan = td.Recipe(seed=5, batch_size=4, components=[td.Component(stamps.table("t"), w)]).plan()
    got = plan.stats(["ts"], per_offset=True)["ts"]
    assert got.min.dtype == np.int64
    assert got.min.tolist() == [int(TS[0]), int(TS[1])]
    assert got.max.tolist() == [int(TS[-2]), int(TS[-1])]


def test_the_viewer_sends_integers_past_2_53_as_text(stamps):
    # JSON.parse rounds a number past 2**53: the page showed 1700000000123456800
    got = browse.stats_json(stamps.table("t").pin())
    assert got["ts"]["min"] == str(TS[0]) and got["ts"]["max"] == str(TS[-1])
    assert got["i8"]["min"] == -30 and isinstance(got["ts"]["count"], int)

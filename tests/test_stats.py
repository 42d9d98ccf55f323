"""table.stats: exact moments, quantiles within the stated rank error, kept in the project."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from treadle.stats import table_stats as st


def _project(root, rows=3000, seed=0):
    rng = np.random.default_rng(seed)
    branch = td.Client(root, create=True).project("p").branch()
    action = (rng.standard_normal((rows, 7)) * [1, 10, 100, 1e-3, 5, 2, 3]).astype(np.float32)
    t = pa.table(
        {
            "x": pa.array(rng.integers(-50, 50, rows), pa.int64()),
            "y": pa.array(rng.standard_normal(rows) * 3 + 1),
            "label": pa.array([f"s{i}" for i in range(rows)]),
        }
    )
    branch.table("t").append(t)
    return branch, action


def _tensor_table(root, values):
    branch = td.Client(root, create=True).project("p").branch()
    branch.table("a").append_episode({"action": values}, episode="e0")
    return branch.table("a").pin()


def _check(s: td.ColumnStats, x: np.ndarray, exact_quantiles: bool = True) -> None:
    x = x.astype(np.float64)
    assert int(s.count) == len(x)
    np.testing.assert_allclose(s.mean, x.mean(axis=0), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(s.std, x.std(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(s.min, x.min(axis=0))
    np.testing.assert_array_equal(s.max, x.max(axis=0))
    if exact_quantiles:
        np.testing.assert_allclose(s.q01, np.quantile(x, 0.01, axis=0), rtol=1e-12)
        np.testing.assert_allclose(s.q99, np.quantile(x, 0.99, axis=0), rtol=1e-12)


def test_numeric_and_tensor_columns_match_numpy_float64(tmp_path):
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((2500, 2, 3)) * [[1, 10, 100], [1e-3, 5, 7]]).astype(np.float32)
    table = _tensor_table(str(tmp_path), values)
    got = table.stats()
    assert set(got) == {"action"}  # episode/frame are keys, not features
    s = got["action"]
    assert s.mean.shape == (2, 3) and s.rank_error == 0
    _check(s, values)
    branch, _ = _project(str(tmp_path / "b"))
    t = branch.table("t").pin()
    both = t.stats(["x", "y"])
    raw = t.to_arrow(["x", "y"])
    _check(both["x"], raw.column("x").to_numpy())
    _check(both["y"], raw.column("y").to_numpy())
    sub = t.stats(["y"], where="x > 0")
    _check(sub["y"], raw.filter(pa.compute.greater(raw.column("x"), 0)).column("y").to_numpy())


def test_reads_are_bounded_and_sketch_stays_within_its_rank_error(tmp_path, monkeypatch):
    """A table larger than the read and sketch budgets: streamed, exact moments, quantiles
    within rank_error of numpy's (the bound the module documents)."""
    rng = np.random.default_rng(2)
    values = rng.standard_normal((20_000, 3)) ** 3
    table = _tensor_table(str(tmp_path), values)
    monkeypatch.setattr(st, "READ_VALUES", 3 * 500)  # at most 500 rows per read
    monkeypatch.setattr(st, "SKETCH_VALUES", 3 * 256)  # k = 256 items per element and level
    seen = []
    real = st._Moments.add
    monkeypatch.setattr(st._Moments, "add",
                        lambda self, x, **kw: (seen.append(len(x)), real(self, x, **kw)))  # fmt: skip
    s = table.stats()["action"]
    assert max(seen) <= 500 and sum(seen) == 20_000
    _check(s, values, exact_quantiles=False)
    n = len(values)
    assert 0 < s.rank_error < n * 0.05
    for q, got in ((0.01, s.q01), (0.99, s.q99)):
        for e in range(3):
            col = np.sort(values[:, e])
            # rank of the returned value among the data vs the target rank
            lo, hi = np.searchsorted(col, got[e], "left"), np.searchsorted(col, got[e], "right")
            target = q * (n - 1)
            dist = 0 if lo <= target <= hi else min(abs(lo - target), abs(hi - target))
            assert dist <= s.rank_error, (q, e, dist, s.rank_error)


def test_second_call_reads_back_the_kept_result_also_after_reopen(tmp_path, monkeypatch):
    branch, _ = _project(str(tmp_path))
    first = branch.table("t").pin().stats(["x", "y"])
    keys = td.Client(str(tmp_path)).store.list("projects/p/stats")
    assert len(keys) == 2

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(st, "_compute_rows", boom)
    again = td.Client(str(tmp_path)).project("p").branch().table("t").pin().stats(["y", "x"])
    assert list(again) == ["y", "x"]
    for c in ("x", "y"):
        for f in ("count", "mean", "std", "min", "max", "q01", "q99"):
            np.testing.assert_array_equal(getattr(again[c], f), getattr(first[c], f))
    # a new version is a new computation
    branch.table("t").append(branch.table("t").pin().to_arrow().slice(0, 10))
    with pytest.raises(AssertionError, match="recomputed"):
        branch.table("t").stats(["x"])


def test_video_per_channel_over_sampled_frames(tmp_path):
    rng = np.random.default_rng(3)
    branch = td.Client(str(tmp_path)).project("p").branch()
    video = np.zeros((40, 16, 16, 3), np.uint8)
    video[..., 0] = 30  # flat channels survive H.264 almost exactly
    video[..., 1] = rng.integers(100, 140, (40, 1, 1), dtype=np.uint8)
    video[..., 2] = 200
    branch.table("v").append_episode(
        {"cam": td.VideoFrames(video, fps=30), "s": np.arange(40.0)}, episode="e"
    )
    t = branch.table("v").pin()
    a = t.stats(["cam"], frames=10, seed=1)["cam"]
    b = t.stats(["cam"], frames=10, seed=1)["cam"]
    assert int(a.count) == 10 * 16 * 16 and a.mean.shape == (3,)
    np.testing.assert_array_equal(a.mean, b.mean)
    assert abs(a.mean[0] - 30) < 3 and abs(a.mean[2] - 200) < 3
    assert a.min[1] >= 90 and a.max[1] <= 150
    # decoded pixels directly: the same statistics, exactly
    frames = t.stats(["cam"], frames=1000)["cam"]  # more than the table has: every frame
    assert int(frames.count) == 40 * 16 * 16
    early = t.stats(["cam"], where="s < 5", frames=1000)["cam"]  # only rows the filter keeps
    assert int(early.count) == 5 * 16 * 16
    loader = td.ScanDataset(t.scan_request(["cam"]), batch_size=40)
    px = next(iter(loader))["cam"].numpy().reshape(-1, 3).astype(np.float64)
    _check(frames, px)


def test_bad_input_names_the_column(tmp_path):
    branch, _ = _project(str(tmp_path))
    t = branch.table("t").pin()
    with pytest.raises(td.NotFound, match="nope"):
        t.stats(["nope"])
    with pytest.raises(td.PlanError, match="label"):
        t.stats(["label"])
    with pytest.raises(td.PlanError, match="frames"):
        t.stats(frames=0)
    with pytest.raises(td.PlanError, match="no rows"):
        t.stats(["x"], where="x > 1000")


def test_a_where_lance_cannot_use_is_a_plan_error_naming_it_and_the_table(tmp_path, capsys):
    # before: Lance's raw ValueError ("Invalid user input: Schema error: No field named
    # frmae ..., /home/runner/work/lance/...scanner.rs:839:33"); only the CLI reworded it
    from treadle.cli import main

    branch, _ = _project(str(tmp_path))
    t = branch.table("t").pin()
    for bad in ("frmae > 3", "x >", "x + 1"):
        with pytest.raises(td.PlanError, match=rf"where='{re.escape(bad)}' on table 't'") as e:
            t.stats(["y"], where=bad)
        assert "scanner.rs" not in str(e.value)
    with pytest.raises(td.PlanError, match="frmae"):
        t.stats(["y"], where="frmae > 3")
    args = ["stats", "p", "t", "--columns", "y", "--where", "frmae > 3", "--root", str(tmp_path)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "frmae" in err and "'t'" in err and "Traceback" not in err


def test_cli_stats_prints_a_table_and_json(tmp_path, capsys):
    from treadle.cli import main

    _project(str(tmp_path))
    assert main(["stats", "p", "t", "--columns", "x", "y", "--root", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "x" in text and "mean" in text and "q99" in text
    assert main(["stats", "p", "t", "--json", "--root", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["columns"]) == {"x", "y"} and data["columns"]["x"]["count"] == 3000
    assert main(["stats", "p", "t", "--columns", "label", "--root", str(tmp_path)]) == 1
    assert "label" in capsys.readouterr().err


def _lerobot_stats(tables, features):
    """meta/stats.json as LeRobot writes it: per-episode stats, then aggregated (weighted
    means, pooled variance: ``lerobot.datasets.compute_stats.aggregate_stats``)."""
    out = {}
    for f in features:
        per = [np.array(t.column(f).to_pylist(), np.float32) for t in tables]
        n = np.array([len(p) for p in per], np.float64)
        means = np.stack([p.mean(axis=0) for p in per])
        var = np.stack([p.var(axis=0) for p in per])
        mean = (means * n[:, None]).sum(0) / n.sum()
        total_var = ((var + (means - mean) ** 2) * n[:, None]).sum(0) / n.sum()
        out[f] = {
            "mean": mean.tolist(),
            "std": np.sqrt(total_var).tolist(),
            "min": np.min([p.min(0) for p in per], 0).tolist(),
            "max": np.max([p.max(0) for p in per], 0).tolist(),
            "count": [int(n.sum())],
        }
    out["observation.images.top"] = {"mean": [[[0.5]], [[0.5]], [[0.5]]]}  # 0..1, CHW
    return out


def test_lerobot_import_keeps_the_source_stats_and_they_agree(tmp_path):
    from importer_fixtures import make_lerobot_v3

    src = tmp_path / "src"
    written = make_lerobot_v3(src, lengths=(12, 9, 15))
    shipped = _lerobot_stats(written["tables"], ["observation.state", "action"])
    (src / "meta" / "stats.json").write_text(json.dumps(shipped))
    client = td.Client(str(tmp_path / "root"), create=True)
    td.importers.lerobot(str(src), client.project("p"), "demo")
    t = client.project("p").branch().table("demo").pin()
    kept = t.source_stats()
    assert set(kept) == {"observation_state", "action", "observation_images_top"}
    assert kept["action"]["source"] == "lerobot meta/stats.json"
    ours = t.stats(["observation_state", "action"])
    for col in ("observation_state", "action"):
        assert int(ours[col].count) == int(kept[col]["count"][0]) == 36
        # float32 source values: the pooled aggregate agrees to float32 rounding
        for f in ("mean", "std"):
            np.testing.assert_allclose(getattr(ours[col], f), kept[col][f], rtol=1e-6)
        for f in ("min", "max"):
            np.testing.assert_array_equal(getattr(ours[col], f), kept[col][f])


def test_lerobot_import_without_stats_keeps_nothing(tmp_path):
    from importer_fixtures import make_lerobot_v3

    make_lerobot_v3(tmp_path / "src")
    client = td.Client(str(tmp_path / "root"), create=True)
    td.importers.lerobot(str(tmp_path / "src"), client.project("p"), "demo")
    assert client.project("p").branch().table("demo").pin().source_stats() == {}


def test_merged_partial_states_equal_one_scan():
    from treadle.stats.moments import Moments, Sketch, rank_error_bound

    rng = np.random.default_rng(5)
    x = rng.standard_normal((5000, 3)) * [1, 100, 1e-3]
    for budget, exact in ((3 * 8192, True), (3 * 64, False)):  # exact; then compacted
        one_m, one_s = Moments(), Sketch(3, budget)
        for part in np.array_split(x, 25):
            one_m.add(part)
            one_s.add(part)
        all_m, all_s = Moments(), Sketch(3, budget)
        for chunk in np.array_split(x, 4):  # four "tasks" of batches, merged
            m, s = Moments(), Sketch(3, budget)
            for part in np.array_split(chunk, 7):
                m.add(part)
                s.add(part)
            all_m.merge(m)
            all_s.merge(s)
        assert all_m.n == one_m.n == all_s.n == len(x)
        np.testing.assert_array_equal(all_m.lo, x.min(axis=0))
        np.testing.assert_array_equal(all_m.hi, x.max(axis=0))
        np.testing.assert_allclose(all_m.mean, one_m.mean, rtol=1e-12)
        np.testing.assert_allclose(all_m.m2, one_m.m2, rtol=1e-12)
        assert (all_s.compacted_levels == 0) == exact
        err = rank_error_bound(all_s.n, all_s.k, all_s.compacted_levels)
        for q, got in zip((0.01, 0.99), all_s.quantiles((0.01, 0.99))):
            if exact:
                np.testing.assert_array_equal(got, np.quantile(x, q, axis=0))
            for e in range(3):  # the merged sketch's rank error stays within its bound
                rank = (x[:, e] < got[e]).sum()
                assert abs(rank - q * (len(x) - 1)) <= err + 1


def test_statistics_are_asked_of_the_project_that_keeps_them(tmp_path):
    """No hook: ``Table.stats`` calls its project's ``table_stats`` and ``Plan.stats`` the
    ``plan_stats`` of its first table's project (the TableSource a table holds)."""
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    branch.table("t").append({"x": np.arange(10, dtype=np.float64)})
    project, asked = branch.project, []
    for name in ("table_stats", "plan_stats"):
        real = getattr(project, name)

        def spy(what, *a, real=real, name=name, **k):
            asked.append((name, type(what).__name__))
            return real(what, *a, **k)

        setattr(project, name, spy)
    assert branch.table("t").pin().stats(["x"])["x"].max == 9
    plan = td.Recipe(0, 2, [td.Component(branch.table("t"), td.Windows({"x": td.Rows([0])}))])
    assert plan.plan().stats(["x"])["x"].min == 0
    assert asked == [("table_stats", "Table"), ("plan_stats", "Plan")]

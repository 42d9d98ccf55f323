"""Imports on Ray: one task per source, one commit on the driver, equal to one process.

One local Ray cluster (``ray.init(num_cpus=2)``, 127.0.0.1 only) serves the whole module.
Every Ray import is compared with the single-process import of the same sources, row for
row (and, for LeRobot, stream byte for stream byte): same schema, same rows in the same
order, same commit message (import id included).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from importer_fixtures import (
    make_hf,
    make_lerobot_v3,
    make_lerobot_v21,
    make_mds,
    make_wds,
    nothing_committed,
)
from ray_helpers import local_ray
from treadle import importers
from treadle.catalog import Client
from treadle.catalog.client import ProjectAddress
from treadle.errors import CorruptData, SchemaMismatch, TreadleError
from treadle.importers.executor import Executor
from treadle.table.handoff import add_staged, take_staged

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # Ray's own start-up


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    with local_ray() as ray:
        yield ray


@pytest.fixture
def client(local_root):
    return Client(local_root)


def _table(client, project, table="t"):
    return client.project(project).branch("main").table(table).pin()


def _assert_same(client, table="t", a="one", b="ray"):
    ta, tb = _table(client, a, table), _table(client, b, table)
    assert tb.schema.equals(ta.schema, check_metadata=True)
    got, want = tb.to_arrow(), ta.to_arrow()
    assert got.num_rows == want.num_rows > 0
    assert got.equals(want)  # row for row, in source order
    return ta, tb


def _data_files(root: str, project: str, table: str = "t") -> set[str]:
    folder = Path(root) / "projects" / project / "tables" / f"{table}.lance" / "data"
    return {p.name for p in folder.glob("*.lance")} if folder.exists() else set()


def _leases(root: str, project: str) -> list[str]:
    """The ids of the gc leases held in ``project`` (writers' markers under gc/writers)."""
    folder = Path(root) / "projects" / project / "gc" / "writers"
    return sorted({p.parent.name for p in folder.glob("*/*")})


def _referenced(client, project: str, table: str = "t") -> set[str]:
    t = _table(client, project, table)
    return {df.path for f in t.dataset.get_fragments() for df in f.data_files()}


@pytest.mark.slow
def test_webdataset_on_ray_equals_one_process(tmp_path, client, ray_cluster, monkeypatch):
    pattern = make_wds(tmp_path / "wds", n=60, per_shard=25)  # 3 shards
    one = importers.webdataset(pattern, client.project("one"), "t", images="decoded")
    bars: list[tuple[int | None, str]] = []
    counted: list[int] = []
    real_init, real_update = importers.run.Progress.__init__, importers.run.Progress.update

    def init(self, total, desc, unit, enabled):
        bars.append((total, unit))
        real_init(self, total, desc, unit, enabled)

    def update(self, n):
        counted.append(n)
        real_update(self, n)

    monkeypatch.setattr(importers.run.Progress, "__init__", init)
    monkeypatch.setattr(importers.run.Progress, "update", update)
    ex = td.RayExecutor()
    res = importers.webdataset(
        pattern, client.project("ray"), "t", images="decoded", executor=ex, progress=False
    )
    monkeypatch.undo()
    assert bars == [(3, "source")] and counted == [1, 1, 1]  # the bar counts sources
    assert (res.rows, res.import_id) == (one.rows, one.import_id) == (60, one.import_id)
    assert res.commit.message == one.commit.message  # same import id in the message
    _assert_same(client)
    assert len(client.project("ray").branch("main").log()) == 2  # created, then one commit
    # re-running (on Ray or not) finds the import id and does nothing
    again = importers.webdataset(pattern, client.project("ray"), "t", images="decoded", executor=ex)
    plain = importers.webdataset(pattern, client.project("ray"), "t", images="decoded")
    assert again.skipped and plain.skipped and again.commit.id == res.commit.id


@pytest.mark.slow
def test_mds_on_ray_equals_one_process(tmp_path, client, ray_cluster):
    folder = make_mds(tmp_path / "mds", n=40, compression="zstd", size_limit=1 << 13)
    assert len(json.loads(Path(folder, "index.json").read_text())["shards"]) > 2
    one = importers.mds(folder, client.project("one"), "t", images="decoded", progress=False)
    res = importers.mds(
        folder, client.project("ray"), "t", images="decoded", executor=td.RayExecutor()
    )
    assert res.rows == one.rows == 40 and res.commit.message == one.commit.message
    _assert_same(client)


@pytest.mark.slow
def test_hf_on_ray_equals_one_process(tmp_path, client, ray_cluster):
    folder = make_hf(tmp_path / "hf", n=40)
    assert len(list(Path(folder).glob("*.arrow"))) > 1  # several files: several tasks
    one = importers.hf(folder, client.project("one"), "t", images="decoded", progress=False)
    res = importers.hf(
        folder, client.project("ray"), "t", images="decoded", executor=td.RayExecutor()
    )
    assert res.rows == one.rows == 40 and res.commit.message == one.commit.message
    _assert_same(client)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_lerobot_on_ray_equals_one_process(tmp_path, client, ray_cluster, version):
    src = tmp_path / "ds"
    if version == "v3.0":  # episodes start mid-GOP: each is decoded and re-encoded
        make_lerobot_v3(src, lengths=(12, 9, 15), cams=("observation.images.top",))
    else:  # one MP4 per episode: remuxed
        make_lerobot_v21(src, lengths=(10, 7, 8))
    one = importers.lerobot(str(src), client.project("one"), "robot", progress=False)
    res = importers.lerobot(
        str(src), client.project("ray"), "robot", executor=td.RayExecutor(), progress=False
    )
    assert (res.rows, res.episodes) == (one.rows, one.episodes)
    assert res.commit.message == one.commit.message
    ta, tb = _assert_same(client, "robot")
    assert tb.video_columns and tb.num_episodes == one.episodes
    for col in tb.video_columns:  # every episode's stream, byte for byte (so frame for frame)
        keys = {r["stream"] for r in tb.to_arrow([col]).column(col).to_pylist()}
        assert len(keys) == one.episodes
        for key in keys:
            got = client.store.get(f"{tb.project.prefix}/{key}")
            assert got == client.store.get(f"{ta.project.prefix}/{key}") and got


def test_a_video_import_on_ray_stages_each_source_once(tmp_path, client, ray_cluster, monkeypatch):
    # before: each task's schema records its own episodes' frame sizes, which differ from
    # the first task's, and every task but one was staged a second time ("cast to the
    # first one's schema"), though only what each recorded of its rows differed
    src = tmp_path / "ds"
    make_lerobot_v21(src, lengths=(10, 7, 8))
    runs, real = [], td.RayExecutor._run_tasks

    def counted(self, ray, submit, indices, *a, **kw):
        runs.extend(indices)
        return real(self, ray, submit, indices, *a, **kw)

    monkeypatch.setattr(td.RayExecutor, "_run_tasks", counted)
    importers.lerobot(str(src), client.project("ray"), "robot", executor=td.RayExecutor(),
                      progress=False)  # fmt: skip
    assert sorted(runs) == list(range(len(runs))) and len(runs) > 1


@pytest.mark.slow
def test_rlds_on_ray_equals_one_process(client, ray_cluster):
    """One task per TFRecord shard: episodes named from dataset_info.json's shard lengths."""
    src = ROOT / "tests" / "fixtures" / "rlds" / "bridge_like" / "1.0.0"  # 3 shards
    one = importers.rlds(src, client.project("one"), "t", fps=10, progress=False)
    res = importers.rlds(src, client.project("ray"), "t", fps=10, executor=td.RayExecutor())
    assert (res.rows, res.episodes, res.bytes_read) == (one.rows, one.episodes, one.bytes_read)
    assert res.commit.message == one.commit.message
    ta, tb = _assert_same(client)
    assert tb.episodes().names == [f"episode_{i:06d}" for i in range(7)]
    for col in tb.video_columns:  # every episode's stream, byte for byte
        keys = {r["stream"] for r in tb.to_arrow([col]).column(col).to_pylist()}
        assert len(keys) == 7
        for key in keys:
            got = client.store.get(f"{tb.project.prefix}/{key}")
            assert got == client.store.get(f"{ta.project.prefix}/{key}") and got


@pytest.mark.slow
@pytest.mark.s3
def test_lerobot_on_ray_into_s3(tmp_path, s3_root, ray_cluster):
    url, opts = s3_root  # tasks open the S3 root themselves: fragments and media land there
    client = Client(url, opts)
    make_lerobot_v21(tmp_path / "ds", lengths=(6, 5, 7))
    one = importers.lerobot(str(tmp_path / "ds"), client.project("one"), "t", progress=False)
    res = importers.lerobot(
        str(tmp_path / "ds"), client.project("ray"), "t", executor=td.RayExecutor()
    )
    assert res.rows == one.rows == 18
    _, tb = _assert_same(client)
    col = tb.video_columns[0]
    keys = {r["stream"] for r in tb.to_arrow([col]).column(col).to_pylist()}
    assert len(keys) == 3
    assert all(client.store.exists(f"projects/ray/{k}") for k in keys)


@pytest.mark.slow
def test_killed_task_is_retried_and_the_result_is_equal(tmp_path, client, ray_cluster):
    pattern = make_wds(tmp_path / "wds", n=60, per_shard=20)  # 3 shards
    importers.webdataset(pattern, client.project("one"), "t", progress=False)
    marker = tmp_path / "crash"
    marker.mkdir()
    ex = td.RayExecutor(max_retries=2)
    # shard 0 dies after staging, its transaction still open (as a force-cancelled task
    # does): its retry ends last, and it leaves no lease that would keep its files from gc
    ex._crash = (0, str(marker), 1)
    res = importers.webdataset(pattern, client.project("ray"), "t", executor=ex, progress=False)
    assert (marker / "attempt-0").exists()  # the first attempt did die
    assert res.rows == 60
    _assert_same(client)
    root = client.root
    orphans = _data_files(root, "ray") - _referenced(client, "ray")
    assert orphans, "the killed attempt's staged files are on disk, referenced by no version"
    client.project("ray").gc(older_than=timedelta(0))
    assert _data_files(root, "ray") == _referenced(client, "ray")
    _assert_same(client)


def _tar(path: Path, samples: list[tuple[str, dict]]) -> None:
    with tarfile.open(path, "w") as tar:
        for key, value in samples:
            data = json.dumps(value).encode()
            info = tarfile.TarInfo(f"{key}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.slow
def test_failed_import_commits_nothing_and_gc_removes_what_it_staged(tmp_path, client, ray_cluster):
    first = make_wds(tmp_path / "a", n=20, per_shard=10)
    importers.webdataset(first, client.project("p"), "t", progress=False)
    before = _table(client, "p").to_arrow()
    head = client.project("p").branch("main").commit_id
    committed = _referenced(client, "p")
    second = make_wds(tmp_path / "b", n=30, per_shard=10, seed=1)
    # every attempt of shard 0 dies after staging (its transaction open): Ray gives up
    # after max_retries
    marker = tmp_path / "crash"
    marker.mkdir()
    ex = td.RayExecutor(max_retries=1)
    ex._crash = (0, str(marker), 99)
    with pytest.raises(TreadleError, match=r"failed 2 time\(s\).*nothing was committed"):
        importers.webdataset(second, client.project("p"), "t", executor=ex, progress=False)
    assert client.project("p").branch("main").commit_id == head  # nothing committed
    assert _data_files(client.root, "p") > committed  # what the tasks staged is on disk
    # a source that fails raises its own error (type and message), nothing is committed
    (tmp_path / "b" / "shard-000001.tar").write_bytes(b"not a tar file at all" * 50)
    with pytest.raises(CorruptData, match="shard-000001.tar"):
        importers.webdataset(second, client.project("p"), "t", executor=td.RayExecutor())
    assert client.project("p").branch("main").commit_id == head
    client.project("p").gc(older_than=timedelta(0))
    assert _data_files(client.root, "p") == committed  # gc removed every staged file
    assert _table(client, "p").to_arrow().equals(before)
    # the interrupted import, re-run once its source is whole again, starts cleanly
    make_wds(tmp_path / "b", n=30, per_shard=10, seed=1)
    res = importers.webdataset(second, client.project("p"), "t", executor=td.RayExecutor())
    assert res.rows == 30 and not res.skipped
    assert res.commit.parents == (head,)  # the branch moved once, from where it was
    keys = _table(client, "p").to_arrow(["key"]).column("key").to_pylist()
    assert keys == [f"sample{i:05d}" for i in range(20)] + [f"sample{i:05d}" for i in range(30)]


@pytest.mark.slow
def test_gc_during_the_import_keeps_what_tasks_staged(tmp_path, client, ray_cluster, monkeypatch):
    """The driver takes its gc lease before the first task stages: a gc while the import
    runs keeps every task's files, even those older than the grace, once their task ended."""
    import time

    import treadle.catalog.leases as leases
    from treadle.catalog.transaction import Transaction

    first = make_wds(tmp_path / "a", n=10, per_shard=10)
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=10, seed=1)
    for project in ("one", "ray"):  # the table exists: gc sweeps its unlisted data files
        importers.webdataset(first, client.project(project), "t", progress=False)
    importers.webdataset(pattern, client.project("one"), "t", progress=False)
    driver: list[Transaction] = []
    real_hold, real_update = Transaction.hold, importers.run.Progress.update
    removed: list[int] = []

    def hold(self):
        driver.append(self)
        real_hold(self)

    def update(self, n):
        if not removed:  # the first source is staged and its task has ended
            time.sleep(2.5)  # its files are now older than the grace
            driver[-1].hold()  # the driver is alive (a fresh beat)
            report = client.project("ray").gc(older_than=timedelta(seconds=2))
            removed.append(report.removed_bytes + report.removed_files + len(report.removed_tables))
        real_update(self, n)

    monkeypatch.setattr(leases, "_BEAT_S", 0.0)  # every hold() writes a beat
    monkeypatch.setattr(Transaction, "hold", hold)
    monkeypatch.setattr(importers.run.Progress, "update", update)
    res = importers.webdataset(pattern, client.project("ray"), "t", executor=td.RayExecutor())
    monkeypatch.undo()
    assert removed == [0] and res.rows == 30
    _assert_same(client)


@pytest.mark.slow
def test_a_task_cancelled_mid_transaction_leaves_nothing_for_gc_to_keep(
    tmp_path, client, ray_cluster, monkeypatch
):
    """Ctrl-C while a task has staged its file, its transaction still open: the forced
    cancel kills its worker there. It used to leave its own gc lease, which kept its file
    from gc(older_than=0) for 5 minutes (the flaky test below, about 1 run in 30)."""
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=10)
    client.project("p").create()
    marker = tmp_path / "hang"
    marker.mkdir()
    ex = td.RayExecutor()
    ex._crash = (1, str(marker), -1)  # source 1 stages, then waits there to be cancelled

    def interrupt(self, n):  # Ctrl-C as source 0 completes, once source 1 has staged
        for _ in range(1200):
            if (marker / "staged").exists():
                break
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(importers.run.Progress, "update", interrupt)
    with pytest.raises(KeyboardInterrupt):
        importers.webdataset(pattern, client.project("p"), "t", executor=ex)
    monkeypatch.undo()
    assert (marker / "staged").exists()
    assert nothing_committed(client.project("p"))
    assert _data_files(client.root, "p")  # source 1's file, staged before the cancel
    assert _leases(client.root, "p") == []
    client.project("p").gc(older_than=timedelta(0))
    assert not _data_files(client.root, "p")


@pytest.mark.slow
def test_cancelled_import_commits_nothing(tmp_path, client, ray_cluster, monkeypatch):
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=10)
    client.project("p").create()
    head = client.project("p").branch("main").commit_id

    def interrupt(self, n):  # Ctrl-C as the first source completes
        raise KeyboardInterrupt

    monkeypatch.setattr(importers.run.Progress, "update", interrupt)
    with pytest.raises(KeyboardInterrupt):
        importers.webdataset(pattern, client.project("p"), "t", executor=td.RayExecutor())
    monkeypatch.undo()
    assert client.project("p").branch("main").commit_id == head
    assert nothing_committed(client.project("p"))
    # no lease is left: a task killed mid-write by the cancel used to leave its own, which
    # kept what it staged from gc (for 5 minutes), so a file outlived the gc below
    assert _leases(client.root, "p") == []
    client.project("p").gc(older_than=timedelta(0))
    assert not _data_files(client.root, "p")  # the staged table's files are gone


@pytest.mark.slow
def test_first_source_fixes_the_schema_as_in_one_process(tmp_path, client, ray_cluster):
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    ok.mkdir(), bad.mkdir()
    _tar(ok / "s-0.tar", [(f"a{i}", {"v": 0.5 + i}) for i in range(3)])  # double
    _tar(ok / "s-1.tar", [(f"b{i}", {"v": i}) for i in range(3)])  # int64: cast to double
    one = importers.webdataset(str(ok), client.project("one"), "t", progress=False)
    res = importers.webdataset(str(ok), client.project("ray"), "t", executor=td.RayExecutor())
    assert res.rows == one.rows == 6
    ta, _ = _assert_same(client)
    assert str(ta.schema.field("json").type) == "struct<v: double>"
    _tar(bad / "s-0.tar", [("a", {"v": 0.5})])
    _tar(bad / "s-1.tar", [("b", {"v": "text"})])  # does not fit: both refuse it
    with pytest.raises(SchemaMismatch):
        importers.webdataset(str(bad), client.project("one"), "u", progress=False)
    with pytest.raises(SchemaMismatch, match="s-1.tar"):  # names the source
        importers.webdataset(str(bad), client.project("ray"), "u", executor=td.RayExecutor())
    assert "u" not in client.project("ray").branch("main").tables()
    extra = tmp_path / "extra"
    extra.mkdir()
    _tar(extra / "s-0.tar", [("a", {"v": 0.5})])
    _tar(extra / "s-1.tar", [("b", {"v": 1.5, "w": 2})])  # a key the first shard lacks
    # one process refuses it in a later chunk (the first chunk fixes JSON types); a Ray task
    # holds one source, so there each later source is a later chunk
    with pytest.raises(SchemaMismatch):
        importers.webdataset(str(extra), client.project("one"), "w", chunk_rows=1)
    with pytest.raises(SchemaMismatch, match="s-1.tar"):  # refused too, never dropped
        importers.webdataset(str(extra), client.project("ray"), "w", executor=td.RayExecutor())
    assert "w" not in client.project("ray").branch("main").tables()


@pytest.mark.slow
def test_cli_ray_flag(tmp_path, local_root, ray_cluster, capsys):
    from treadle.cli import main

    pattern = make_wds(tmp_path / "wds", n=12, per_shard=6)
    args = ["import", "webdataset", pattern, "--table", "t", "--root", local_root]
    assert main([*args, "--project", "one", "--no-progress"]) == 0
    assert main([*args, "--project", "ray", "--ray", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rows"] == 12 and out["commit"]
    _assert_same(Client(local_root))


NO_RAY = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed
import treadle as td
from treadle.cli import main
try:
    td.RayExecutor()
except td.MissingDependency as e:
    print("API:", e)
code = main(["import", "webdataset", {src!r}, "--project", "p", "--table", "t",
             "--root", {root!r}, "--ray"])
print("CLI exit:", code)
from treadle.cli import main as treadle_main
print("stats exit:", treadle_main(["stats", "p", "t", "--root", {root!r}, "--ray"]))
"""


def test_without_ray_it_says_how_to_install(tmp_path, local_root):
    pattern = make_wds(tmp_path / "wds", n=4, per_shard=4)
    code = NO_RAY.format(src=pattern, root=local_root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    need = "td.RayExecutor (--ray on treadle import and treadle stats) needs the 'ray' package"
    assert f"API: {need}" in proc.stdout
    assert "pip install 'treadle[ray]'" in proc.stdout
    assert "CLI exit: 1" in proc.stdout
    assert "MissingDependency" in proc.stderr and "pip install 'treadle[ray]'" in proc.stderr
    assert "stats exit: 1" in proc.stdout  # treadle stats --ray: the same message
    # before: "imports on Ray need ..." from treadle stats --ray too, which imports nothing
    assert proc.stderr.count(need) == 2
    assert nothing_committed(Client(local_root).project("p"))


@pytest.mark.slow
def test_bench_case_tiny_smoke(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TREADLE_BENCH_DATA", str(tmp_path))  # its shards: not in the checkout
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import case_import_ray as ci
    finally:
        sys.path.remove(str(ROOT / "bench"))
    results = ci.run(tiny=True, runs=1, log=lambda _msg: None)
    assert [r.name for r in results] == ["one process", "ray"]
    assert all(r.runs and r.runs[0].samples == 160 and r.rate > 0 for r in results)
    assert ci.ratio(results) > 0  # no timing asserted: only that both ran
    assert (tmp_path / "import-ray-160" / ".done").exists()


class _Backwards(Executor):
    """Stages each source in its own transaction, last source first, in this process."""

    def write(self, tw, write, sources, bar):
        staged, totals = {}, [0, 0, 0]
        for i in reversed(range(len(sources))):
            other = tw.tx.branch.transaction("never committed").table(tw.name)
            for k, n in enumerate(write(other, bar, [i])):
                totals[k] += n
            staged[i] = take_staged(other)
            other.tx.close()
        for i in range(len(sources)):
            add_staged(tw, staged[i])
        return tuple(totals)


def test_executor_protocol_commits_once_in_source_order(tmp_path, client):
    """No Ray needed: sources staged elsewhere, out of order, commit like one process."""
    pattern = make_wds(tmp_path / "wds", n=30, per_shard=10)
    one = importers.webdataset(pattern, client.project("one"), "t", progress=False)
    res = importers.webdataset(pattern, client.project("ray"), "t", executor=_Backwards())
    assert res.rows == 30 and res.commit.message == one.commit.message
    _assert_same(client)
    folder = make_mds(tmp_path / "mds", n=20, size_limit=1 << 13)
    importers.mds(folder, client.project("one"), "m", progress=False)
    importers.mds(folder, client.project("ray"), "m", executor=_Backwards())
    _assert_same(client, "m")


def test_a_task_stages_under_the_drivers_lease_and_stops_once_it_is_gone(client):
    """No Ray needed: a task's transaction takes no gc lease of its own (killed mid-write,
    it leaves none that keeps its files from gc), and writes nothing once the driver's
    lease is gone (the import ended)."""
    client.project("p").create()
    branch = client.project("p").branch("main")
    driver = branch.transaction("import")
    driver.hold()
    task = branch.transaction("stage (never committed)")
    task.stage_under(driver.lease_key)
    tw = task.table("t")
    tw.append({"x": pa.array([1, 2])})
    assert take_staged(tw).rows == 2  # written, under the driver's lease
    assert _data_files(client.root, "p")
    assert _leases(client.root, "p") == [driver.lease_key.rpartition("/")[2]]
    driver.close()  # the task "was killed": never closed; the import ends
    assert _leases(client.root, "p") == []
    client.project("p").gc(older_than=timedelta(0))
    assert not _data_files(client.root, "p")  # nothing keeps the task's files from gc
    late = branch.transaction("stage (never committed)")
    late.stage_under(driver.lease_key)  # a task still running, or rerun, after the end
    tw = late.table("t")
    tw.append({"x": pa.array([3])})
    with pytest.raises(TreadleError, match="lease .* is gone"):
        take_staged(tw)
    assert not _data_files(client.root, "p") and _leases(client.root, "p") == []
    held = branch.transaction("x")
    held.hold()
    with pytest.raises(TreadleError, match="already holds"):
        held.stage_under(driver.lease_key)
    held.close()


def test_add_staged_refuses_another_tensor_shape(client):
    """[2, 3] and [3, 2] tensors have the same Arrow type: the shape metadata decides."""
    branch = client.project("p").branch("main")
    elsewhere = branch.transaction("never committed").table("t")
    elsewhere.append({"x": np.zeros((4, 3, 2), np.float32)})
    staged = take_staged(elsewhere)
    elsewhere.tx.close()
    assert staged.rows == 4 and staged.fragments
    with pytest.raises(SchemaMismatch, match="table 't'"):
        with branch.transaction("import") as tx:
            tw = tx.table("t")
            tw.append({"x": np.zeros((1, 2, 3), np.float32)})
            assert tw.schema.field("x").type == staged.schema.field("x").type
            add_staged(tw, staged)
    assert branch.tables() == []
    with pytest.raises(TreadleError, match="use_schema after rows"):
        tw = branch.transaction("x").table("t")
        tw.append({"y": pa.array([1])})
        tw.use_schema(staged.schema)


@pytest.mark.parametrize(
    "later",
    [
        {"v": 1.5, "w": 2},  # a field the table lacks: Arrow's cast would drop it
        {"w": 2},  # another field: the cast would fill "v" with nulls
        {"v": 2, "inner": {"x": 1}},  # a nested struct the table lacks
    ],
)
def test_appending_a_struct_with_other_fields_is_refused(client, later):
    """A source conformed to another's schema (as on Ray) may cast, but never drop or
    invent a struct field: ``conform`` refuses what Arrow's by-name cast would change."""
    ref = client.project("p").branch("main").table("t")
    ref.append(pa.table({"json": pa.array([{"v": 0.5}])}))
    with pytest.raises(SchemaMismatch, match="'json'"):
        ref.append(pa.table({"json": pa.array([later])}))
    ref.append(pa.table({"json": pa.array([{"v": 2}])}))  # int64 -> double: exact, kept
    assert ref.to_arrow().column("json").to_pylist() == [{"v": 0.5}, {"v": 2.0}]


def _stats_table(root: str):
    """A table of several fragments (one per append) with a scalar and a tensor column."""
    from treadle.stats import table_stats as st

    rng = np.random.default_rng(3)
    branch = td.Client(root, create=True).project("s").branch()
    for i, n in enumerate([800, 300, 120, 50]):  # each more than the later ones: 4 fragments
        action = (rng.standard_normal((n, 2, 3)) * [[1, 10, 100], [1e-3, 5, 7]]).astype(np.float32)
        branch.table("t").append_episode(
            {"action": action, "y": rng.standard_normal(n) * 3 + i}, episode=f"e{i}"
        )
    table = branch.table("t").pin()
    assert len(table.dataset.get_fragments()) == 4
    return table, st


def _assert_stats_equal(got, want):
    assert list(got) == list(want)
    for c in want:
        g, w = got[c], want[c]
        for f in ("count", "min", "max", "q01", "q99"):  # exact: the same values
            np.testing.assert_array_equal(getattr(g, f), getattr(w, f), err_msg=f"{c}.{f}")
        np.testing.assert_allclose(g.mean, w.mean, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(g.std, w.std, rtol=1e-12, atol=1e-300)
        assert g.rank_error == w.rank_error == 0


@pytest.mark.slow
def test_stats_on_ray_equal_one_process_and_are_kept(tmp_path, ray_cluster, monkeypatch):
    table, st = _stats_table(str(tmp_path / "one"))
    want = table.stats()
    want_where = table.stats(["y", "action"], where="y > 1")
    ray_table, _ = _stats_table(str(tmp_path / "ray"))
    monkeypatch.setattr(st, "TASK_VALUES", 1)  # one task per fragment
    tasks = st._tasks(ray_table, ["y"], None, ProjectAddress.of(ray_table.project))
    assert [t.fragments for t in tasks] == [(0,), (1,), (2,), (3,)]
    ex = td.RayExecutor()
    _assert_stats_equal(ray_table.stats(executor=ex), want)
    _assert_stats_equal(ray_table.stats(["y", "action"], where="y > 1", executor=ex), want_where)

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(st, "_compute_rows", boom)  # kept: read back, with or without Ray
    again = td.Client(str(tmp_path / "ray")).project("s").branch().table("t").pin()
    _assert_stats_equal(again.stats(), want)
    _assert_stats_equal(again.stats(["y", "action"], where="y > 1", executor=ex), want_where)


@pytest.mark.slow
def test_stats_cli_on_ray(tmp_path, ray_cluster, capsys):
    from treadle.cli import main

    _stats_table(str(tmp_path / "ray"))  # nothing kept yet: the CLI computes on Ray
    args = ["stats", "s", "t", "--columns", "y", "--json", "--root", str(tmp_path / "ray")]
    assert main([*args, "--ray"]) == 0
    got = json.loads(capsys.readouterr().out)["columns"]["y"]
    table, _ = _stats_table(str(tmp_path / "one"))
    want = table.stats(["y"])["y"].to_dict()
    assert got["count"] == want["count"] and got["max"] == want["max"]
    assert got["q01"] == want["q01"] and np.isclose(got["mean"], want["mean"], rtol=1e-12)

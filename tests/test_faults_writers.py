"""Writers that die and writers that race.

- A writer process SIGKILLed at seeded random points during ``append``,
  ``append_episode`` (with video), a two-table transaction and a WebDataset import
  leaves the branch at a commit whose every table holds exactly what the log says:
  never half a commit. A later writer proceeds, and gc at a zero grace, once the dead
  writer's lease is past its TTL (:data:`treadle.catalog.leases.LEASE_TTL`), removes
  every Lance data file, table and media object no commit reaches.
- 8 writer processes x 25 commits on one branch (local disk and S3): no commit lost,
  log and row counts exact.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import treadle as td
from treadle.catalog.gc import collect_garbage
from treadle.catalog.leases import LEASE_TTL

_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import treadle as td
    mode, root, opts, shards = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    client = td.Client(root, storage_options=opts or None)
    project = client.project("p")
    main = project.branch("main")
    rng = np.random.default_rng(len(main.log()))
    start = len(main.log())
    print("ready", flush=True)
    for i in range(start, start + 200):
        if mode == "append":
            main.table("t").append({"x": np.full(50, i), "y": rng.random((50, 4))}, message=f"c{i}")
        elif mode == "episode":
            frames = rng.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8)
            main.table("v").append_episode(
                {"cam": td.VideoFrames(frames, fps=10), "a": rng.random((6, 2))},
                episode=f"e{i}", message=f"c{i}")
        elif mode == "tx":
            with main.transaction(f"c{i}") as tx:
                tx.table("a").append({"x": np.full(20, i)})
                tx.table(f"new{i}").append({"x": np.full(5, i)})  # a table only this commit makes
                frames = rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
                tx.table("b").append_episode({"cam": td.VideoFrames(frames, fps=10)},
                                             episode=f"e{i}")
        elif mode == "import":
            import io, tarfile
            import treadle.importers as ti
            path = f"{shards}/shard-{i:06d}.tar"
            with tarfile.open(path, "w") as tar:
                for k in range(40):
                    for ext, data in (("cls", str(i).encode()), ("txt", f"caption {k}".encode())):
                        info = tarfile.TarInfo(f"s{k:05d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            ti.webdataset(path, project, "w", progress=False)
    """
)


def _kill_during(mode: str, root: str, opts: dict | None, shards: str, delay: float) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode, root, json.dumps(opts or {}), shards],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = p.stdout.readline() if p.stdout else b""
        assert line.strip() == b"ready", (line, p.stderr.read() if p.stderr else b"")
        time.sleep(delay)
        alive = p.poll() is None
        assert alive, p.stderr.read().decode()[-2000:] if p.stderr else ""
        p.kill()  # SIGKILL: no cleanup, no atexit, no flush
    finally:
        p.wait(timeout=30)
        if p.stdout:
            p.stdout.close()
        if p.stderr:
            p.stderr.close()


def _check_consistent(project: td.Project, mode: str) -> int:
    """Every table of the head holds exactly the rows the log's commits wrote."""
    main = project.branch()
    log = main.log()
    done = sorted(
        int(c.message[1:]) for c in log if c.message[:1] == "c" and c.message[1:].isdigit()
    )
    head = main.head()
    if mode == "append" and done:
        t = main.table("t").to_arrow()
        assert sorted(set(t.column("x").to_pylist())) == done
        assert t.num_rows == 50 * len(done)
    if mode == "episode" and done:
        t = main.table("v")
        names = sorted(set(t.to_arrow(["episode"]).column("episode").to_pylist()))
        assert names == sorted(f"e{i}" for i in done)
        assert t.num_moments == 6 * len(done)
    if mode == "tx" and done:
        a = main.table("a").to_arrow().column("x").to_pylist()
        assert sorted(set(a)) == done and len(a) == 20 * len(done)
        b = main.table("b").to_arrow(["episode"]).column("episode").to_pylist()
        assert sorted(set(b)) == sorted(f"e{i}" for i in done)
        assert {n for n in head.tables if n.startswith("new")} == {f"new{i}" for i in done}
    if mode == "import":
        imports = [c for c in log if "import-id=" in c.message]
        if imports:
            w = main.table("w").to_arrow()
            assert w.num_rows == 40 * len(imports)
            assert len(set(w.column("cls").to_pylist())) == len(imports)
    store = project.client.store
    for name, v in head.tables.items():  # every media object a committed row names exists
        ds = project.open_dataset(name, v)
        for f in ds.schema:
            if f.name == "cam":
                col = ds.to_table(columns=["cam"]).column("cam")
                for s in pc.unique(pc.struct_field(col, "stream")).to_pylist():
                    assert store.exists(f"{project.prefix}/{s}"), s
    return len(log)


def _orphans(project: td.Project) -> list[str]:
    """Objects under the project no reachable commit needs (Lance data files, tables, media)."""
    from treadle.catalog.retention import plan_retention

    store = project.client.store
    keep = plan_retention(project, None, datetime.now(UTC)).versions  # reachable, unexpired
    needed: set[str] = set()
    media: set[str] = set()
    for name, versions in keep.items():
        for v in versions:
            ds = project.open_dataset(name, v)
            for frag in ds.get_fragments():
                needed.update(Path(df.path).name for df in frag.data_files())
            if "cam" in ds.schema.names:
                col = ds.to_table(columns=["cam"]).column("cam")
                media.update(pc.unique(pc.struct_field(col, "stream")).to_pylist())
    out = []
    tables = f"{project.prefix}/tables/"
    for key in store.list(tables):
        table, _, rest = key[len(tables) :].partition("/")
        if table[: -len(".lance")] not in keep:
            out.append(key)
        elif rest.startswith("data/") and rest.rsplit("/", 1)[-1] not in needed:
            out.append(key)
    for key in store.list(f"{project.prefix}/media"):
        if key[len(project.prefix) + 1 :] not in media:
            out.append(key)
    if store.is_local:  # not even an empty folder of a removed table
        out += [str(d) for d in Path(store.url, tables).glob("*.lance")
                if d.name[: -len(".lance")] not in keep]  # fmt: skip
    return sorted(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,where",
    [("append", "local"), ("episode", "local"), ("tx", "local"), ("import", "local"), ("tx", "s3")],
)
def test_killed_writer_leaves_old_or_new_commit(mode, where, tmp_path, request):
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        root, opts = server.url(f"crash-{time.time_ns()}"), server.storage_options()
    else:
        (tmp_path / "store").mkdir()
        root, opts = str(tmp_path / "store"), None
    shards = tmp_path / "shards"
    shards.mkdir()
    project = td.Client(root, storage_options=opts).project("p")
    project.create()  # the writers read its log first
    rng = random.Random(f"crash-{mode}-{where}")
    commits = _check_consistent(project, mode)
    t0 = time.monotonic()
    kills = 0
    while kills < 3 and time.monotonic() - t0 < 30:
        _kill_during(mode, root, opts, str(shards), rng.uniform(0.05, 0.8))
        kills += 1
        project = td.Client(root, storage_options=opts).project("p")  # no cached head
        n = _check_consistent(project, mode)
        assert n >= commits
        commits = n
    # a later writer proceeds
    main = project.branch()
    main.table("after").append({"x": np.arange(3)}, message="after the crash")
    assert main.log()[0].message == "after the crash"
    assert len(main.log()) == commits + 1
    later = datetime.now(UTC) + LEASE_TTL + timedelta(minutes=1)  # the killed one's lease: dead
    report = collect_garbage(project, timedelta(0), now=later)
    assert _orphans(project) == [], report
    project = td.Client(root, storage_options=opts).project("p")
    _check_consistent(project, mode)  # gc removed nothing a commit needs
    print(
        f"{mode} on {where}: {kills} kills, {commits} commits survived; gc removed "
        f"{report.removed_versions} versions, {len(report.removed_media)} media objects, "
        f"tables {report.removed_tables}"
    )


class _Killed(BaseException):
    """Stands in for SIGKILL at one exact point (nothing after it runs)."""


@pytest.mark.parametrize("phase", ["fragments", "lance_commit", "commit_object"])
def test_crash_at_each_commit_phase_is_invisible_and_collected(phase, any_root, monkeypatch):
    """Die after the data files, after the Lance versions, or after the commit object
    (just before the branch moves): the branch is unchanged, a new writer proceeds, and
    gc(older_than=0) leaves no orphan (including an unreachable *latest* Lance version
    and a table only the dead transaction created)."""
    import treadle.catalog.transaction as write
    from treadle.catalog.refs import RefLog

    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("a").append({"x": np.arange(3)}, message="base")
    head = main.commit_id
    real_overwrite, real_advance = write._lance_commit, RefLog.try_advance

    def overwrite(*a, **k):
        if phase == "fragments":
            raise _Killed
        return real_overwrite(*a, **k)

    def advance(self, branch, seq, commit_id):
        if branch == "main" and seq > 1:
            raise _Killed
        return real_advance(self, branch, seq, commit_id)

    monkeypatch.setattr(write, "_lance_commit", overwrite)
    if phase == "commit_object":
        monkeypatch.setattr(RefLog, "try_advance", advance)
    elif phase == "lance_commit":

        def save_commit(self, commit):
            raise _Killed

        monkeypatch.setattr(td.Project, "save_commit", save_commit)
    rng = np.random.default_rng(1)
    with pytest.raises(_Killed):
        with main.transaction("dies") as tx:
            tx.table("a").append({"x": np.arange(5)})
            tx.table("fresh").append({"y": np.arange(2)})
            frames = rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
            tx.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="e")
    monkeypatch.undo()
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    assert main.commit_id == head
    assert main.table("a").to_arrow().num_rows == 3
    left = _orphans(project)
    assert left  # the dead transaction left files behind
    report = project.gc(older_than=timedelta(0))
    print(f"{phase}: {len(left)} orphans, gc removed {report.removed_versions} versions, "
          f"media {len(report.removed_media)}, tables {report.removed_tables}")  # fmt: skip
    assert _orphans(project) == [], report
    if phase != "fragments":
        assert "fresh" in report.removed_tables
    main.table("a").append({"x": np.arange(2)}, message="later writer")
    assert main.table("a").to_arrow().num_rows == 5
    assert [c.message for c in main.log()][:2] == ["later writer", "base"]

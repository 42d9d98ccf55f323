"""gc while writers and imports run: it deletes only what is unreachable *and* old.

- A writer loop (``append`` and ``append_episode`` with video) and WebDataset imports
  run while another thread runs ``project.gc()`` (its default grace) every ~0.3 s, on
  local disk and S3: afterwards every commit of the branch reads back with the exact
  row counts and every frame of every episode.
- A crashed writer's media object, aged past the grace, then reused by a new write
  (put-if-absent finds it), survives a gc that runs before that write commits.
- gc on a damaged table (a reachable version's data file or manifest missing or
  corrupt) raises a named error and deletes nothing.
- A writer whose staged files were deleted under it (a gc that took it for dead, its
  lease past the TTL) fails with a named error, and the branch does not move.
- At a zero grace: gc between a writer's staging and its commit keeps what it staged;
  a stream reused just before gc deletes it is stored again under the writer's own key;
  a held lease is renewed in the background.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import treadle as td
import treadle.video as tv
from importer_fixtures import make_wds
from treadle.catalog.gc import collect_garbage
from treadle.catalog.leases import LEASE_TTL
from treadle.errors import CorruptData, StorageError
from treadle.importers import webdataset as import_wds
from treadle.plan.windows import Video
from treadle.video._testing import synthetic_frames

T_ROWS, V_FRAMES, W_ROWS = 7, 6, 12


def _frames(i: int) -> np.ndarray:
    return synthetic_frames(V_FRAMES, 32, 32, seed=i)


def _all_keys(project: td.Project) -> dict[str, int]:
    store = project.client.store
    return {k: store.size(k) for k in store.list(project.prefix)}


def _decode(project: td.Project, table: td.Table) -> dict[str, np.ndarray]:
    """Episode name -> all its frames of column ``cam``, through the table's own index."""
    arrow = table.to_arrow(["episode", "cam"])
    out: dict[str, np.ndarray] = {}
    with tv.VideoReader(project.client.store, prefix=project.prefix) as reader:
        for ep in pc.unique(arrow.column("episode")).to_pylist():
            rows = arrow.filter(pc.equal(arrow.column("episode"), ep)).column("cam")
            key, idx = tv.index_from_arrow(rows)
            n = len(idx)
            [frames] = reader.read([tv.WindowRequest(key, idx, range(n), Video(range(n)))])
            out[ep] = np.asarray(frames)
    return out


def _check_commit(project: td.Project, commit, older: list) -> None:
    """``commit`` (whose ancestors are ``older``) reads back with exact rows and frames."""
    msgs = [c.message for c in [commit, *older]]
    n_t = sum(m.startswith("t") for m in msgs)
    eps = sorted(m for m in msgs if m.startswith("v"))
    n_w = sum("import-id=" in m for m in msgs)
    where = f"commit {commit.short_id} ({commit.message})"
    if n_t:
        t = project.table_at("t", commit.tables["t"])
        assert t.to_arrow().num_rows == T_ROWS * n_t, where
    if eps:
        v = project.table_at("v", commit.tables["v"])
        assert v.num_moments == V_FRAMES * len(eps), where
        got = _decode(project, v)
        assert sorted(got) == eps, where
        for ep, frames in got.items():
            ref = _frames(int(ep[1:])).astype(np.int16)
            assert frames.shape == ref.shape, (where, ep)
            assert np.abs(frames.astype(np.int16) - ref).mean() < 12, (where, ep)
    if n_w:
        w = project.table_at("w", commit.tables["w"])
        assert w.to_arrow().num_rows == W_ROWS * n_w, where


def _gc_loop(root: str, opts, stop: threading.Event, errors: list, runs: list) -> None:
    project = td.Client(root, storage_options=opts).project("p")
    while not stop.is_set():
        try:
            project.gc()  # the default grace: no forcing
            runs.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            return
        stop.wait(0.2)


@pytest.mark.slow
def test_gc_loop_during_writers_and_imports_loses_nothing(any_root, tmp_path):
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(T_ROWS)}, message="t-1")
    shards = [make_wds(tmp_path / f"wds{k}", n=W_ROWS, per_shard=W_ROWS, seed=k) for k in range(3)]
    stop, errors, runs = threading.Event(), [], []
    gc = threading.Thread(target=_gc_loop, args=(root, opts, stop, errors, runs))
    failures: list[BaseException] = []
    written: list[int] = []

    def writer() -> None:  # at least 12 commits, and on until gc ran 10 times
        try:
            for i in range(80):
                if i >= 12 and len(runs) >= 10:
                    break
                if i % 2:
                    main.table("v").append_episode(
                        {"cam": td.VideoFrames(_frames(i), fps=10), "a": np.ones((V_FRAMES, 2))},
                        episode=f"v{i}",
                        message=f"v{i}",
                    )
                else:
                    main.table("t").append({"x": np.full(T_ROWS, i)}, message=f"t{i}")
                written.append(i)
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    def importer() -> None:
        try:
            for pattern in shards:
                import_wds(pattern, td.Client(root, storage_options=opts).project("p"), "w",
                           progress=False)  # fmt: skip
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=importer)]
    gc.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    gc.join()
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    unreadable = []
    for k, commit in enumerate(log[:-1]):
        try:
            _check_commit(project, commit, log[k + 1 :])
        except Exception as e:  # noqa: BLE001 - counted, then asserted
            unreadable.append(f"{commit.short_id} {commit.message}: {type(e).__name__}: {e}")
    bad = f"{len(unreadable)} of {len(log) - 1} commits unreadable: {unreadable[:3]}"
    assert not unreadable and not failures, (bad, failures)
    assert not errors, errors
    assert len(runs) >= 10 or len(written) == 80  # gc ran again and again during the writes
    assert len(log) == 1 + 1 + len(written) + 3  # the first commit, t-1, the loop, the imports
    project.gc()  # and a last gc with nothing running keeps all of it
    _check_commit(project, log[0], log[1:])


def _modified(project: td.Project, key: str) -> float:
    return project.client.store.modified(key).timestamp()


def test_reused_orphan_media_survives_gc(any_root):
    """A crashed writer left media; its mtime is past the grace; a new write reuses it
    (put-if-absent finds it) and gc runs before that write commits: the media stays."""
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    frames = _frames(3)
    with pytest.raises(RuntimeError), main.transaction("crashes") as tx:
        tx.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="v3")
        raise RuntimeError("the writer dies before its commit")
    [key] = project.client.store.list(f"{project.prefix}/media")
    grace = timedelta(hours=1)
    now = None  # gc's clock: the real one, unless S3 (below)
    if project.client.store.is_local:  # age it: two hours old
        old = time.time() - 7200
        os.utime(Path(root, key), (old, old))
    else:  # S3 cannot back-date an object; give gc a clock one grace past a cut after it
        time.sleep(2.5)  # S3 mtimes have one-second resolution
        now = datetime.fromtimestamp(_modified(project, key) + 1.5, UTC) + grace
    with main.transaction("v3") as tx:
        tx.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="v3")
        gc_project = td.Client(root, storage_options=opts).project("p")
        report = collect_garbage(gc_project, grace, **({"now": now} if now else {}))
        assert key not in report.removed_media
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    _check_commit(project, log[0], log[1:])
    project.gc()
    _check_commit(project, log[0], log[1:])


def test_stream_reused_while_gc_deletes_it_is_not_lost(any_root):
    """A writer reuses an orphan stream (put-if-absent finds it) after gc decided to delete
    it and just before the delete: the writer sees gc's sweep and stores its own copy,
    and its commit reads back whole at a zero grace."""
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(T_ROWS)}, message="t0")
    frames = _frames(4)
    with pytest.raises(RuntimeError), main.transaction("crashes") as tx:
        tx.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)}, episode="v4")
        raise RuntimeError("the writer dies before its commit")
    [orphan] = project.client.store.list(f"{project.prefix}/media")
    time.sleep(1.1)  # S3 mtimes have one-second resolution: the orphan is older than gc's now
    gc_project = td.Client(root, storage_options=opts).project("p")
    store, real = gc_project.client.store, gc_project.client.store.delete

    def delete(key: str) -> None:
        if key == orphan:  # the worst moment: gc is about to delete it
            main.table("v").append_episode({"cam": td.VideoFrames(frames, fps=10)},
                                           episode="v4", message="v4")  # fmt: skip
        real(key)

    store.delete = delete
    report = collect_garbage(gc_project, timedelta(0))
    assert orphan in report.removed_media  # gc did delete the stream it listed
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    assert log[0].message == "v4"
    _check_commit(project, log[0], log[1:])


@pytest.mark.parametrize("what", ["append", "episode", "import"])
def test_gc_between_stage_and_commit_keeps_staged_files(any_root, tmp_path, monkeypatch, what):
    """gc at a zero grace runs at the worst moment: after a writer staged its data files
    and media, before its Lance commit. Nothing it staged may go (its lease is honoured
    whatever the grace)."""
    import treadle.catalog.transaction as write

    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(T_ROWS)}, message="t0")
    cols = {"cam": td.VideoFrames(_frames(0), fps=10), "a": np.ones((V_FRAMES, 2))}
    main.table("v").append_episode(cols, episode="v0", message="v0")
    import_wds(make_wds(tmp_path / "wds0", n=W_ROWS, per_shard=5, seed=0), project, "w",
               progress=False)  # fmt: skip
    real = write._lance_commit
    ran: list[int] = []

    def overwrite(*a, **k):
        ran.append(1)
        td.Client(root, storage_options=opts).project("p").gc(older_than=timedelta(0))
        return real(*a, **k)

    monkeypatch.setattr(write, "_lance_commit", overwrite)
    if what == "append":
        main.table("t").append({"x": np.full(T_ROWS, 1)}, message="t1")
    elif what == "episode":
        cols = {"cam": td.VideoFrames(_frames(1), fps=10), "a": np.ones((V_FRAMES, 2))}
        main.table("v").append_episode(cols, episode="v1", message="v1")
    else:
        import_wds(make_wds(tmp_path / "wds1", n=W_ROWS, per_shard=5, seed=1), project, "w",
                   progress=False)  # fmt: skip
    monkeypatch.undo()
    assert ran
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    for k, commit in enumerate(log[:-1]):
        _check_commit(project, commit, log[k + 1 :])


def _damage(project: td.Project, root: str, what: str) -> str:
    """Damage the reachable version of table ``t`` commit "t1" names (not the newest);
    returns the file it damaged."""
    store = project.client.store
    base = f"{project.prefix}/tables/t.lance"
    v = {c.message: c.tables.get("t") for c in project.branch().log()}
    if what.startswith("manifest"):
        key = f"{base}/_versions/{2**64 - 1 - v['t1']}.manifest"
    else:
        ds = project.open_dataset("t", v["t1"])
        names = {df.path for f in ds.get_fragments() for df in f.data_files()}
        ds1 = project.open_dataset("t", v["t0"])
        names -= {df.path for f in ds1.get_fragments() for df in f.data_files()}
        key = f"{base}/data/{names.pop()}"
    assert store.exists(key), key
    if what.endswith("missing"):
        store.delete(key)
    else:
        store.put(key, b"junk" if what.endswith("short") else b"\x00garbage" * 8)
    return key.rsplit("/", 1)[-1]


@pytest.mark.parametrize(
    "what",
    ["data-missing", "data-corrupt", "manifest-missing", "manifest-corrupt", "manifest-short"],
)
def test_gc_on_damaged_table_deletes_nothing(any_root, what):
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    t = main.table("t")
    for i in range(3):
        t.append({"x": np.full(T_ROWS, i)}, message=f"t{i}")  # versions 1, 2, 3
    main.table("v").append_episode({"cam": td.VideoFrames(_frames(1), fps=10)}, episode="v1")
    # garbage gc would remove: an abandoned transaction's data file and media
    with pytest.raises(RuntimeError), main.transaction("crash") as tx:
        tx.table("t").append({"x": np.arange(100)})
        tx._flush("t", tx._tables["t"])
        tx.table("v").append_episode({"cam": td.VideoFrames(_frames(2), fps=10)}, episode="v2")
        raise RuntimeError
    name = _damage(project, root, what)
    project = td.Client(root, storage_options=opts).project("p")
    before = _all_keys(project)
    with pytest.raises(CorruptData) as e:
        project.gc(older_than=timedelta(0))
    assert "'t'" in str(e.value) and name in str(e.value), str(e.value)
    assert _all_keys(project) == before  # not one object deleted


@pytest.mark.parametrize("what", ["data", "media"])
def test_writer_whose_files_vanish_fails_named_and_branch_stays(any_root, what):
    """A gc that takes a running transaction for dead (its clock past the lease's TTL, as
    when the writer stalled longer than that) deletes its staged files: its commit raises
    a named error, the branch does not move, and a later writer proceeds."""
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(T_ROWS)}, message="t0")
    main.table("v").append_episode({"cam": td.VideoFrames(_frames(0), fps=10)}, episode="v0",
                                   message="v0")  # fmt: skip
    head = main.commit_id
    with pytest.raises(StorageError) as e, main.transaction("t1") as tx:
        if what == "data":
            tx.table("t").append({"x": np.full(T_ROWS, 1)})
            tx._flush("t", tx._tables["t"])
        else:
            tx.table("v").append_episode({"cam": td.VideoFrames(_frames(1), fps=10)},
                                         episode="v1")  # fmt: skip
        later = datetime.now(UTC) + LEASE_TTL + timedelta(minutes=1)
        collect_garbage(td.Client(root, storage_options=opts).project("p"), timedelta(0), now=later)
    assert ("'t'" if what == "data" else "'v'") in str(e.value), str(e.value)
    assert "nothing was committed" in str(e.value)
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    assert main.commit_id == head
    main.table("t").append({"x": np.full(T_ROWS, 2)}, message="t2")
    log = main.log()
    for k, commit in enumerate(log[:-1]):
        _check_commit(project, commit, log[k + 1 :])


def test_transaction_longer_than_the_grace_keeps_what_it_staged(any_root, monkeypatch):
    """A running transaction whose first staged files are older than the grace (it is
    still beating its lease) keeps them all: gc's cutoff moves back to its start."""
    from treadle.catalog import leases

    monkeypatch.setattr(leases, "_BEAT_S", 0.0)  # beat on every staged write
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(T_ROWS)}, message="t0")
    grace = timedelta(hours=1)
    with main.transaction("t1 v1") as tx:
        tx.table("t").append({"x": np.full(T_ROWS, 1)})
        tx._flush("t", tx._tables["t"])
        cols = {"cam": td.VideoFrames(_frames(1), fps=10), "a": np.ones((V_FRAMES, 2))}
        tx.table("v").append_episode(cols, episode="v1")
        [start] = [k for k in project.client.store.list(project.prefix) if k.endswith("/start")]
        time.sleep(2.5)  # S3 mtimes have one-second resolution
        tx.table("t").append({"x": np.full(T_ROWS, 1)})  # still writing: the lease is alive
        tx._flush("t", tx._tables["t"])
        # gc's clock: the first staged files are past the grace, the last beat is not
        now = datetime.fromtimestamp(_modified(project, start) + 1.5, UTC) + grace
        gc_project = td.Client(root, storage_options=opts).project("p")
        report = collect_garbage(gc_project, grace, now=now)
        assert report.removed_files == 0 and not report.removed_media, report
    project = td.Client(root, storage_options=opts).project("p")
    log = project.branch().log()
    assert project.table_at("t", log[0].tables["t"]).num_moments == 3 * T_ROWS
    assert project.table_at("v", log[0].tables["v"]).num_moments == V_FRAMES
    _decode(project, project.table_at("v", log[0].tables["v"]))
    project.gc()  # nothing left behind: the lease went with the commit
    assert not project.client.store.list(f"{project.prefix}/gc/writers")


def test_gc_removes_a_dead_writers_lease_and_markers(local_root):
    """A writer killed mid-transaction leaves its lease (and a reuse marker): kept while
    younger than the grace or the lease TTL, removed after both."""
    from treadle.catalog.leases import Lease, mark_used

    project = td.Client(local_root).project("p")
    project.branch().table("t").append({"x": np.arange(3)})
    store, prefix = project.client.store, project.prefix
    Lease(store, prefix).beat()  # never released: the process died
    mark_used(store, prefix, f"{prefix}/media/t/{'0' * 64}.h264")
    markers = store.list(f"{prefix}/gc")
    assert len(markers) == 2
    project.gc()
    assert store.list(f"{prefix}/gc") == markers
    project.gc(older_than=timedelta(0))  # a lease is live for its TTL whatever the grace
    assert store.list(f"{prefix}/gc") == markers
    collect_garbage(project, timedelta(0), now=datetime.now(UTC) + LEASE_TTL + timedelta(1))
    assert store.list(f"{prefix}/gc") == []


def test_a_held_lease_is_beaten_in_the_background(local_root, monkeypatch):
    """A transaction that stages nothing for a while (encoding, user code) still renews its
    lease, so gc at any grace keeps taking it for alive; released, its markers go."""
    from treadle.catalog import leases

    monkeypatch.setattr(leases, "_BEAT_S", 0.5)
    project = td.Client(local_root).project("p")
    project.branch().table("t").append({"x": np.arange(3)})
    store, prefix = project.client.store, project.prefix
    lease = leases.Lease(store, prefix)
    lease.beat()
    start = store.modified(f"{lease.base}/start")
    deadline = time.monotonic() + 30
    while not store.exists(f"{lease.base}/beat") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.modified(f"{lease.base}/beat") > start
    lease.release()
    assert store.list(f"{prefix}/gc/writers") == []


def test_gc_removes_the_stored_episode_indexes_of_compacted_fragments(tmp_path):
    """Compaction replaces small fragments; their stored episode indexes went on lying in
    the store (one object a commit, never removed). gc removes them once no kept version
    lists their data file (here: retention expires every commit but the head), and the
    table still reads its episodes from the objects it kept."""
    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for i in range(40):
        branch.table("t").append_episode({"x": np.arange(5)}, episode=f"e{i}")
    store = branch.project.client.store
    before = store.list("projects/p/episodes/t")
    fragments = branch.table("t").pin().dataset.get_fragments()
    assert len(before) == 40 and len(fragments) < 40  # compacted: most objects are stale
    later = datetime.now(UTC) + timedelta(days=2)
    kept = collect_garbage(branch.project, now=later)  # every commit stays readable
    assert kept.removed_episode_indexes == 0
    assert store.list("projects/p/episodes/t") == before
    report = collect_garbage(branch.project, keep_days=1, now=later)
    after = store.list("projects/p/episodes/t")
    assert report.removed_episode_indexes == len(before) - len(after) > 0
    assert len(after) == len(fragments)
    eps = branch.table("t").pin().episodes()
    assert list(eps.lengths) == [5] * 40
    assert store.list("projects/p/episodes/t") == after  # read from the kept objects


def test_gc_and_retention_need_only_the_projects_history(tmp_path):
    """gc and retention see a project as its History (place, refs, commits, Lance handle):
    run on exactly that, with no client to reach, they expire and remove as on the Project."""
    from types import SimpleNamespace

    from treadle.catalog.retention import tags

    branch = td.Client(str(tmp_path), create=True).project("p").branch()
    for i in range(3):
        branch.table("t").append({"x": np.arange(4) + i}, message=f"c{i}")
    project = branch.project
    project.tag("first", branch.log()[-2].id)  # the first append: kept whatever the retention
    history = SimpleNamespace(place=project.place, refs=project.refs, lance=project.lance,
                              branches=project.branches, load_commit=project.load_commit)  # fmt: skip
    assert tags(project.place) == project.tags()
    report = collect_garbage(history, timedelta(0), keep_days=0,
                             now=datetime.now(UTC) + timedelta(days=1))  # fmt: skip
    assert report.expired_commits == [branch.log()[1].id]  # c1: neither head nor tagged
    log = branch.log()
    assert report.kept_versions["t"] == sorted({log[0].tables["t"], log[2].tables["t"]})
    fresh = td.Client(str(tmp_path)).project("p").branch()  # no version opened before gc
    with pytest.raises(td.ExpiredCommit, match="expired by retention"):
        fresh.table("t").at(log[1].id).to_arrow()


def test_a_table_folder_a_killed_writer_left_without_a_file_is_removed(tmp_path):
    """A writer killed after Lance made a new table's folders, before its first file, left
    ``tables/<name>.lance/...`` with no file in it: gc lists files only, so it never saw
    the folder (CI's killed-writer test found one). Old empty folders of tables no commit
    names go; a table a commit names keeps its folders."""
    root = tmp_path / "store"
    project = td.Client(str(root), create=True).project("p")
    project.branch().table("kept").append({"x": np.arange(3)})
    tables = root / "projects" / "p" / "tables"
    ghost = tables / "ghost.lance"
    for sub in ("_versions", "data", "_transactions"):
        (ghost / sub).mkdir(parents=True)
    old = time.time() - 3600
    for d in (ghost, *ghost.iterdir()):
        os.utime(d, (old, old))
    collect_garbage(project, timedelta(0), now=datetime.now(UTC) + LEASE_TTL + timedelta(minutes=1))
    assert not ghost.exists()
    assert (tables / "kept.lance").is_dir()
    assert project.branch().table("kept").to_arrow(["x"]).column(0).to_pylist() == [0, 1, 2]


def test_a_version_gc_removed_is_named_with_the_versions_there_are(tmp_path):
    """``table.at(version)`` of a version no commit names, after gc, said only that Lance's
    manifest file was not found; it says why, and which versions the branch's commits name."""
    project = td.Client(str(tmp_path), create=True).project("p")
    table = project.branch().table("t")
    for x in range(3):
        table.append({"x": [x]})
    named = [c.tables["t"] for c in project.branch().log() if "t" in c.tables]
    gone = next(v for v in range(1, max(named)) if v not in named)
    project.gc(older_than=timedelta(0))
    with pytest.raises(td.NotFound, match=rf"has no version {gone}: gc removes") as e:
        project.branch().table("t").at(gone)
    assert f"newest first: {named}" in str(e.value)
    assert project.branch().table("t").at(named[0]).num_moments == 3

"""Catalog semantics: commits, branches, logs, pins — on local disk and on S3."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import treadle as td
from treadle.table.tensors import to_numpy


def _episode(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "action": rng.random((n, 7), dtype=np.float32),
        "image": rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8),
        "task": "pick",
    }


def test_commit_branch_log_pin(any_root):
    root, opts = any_root
    client = td.Client(root, storage_options=opts)
    project = client.project("robotics")
    main = project.branch("main")
    with pytest.raises(td.NotFound, match="project 'robotics' not found"):
        main.head()  # the first write creates the project, not project()

    t = main.table("grasps")
    c1 = t.append_episode(_episode(10, 1), episode="e0")
    c2 = t.append_episode(_episode(5, 2), episode="e1")
    first = main.log()[-1].id
    assert len(first) == 64 and main.log()[-1].tables == {}
    assert main.commit_id == c2.id
    assert [c.id for c in main.log()] == [c2.id, c1.id, first]
    assert c2.parents == (c1.id,) and c1.parents == (first,)
    assert c2.short_id == c2.id[:8]

    pinned = t.pin()
    assert pinned.num_moments == 15 and pinned.num_episodes == 2
    idx = pinned.episodes()
    assert idx.names == ["e0", "e1"]
    assert idx.starts.tolist() == [0, 10] and idx.lengths.tolist() == [10, 5]

    # exact round trip of tensor columns
    ep = _episode(5, 2)
    got = pinned.take([10, 11, 12, 13, 14], ["image", "action", "frame", "task"])
    assert np.array_equal(to_numpy(got.column("image"), got.schema.field("image")), ep["image"])
    assert np.array_equal(to_numpy(got.column("action"), got.schema.field("action")), ep["action"])
    assert got.column("frame").to_pylist() == [0, 1, 2, 3, 4]
    assert got.column("task").to_pylist() == ["pick"] * 5

    # a pinned table keeps reading its version after later commits
    t.append_episode(_episode(7, 3), episode="e2")
    assert pinned.num_moments == 15 and pinned.to_arrow(["frame"]).num_rows == 15
    assert t.pin().num_moments == 22
    assert t.at(c1.id[:8]).num_moments == 10
    assert t.at(c2.id).version == pinned.version

    # commit objects are content-addressed
    raw = client.store.get(f"projects/robotics/commits/{c2.id}.json")
    assert td.Commit.from_bytes(raw).id == c2.id
    assert json.loads(raw)["tables"]["grasps"]["version"] == pinned.version


def test_branch_diverges_independently(any_root):
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    main = project.branch()
    main.table("t").append({"x": np.arange(3), "s": ["a", "b", "c"]})
    exp = project.create_branch("exp", from_="main")
    assert sorted(project.branches()) == ["exp", "main"]
    assert exp.table("t").num_moments == 3

    exp.table("t").append({"x": np.arange(3, 5), "s": ["d", "e"]})
    main.table("t").append({"x": np.arange(10, 11), "s": ["z"]})
    assert exp.table("t").to_arrow(["x"]).column("x").to_pylist() == [0, 1, 2, 3, 4]
    assert main.table("t").to_arrow(["x"]).column("x").to_pylist() == [0, 1, 2, 10]
    exp.table("only_exp").append({"y": [1.0]})
    assert exp.tables() == ["only_exp", "t"] and main.tables() == ["t"]
    with pytest.raises(td.AlreadyExists):
        project.create_branch("exp")
    # a branch from a commit id
    old = project.create_branch("old", from_=main.log()[1].id[:10])
    assert old.table("t").num_moments == 3


def test_transaction_is_one_commit_across_tables(local_root):
    main = td.Client(local_root).project("p").branch()
    with main.transaction("two tables") as tx:
        tx.table("a").append({"x": [1, 2]})
        tx.table("b").append_episode({"v": np.zeros((4, 2), np.float32)}, episode="ep")
        tx.table("a").append({"x": [3]})
    assert len(main.log()) == 2  # the project's empty root commit, then this one
    assert tx.commit is not None and tx.commit.message == "two tables"
    assert set(tx.commit.tables) == {"a", "b"}
    assert main.table("a").to_arrow().column("x").to_pylist() == [1, 2, 3]
    assert main.table("b").pin().episodes().lengths.tolist() == [4]


def test_failed_write_leaves_branch_unchanged(any_root):
    root, opts = any_root
    main = td.Client(root, storage_options=opts).project("p").branch()
    main.table("t").append({"x": np.arange(3, dtype=np.int64), "v": np.zeros((3, 2), np.float32)})
    head = main.commit_id
    with pytest.raises(RuntimeError):
        with main.transaction("boom") as tx:
            tx.table("t").append({"x": [9], "v": np.zeros((1, 2), np.float32)})
            raise RuntimeError("user code failed")
    assert main.commit_id == head
    for bad, match in [
        ({"x": [1]}, "missing columns"),
        ({"x": [1], "v": np.zeros((1, 2), np.float32), "w": [1]}, "unknown columns"),
        ({"x": [1], "v": np.zeros((1, 3), np.float32)}, "shape"),
        ({"x": [1], "v": np.zeros((1, 2), np.float64)}, "type"),
        ({"x": ["a"], "v": np.zeros((1, 2), np.float32)}, "type"),
    ]:
        with pytest.raises(td.SchemaMismatch, match=match):
            main.table("t").append(bad)
        assert main.commit_id == head
    assert main.table("t").num_moments == 3


@pytest.mark.parametrize(
    "dtype, later, stored_before",
    [
        (np.float32, np.array([0.1]), 0.10000000149011612),
        (np.int64, pa.array(["007"]), 7),
        (None, np.array([7]), "7"),  # a string column
        (np.int64, np.array([True]), 1),
    ],
)
def test_an_append_that_would_change_its_values_is_refused(local_root, dtype, later, stored_before):
    t = td.Client(local_root).project("p").branch().table("t")
    t.append({"x": pa.array(["a"]) if dtype is None else np.array([1], dtype)})
    with pytest.raises(td.SchemaMismatch, match=r"table 't'.*column 'x'.*change its values"):
        t.append({"x": later})  # was stored as stored_before
    assert t.num_moments == 1


def test_an_append_that_keeps_its_values_is_cast(local_root):
    t = td.Client(local_root).project("p").branch().table("t")
    t.append({"x": np.array([1.5], np.float32), "n": np.array([1], np.int32)})
    t.append({"x": [0.25, float("nan")], "n": [2**20, 3]})  # float64, int64 values that fit
    got = t.to_arrow().to_pydict()
    assert got["x"][:2] == [1.5, 0.25] and np.isnan(got["x"][2]) and got["n"] == [1, 2**20, 3]


def test_episode_bad_input(local_root):
    t = td.Client(local_root).project("p").branch().table("eps")
    with pytest.raises(td.SchemaMismatch, match="different numbers of frames"):
        t.append_episode({"a": np.zeros((4, 2)), "b": np.zeros((5,))})
    with pytest.raises(td.SchemaMismatch, match="set by treadle"):
        t.append_episode({"frame": np.zeros(3)})
    with pytest.raises(td.SchemaMismatch, match="non-empty dict"):
        t.append_episode({})
    with pytest.raises(td.SchemaMismatch, match="no frames"):
        t.append_episode({"a": np.zeros((0, 2))})
    with pytest.raises(td.SchemaMismatch, match="frame"):
        t.append({"episode": ["e", "e"], "frame": np.array([0, 2], np.int32)})
    with pytest.raises(td.InvalidName, match="'.' is not allowed"):
        t.append_episode({"observation.state": np.zeros((3, 2))})
    with pytest.raises(td.InvalidName, match="'.' is not allowed"):
        t.append(pa.table({"a.b": [1]}))


@pytest.mark.parametrize(
    "name", ["", "a/b", "..", "../x", "a\x00b", "with space", "-lead", "x" * 200, "a..b", 3, None]
)
def test_bad_names_are_rejected(local_root, name):
    client = td.Client(local_root)
    with pytest.raises(td.InvalidName):
        client.project(name)
    project = client.project("ok")
    with pytest.raises(td.InvalidName):
        project.branch(name)
    with pytest.raises(td.InvalidName):
        project.create_branch(name)
    with pytest.raises(td.InvalidName):
        project.branch().table(name)
    assert client.projects() == []  # nothing was written


def test_unknown_things_are_named(local_root):
    client = td.Client(local_root)
    with pytest.raises(td.NotFound, match="project 'nope'"):
        client.project("nope", create=False)
    project = client.project("p")
    project.branch().table("t").append({"x": [1]})
    with pytest.raises(td.NotFound, match="branch 'dev'"):
        project.branch("dev")
    with pytest.raises(td.NotFound, match="table 'ghost'"):
        project.branch().table("ghost").pin()
    with pytest.raises(td.NotFound, match="commit"):
        project.commit("deadbeef")
    with pytest.raises(td.NotFound):
        project.commit("xyz!")
    with pytest.raises(td.NotFound, match="column"):
        project.branch().table("t").to_arrow(["nope"])
    with pytest.raises(td.NotFound, match="version 99"):
        project.table_at("t", 99)
    assert client.projects() == ["p"]


def test_roots(tmp_path, monkeypatch):
    with pytest.raises(td.StorageError, match="does not exist"):
        td.Client(str(tmp_path / "missing"))
    assert td.Client(str(tmp_path / "made"), create=True).projects() == []
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(td.StorageError, match="not a directory"):
        td.Client(str(f))
    monkeypatch.setattr("os.access", lambda *a, **k: False)
    with pytest.raises(td.StorageError, match="not writable"):
        td.Client(str(tmp_path))
    monkeypatch.undo()
    monkeypatch.setenv("TREADLE_ROOT", str(tmp_path / "default"))
    assert td.Client().root == str(tmp_path / "default")
    assert td.Client(f"file://{tmp_path}").root == str(tmp_path)
    with pytest.raises(td.StorageError, match="unsupported root"):
        td.Client("ftp://host/x")
    # before: 's3:/bucket/x' (one slash) said "no credentials" (with credentials: "Generic URL
    # error: Unable to recognise URL"), never that the URL has no bucket
    for typo in ("s3:/bucket/x", "s3:bucket", "gs:///x", "az:/container"):
        with pytest.raises(td.StorageError, match=r"names no bucket.*://BUCKET/PREFIX") as err:
            td.Client(
                typo, storage_options={"aws_access_key_id": "a", "aws_secret_access_key": "b"}
            )
        assert type(err.value) is td.StorageError, typo
        with pytest.raises(td.StorageError, match="names no bucket"):
            td.Client(typo)


def test_s3_credentials(s3_server, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    opts = s3_server.storage_options()
    no_creds = {k: v for k, v in opts.items() if "key" not in k}
    with pytest.raises(td.CredentialsError, match="no credentials"):
        td.Client(s3_server.url("creds"), storage_options=no_creds)
    wrong = dict(opts, aws_secret_access_key="not-the-secret-9f8e7d")
    client = td.Client(s3_server.url("creds"), storage_options=wrong)
    with pytest.raises(td.CredentialsError) as err:
        client.project("p")
    assert "not-the-secret-9f8e7d" not in str(err.value)
    assert "not-the-secret-9f8e7d" not in repr(client)
    assert s3_server.secret_key not in repr(td.Client(s3_server.url("c"), storage_options=opts))


def test_gc_keeps_reachable_and_removes_the_rest(local_root):
    project = td.Client(local_root).project("p")
    main = project.branch()
    t = main.table("t")
    t.append({"x": np.arange(100)})
    t.append({"x": np.arange(100, 200)})
    # an abandoned write: a transaction that failed after staging rows
    with pytest.raises(RuntimeError), main.transaction("crash") as tx:
        tx.table("t").append({"x": np.arange(1000, 1100)})
        tx._flush("t", tx._tables["t"])  # data files written, never committed
        raise RuntimeError
    # an unreachable version (committed to Lance, never to a branch)
    from treadle.table.lancecommit import overwrite

    ds = project.open_dataset("t", t.pin().version)
    orphan_v = overwrite(project.table_uri("t"), ds.schema, [], None)
    t.append({"x": np.arange(200, 300)})
    data = Path(local_root) / "projects/p/tables/t.lance/data"
    staged = {df.path for f in tx._tables["t"].fragments for df in f.files}
    assert staged <= {p.name for p in data.iterdir()}
    report = project.gc(older_than=timedelta(0))
    kept = report.kept_versions["t"]
    assert orphan_v not in kept and len(kept) == 3
    assert report.removed_versions >= 1 and report.removed_bytes > 0
    left = {p.name for p in data.iterdir()}
    assert not staged & left  # the abandoned write's data file went
    listed = {df.path for v in kept for f in project.table_at("t", v).dataset.get_fragments()
              for df in f.data_files()}  # fmt: skip
    assert listed <= left
    for v in kept:  # every reachable version still reads, with the same rows
        assert project.table_at("t", v).num_moments in (100, 200, 300)
    with pytest.raises(td.NotFound):
        project.table_at("t", orphan_v)
    assert t.to_arrow().column("x").to_pylist() == list(range(300))


def test_fragment_ids_grow_linearly_and_pinned_moments_stay(any_root):
    """Each commit keeps the ids of the fragments it lists (no renumbering): after k
    single-row commits the largest fragment id is O(k), not k(k+1)/2; a pinned
    version's moment ids keep naming the same rows."""
    root, opts = any_root
    project = td.Client(root, storage_options=opts).project("p")
    t = project.branch().table("t")
    pins = []
    for i in range(30):
        t.append({"x": [i]})
        pins.append(t.pin())
    ids = [f.fragment_id for f in pins[-1].dataset.get_fragments()]
    assert max(ids) < 2 * 30, ids
    for k, pinned in enumerate(pins):
        fresh = td.Client(root, storage_options=opts).project("p").table_at("t", pinned.version)
        assert fresh.take(list(range(k + 1)), ["x"]).column("x").to_pylist() == list(range(k + 1))
    # a branch written in turn with main keeps exactly its own rows
    exp = project.create_branch("exp")
    exp.table("t").append({"x": [100]})
    t.append({"x": [200]})
    exp.table("t").append({"x": [101]})
    assert exp.table("t").to_arrow(["x"]).column("x").to_pylist()[-2:] == [100, 101]
    assert t.to_arrow(["x"]).column("x").to_pylist()[-2:] == [29, 200]


def test_a_long_lived_writer_keeps_a_bounded_number_of_versions_open(local_root):
    """Every commit opens its base version; a writer must not keep them all (its memory
    grew with the history): at most ``_OPEN_VERSIONS`` stay open, and evicted ones
    reopen on demand."""
    from treadle.catalog.lance import _OPEN_VERSIONS

    project = td.Client(local_root).project("p")
    t = project.branch().table("t")
    first = t.append({"x": [0]})
    for i in range(1, _OPEN_VERSIONS + 8):
        t.append({"x": [i]})
        assert t.pin().episodes() is not None
    assert len(project.lance._datasets) <= _OPEN_VERSIONS
    assert len(project.lance._episodes) <= _OPEN_VERSIONS
    assert t.at(first.id).to_arrow().column("x").to_pylist() == [0]


def test_small_fragments_are_compacted_and_pinned_versions_keep_their_moments(any_root):
    """Single-row commits do not pile up fragments: the tail merges LSM-style (a new
    version; the pinned ones are untouched and keep their moment ids and rows)."""
    root, opts = any_root
    t = td.Client(root, storage_options=opts).project("p").branch().table("t")
    pins = []
    for i in range(64):
        t.append({"x": [i], "s": [f"row-{i}"]})
        pins.append((t.pin(), [f.fragment_id for f in t.pin().dataset.get_fragments()]))
    assert len(pins[-1][1]) <= 7  # log2(64) + 1
    fresh = td.Client(root, storage_options=opts).project("p")
    for k, (pinned, frag_ids) in enumerate(pins):
        again = fresh.table_at("t", pinned.version)
        assert [f.fragment_id for f in again.dataset.get_fragments()] == frag_ids
        got = again.take(list(range(k + 1)), ["x", "s"]).to_pydict()
        assert got == {"x": list(range(k + 1)), "s": [f"row-{i}" for i in range(k + 1)]}


def test_compaction_rewrites_each_row_a_logarithmic_number_of_times():
    from treadle.table.lancecommit import merge_run

    rows: list[int] = []
    runs: list[list[int]] = []  # row ids per fragment
    rewrites = [0] * 2000
    for i in range(2000):
        rows.append(1)
        runs.append([i])
        j = merge_run(rows, [1] * len(rows))
        if j < len(rows):
            merged = [r for run in runs[j:] for r in run]
            for r in merged:
                rewrites[r] += 1
            rows[j:], runs[j:] = [len(merged)], [merged]
        assert len(rows) <= 12  # log2(2000) + 1
    assert max(rewrites) <= 11


def test_a_long_lived_writer_keeps_a_bounded_number_of_commits(tmp_path, monkeypatch):
    """Every commit a project saved or loaded stayed in a dict for the process's life: a
    writer making a commit a write grew without bound (fails before: all 13 kept). The
    history still reads back whole."""
    import treadle.catalog.client as client

    monkeypatch.setattr(client, "_COMMITS_KEPT", 4, raising=False)
    project = td.Client(str(tmp_path)).project("p")
    t = project.branch().table("t")
    for i in range(12):
        t.append({"x": [i]})
    assert len(project._commits) <= 4
    log = project.branch().log()
    assert len(log) == 13 and len(project._commits) <= 4
    assert [c.tables.get("t") for c in log][:-1] == sorted(
        {c.tables["t"] for c in log[:-1]}, reverse=True
    )
    assert t.to_arrow(["x"]).column(0).to_pylist() == list(range(12))


def test_finding_a_moved_branch_head_lists_no_refs(tmp_path, monkeypatch):
    """A lookup after the branch moved more than four commits LISTed every ref it ever had:
    O(history) a commit for a writer beside busy others (fails before). From the head it
    knows, a process finds the new one by reads, and the right one; a first lookup LISTs
    (one request a thousand refs)."""
    from treadle.storage import Store

    root = str(tmp_path)
    mine = td.Client(root).project("p")
    t = mine.branch().table("t")
    t.append({"x": [0]})
    other = td.Client(root).project("p").branch().table("t")
    for i in range(1, 22):
        other.append({"x": [i]})
    listed: list[str] = []
    real = Store.list
    monkeypatch.setattr(Store, "list", lambda s, prefix: listed.append(prefix) or real(s, prefix))
    want = other.branch.commit_id
    assert mine.branch().commit_id == want
    t.append({"x": [22]})
    assert not [k for k in listed if "/refs" in k], listed
    assert td.Client(root).project("p").branch().commit_id == t.branch.commit_id  # a first
    assert [k for k in listed if "/refs" in k]  # lookup: listed
    assert t.to_arrow(["x"]).column(0).to_pylist() == list(range(23))
    assert mine.refs.head("nope") is None


def test_names_that_differ_only_in_case_are_refused(tmp_path):
    """Tables 't' and 'T', or branches 'exp' and 'Exp', were two folders here and one on a
    store that folds case (macOS, Windows): one table's commits wrote into the other's Lance
    dataset and gc removed its versions (fails before: both were made)."""
    p = td.Client(str(tmp_path)).project("p")
    p.branch().table("t").append({"x": [1]})
    head = p.branch().commit_id
    with pytest.raises(td.AlreadyExists, match="table 't'.*'T' differs only in case"):
        p.branch().table("T").append({"x": [2]})
    assert p.branch().commit_id == head
    p.create_branch("exp")
    with pytest.raises(td.AlreadyExists, match="branch 'exp'.*'Exp' differs only in case"):
        p.create_branch("Exp")
    assert sorted(p.branches()) == ["exp", "main"]
    p.branch().table("t").append({"x": [3]})  # the same name again is the same table
    assert p.branch().table("t").num_moments == 2
    client = td.Client(str(tmp_path))
    with pytest.raises(td.AlreadyExists, match="project 'p'.*'P' differs only in case"):
        client.project("P").branch().table("t").append({"x": [4]})
    assert client.projects() == ["p"]


def test_an_imports_metadata_is_read_from_the_tables_own_history(tmp_path):
    """Branches share a table's Lance dataset: main's table read the metadata and episode
    sets another branch's import kept at a higher version number (fails before: main said
    {'env': 'exp'} and lost its 'train' set)."""
    from treadle.table.source_meta import put_source_meta

    p = td.Client(str(tmp_path)).project("p")
    t = p.branch().table("t")
    t.append_episode({"x": np.arange(3.0)}, episode="a", fps=10)
    put_source_meta(t.pin(), {"env": "main"}, {"train": ["a"]}, "hdf5")
    exp = p.create_branch("exp", from_="main")
    exp.table("t").append_episode({"x": np.arange(3.0)}, episode="b")
    put_source_meta(exp.table("t").pin(), {"env": "exp"}, {"valid": ["b"]}, "hdf5")
    t.append_episode({"x": np.arange(3.0)}, episode="c")
    assert (t.metadata, t.episode_sets()) == ({"env": "main"}, {"train": ["a"]})
    assert exp.table("t").metadata == {"env": "exp"}
    p.merge("exp", into="main")  # the newest import on main's history now: exp's
    assert t.metadata == {"env": "exp"} and t.episode_sets() == {"valid": ["b"]}

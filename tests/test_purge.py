"""project.purge (issue 47, section 2): episodes removed from every version, for good.

A marker byte string only the purged rows held is found under the root before the purge
and nowhere after it (nor in this machine's object cache); a pinned run record, a tag and
``table.at(version)`` that reach a purged episode raise ``td.Purged`` naming the episode,
the purge's commit and its reason, when the plan is built or resumed; other episodes of
the old versions read as before; media shared with a kept episode stay; gc keeps what a
retained commit reaches through the purge map."""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from loader_helpers import batch_hash
from treadle import layout
from treadle.storage.filecache import default_dir, file_cache
from treadle.video.encode import encode_value

MARK = b"PURGE-ME-7f3a9c1e-\x00\xffbytes"
TEXT = "PURGE-ME-note-5d2b8a"
WINDOWS = td.Windows({"cam": td.Video(range(2)), "act": td.Rows(range(2))})


def frames(seed: int) -> td.VideoFrames:
    video = np.random.default_rng(seed).integers(0, 255, (6, 16, 16, 3), dtype=np.uint8)
    return td.VideoFrames(video, fps=10)


def fill(branch: td.Branch) -> None:
    """Episodes a..d: b and d hold the markers; d's camera stream is c's (same bytes)."""
    shared = encode_value(frames(2))
    t = branch.table("t")
    for i, ep in enumerate("abcd"):
        secret = ep in "bd"
        t.append_episode(
            {
                "cam": shared if ep in "cd" else frames(i),
                "note": np.array([TEXT if secret else f"note-{ep}"] * 6, dtype=object),
                "blob": [MARK if secret else b"plain"] * 6,
                "act": np.full((6, 2), i, np.float32),
            },
            episode=ep,
        )


def holders(store: td.Client, needles: tuple[bytes, ...]) -> list[str]:
    """Keys under the root, and files of this machine's object cache, holding a needle."""
    found = [k for k in store.store.list("") if any(n in store.store.get(k) for n in needles)]
    cache = Path(default_dir())
    if cache.is_dir():
        for dirpath, _, names in os.walk(cache):
            for n in names:
                p = Path(dirpath) / n
                if p.is_file() and any(x in p.read_bytes() for x in needles):
                    found.append(str(p))
    return found


def recipe(table, episodes=None) -> td.Recipe:
    comp = td.Component(table, WINDOWS, weight=1.0, episodes=episodes)
    return td.Recipe(seed=7, batch_size=4, components=[comp])


def hashes(plan: td.Plan) -> list[str]:
    return [batch_hash(b) for b in td.TrainLoader(plan, steps=3)]


def purge_case(root: str, options: dict | None) -> dict:
    client = td.Client(root, storage_options=options, create=options is None)
    project = client.project("p")
    branch = project.branch()
    fill(branch)
    t = branch.table("t")
    before = branch.commit_id
    project.tag("release", before)
    full = recipe(t).plan()
    loader = td.TrainLoader(full, steps=3)
    next(iter(loader))
    state = loader.state_dict()
    kept_plan = recipe(t, episodes=["a", "c"]).plan()
    kept = hashes(kept_plan)
    kept_plan.stats(["act"])  # kept under runstats/: quantiles are values of rows
    old_rows = t.at(before).to_arrow(filter="episode IN ('a', 'c')")
    t.append_episode(
        {"cam": frames(9), "note": np.array(["e"] * 6, dtype=object), "blob": [b"e"] * 6,
         "act": np.zeros((6, 2), np.float32)},
        episode="e",
    )  # fmt: skip
    media_before = set(client.store.list(f"{project.prefix}/media"))
    cache = file_cache()  # copies of the data files, as object-store reads keep them
    assert not isinstance(cache, str), cache
    for key, info in client.store.list_info(f"{project.prefix}/tables").items():
        if "/data/" in key:
            cache.path(client.store, key, info.size)
    needles = (MARK, TEXT.encode())
    found_before = holders(client, needles)
    commit = project.purge("t", ["b", "d"], reason="consent withdrawn")
    return dict(
        client=client, project=project, t=t, before=before, full=full, state=state,
        kept_plan=kept_plan, kept=kept, old_rows=old_rows, media_before=media_before,
        found_before=found_before, found_after=holders(client, needles), commit=commit,
    )  # fmt: skip


@pytest.fixture(scope="module")
def purged(tmp_path_factory):
    root = tmp_path_factory.mktemp("purge") / "store"
    root.mkdir()
    return purge_case(str(root), None)


def test_marker_bytes_are_gone_from_the_root(purged):
    before = purged["found_before"]
    assert any(k.startswith("projects/") for k in before), "the marker must be stored first"
    assert any(k.startswith(str(default_dir())) for k in before), "and in the object cache"
    assert purged["found_after"] == []


def test_head_loses_the_episodes_and_other_episodes_read_as_before(purged):
    t, commit = purged["t"], purged["commit"]
    head = t.pin()
    assert list(head.episodes().names) == ["a", "c", "e"]
    assert purged["project"].branch().head().id == commit.id
    assert "consent withdrawn" in commit.message
    old = t.at(purged["before"])
    assert old.to_arrow(filter="episode IN ('a', 'c')").equals(purged["old_rows"])
    rows = old.episodes()
    a = int(rows.starts[list(rows.names).index("a")])
    assert old.take([a, a + 1], ["act"]).column("act").to_pylist() == [[0.0, 0.0]] * 2
    assert (
        hashes(td.Plan.from_record(purged["kept_plan"].record, purged["client"])) == purged["kept"]
    )
    assert len(hashes(recipe(t).plan())) == 3  # a new run plans on the head


def check_purged(err: pytest.ExceptionInfo, commit: td.Commit) -> None:
    e = err.value
    assert e.episode in ("b", "d") and e.table == "t"
    assert e.commit == commit.id and e.reason == "consent withdrawn"
    text = str(e)
    assert repr(e.episode) in text and commit.short_id in text and "consent withdrawn" in text


def test_pinned_run_record_and_resume_raise_purged(purged):
    client, commit = purged["client"], purged["commit"]
    with pytest.raises(td.Purged) as err:
        td.Plan.from_record(purged["full"].record, client)
    check_purged(err, commit)
    with pytest.raises(td.Purged) as err:
        td.TrainLoader.from_state(purged["state"], client, steps=3)
    check_purged(err, commit)


def test_tag_and_table_at_raise_purged(purged):
    t, commit = purged["t"], purged["commit"]
    tagged = t.at(purged["project"].tags()["release"])
    with pytest.raises(td.Purged) as err:
        recipe(tagged).plan()
    check_purged(err, commit)
    at_version = t.at(tagged.version)
    for read in (
        lambda: at_version.to_arrow(),
        lambda: at_version.to_arrow(["act"], filter="episode = 'b'"),
        lambda: at_version.take([int(at_version.episodes().starts[1])]),
    ):
        with pytest.raises(td.Purged) as err:
            read()
        check_purged(err, commit)
    assert recipe(tagged, episodes=["a", "c"]).plan().eligible(0) > 0


def test_statistics_and_replacement_versions_hold_nothing_silently(purged):
    project, client, t = purged["project"], purged["client"], purged["t"]
    assert client.store.list(f"{project.prefix}/runstats") == []
    old = t.at(purged["before"])
    with pytest.raises(td.Purged):
        old.stats(["act"])
    record = project.lance.purge_map("t", fresh=True).records[0]
    assert record.versions and purged["commit"].id == record.commit
    replacement = t.at(record.versions[old.version])
    with pytest.raises(td.Purged):
        replacement.to_arrow(["act"])
    stats = td.Plan.from_record(purged["kept_plan"].record, client).stats(["act"])["act"]
    assert stats.min.tolist() == [0.0, 0.0] and stats.max.tolist() == [2.0, 2.0]


def test_media_go_unless_a_kept_episode_shares_them(purged):
    project, client = purged["project"], purged["client"]
    after = set(client.store.list(f"{project.prefix}/media"))
    gone = purged["media_before"] - after
    assert len(gone) == 1  # b's own stream; d's is c's and stays
    streams = td.Plan.from_record(purged["kept_plan"].record, client)  # still reads c
    assert streams is not None
    cam = purged["t"].pin().to_arrow(["cam"]).column("cam").to_pylist()
    named = {f"{project.prefix}/{c['stream']}" for c in cam}
    assert named <= after and not (named & gone)


def test_gc_keeps_what_retained_commits_reach_through_the_purge(purged):
    project, client = purged["project"], purged["client"]
    project.gc(older_than=timedelta(0))
    project.gc(older_than=timedelta(0), keep_days=0)
    assert hashes(td.Plan.from_record(purged["kept_plan"].record, client)) == purged["kept"]
    tagged = purged["t"].at(project.tags()["release"])
    assert tagged.to_arrow(filter="episode = 'a'").num_rows == 6
    with pytest.raises(td.Purged):
        tagged.to_arrow()


def test_bad_purges_write_nothing(tmp_path):
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    head = project.branch().commit_id
    with pytest.raises(td.NotFound, match="'zz'"):
        project.purge("t", ["a", "zz"], reason="r")
    with pytest.raises(ValueError, match="reason"):
        project.purge("t", ["a"], reason=" ")
    with pytest.raises(td.NotFound):
        project.purge("nope", ["a"], reason="r")
    assert project.branch().commit_id == head
    assert not client.store.list(f"{project.prefix}/purges")


def test_purge_of_episodes_deleted_earlier_and_twice(tmp_path):
    """Episodes already deleted at the head still go from history (an empty purge commit);
    a version purged twice resolves through both replacements."""
    client = td.Client(str(tmp_path))
    project = client.project("p")
    branch = project.branch()
    fill(branch)
    t = branch.table("t")
    old = t.pin()
    side = project.create_branch("side", from_="main")
    t.delete_episodes(["b"])
    first = project.purge("t", ["b"], reason="first")
    assert project.branch().head().tables == project.load_commit(first.parents[0]).tables
    assert list(side.table("t").pin().episodes().names) == ["a", "c", "d"]  # deleted there
    assert "first" in side.head().message
    second = project.purge("t", ["d"], reason="second")
    with pytest.raises(td.Purged) as err:
        recipe(t.at(old.version)).plan()
    assert err.value.commit in (first.id, second.id)
    again = t.at(old.version)
    assert set(again.purged()) == {"b", "d"}
    assert (
        again.to_arrow(["act"], filter="episode = 'c'").column("act").to_pylist()
        == [[2.0, 2.0]] * 6
    )
    assert holders(client, (MARK, TEXT.encode())) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "az"])
def test_purge_on_object_stores(kind, request):
    """The marker test, td.Purged from a pinned record and the kept episodes' batches, on
    the S3 server and on Azurite."""
    if kind == "s3":
        s3 = request.getfixturevalue("s3_server")
        root, options = s3.url(f"t-{os.getpid()}-purge"), s3.storage_options()
    else:
        root, options = request.getfixturevalue("az_root")
    got = purge_case(root, options)
    assert got["found_before"] and got["found_after"] == []
    with pytest.raises(td.Purged):
        td.Plan.from_record(got["full"].record, got["client"])
    assert hashes(td.Plan.from_record(got["kept_plan"].record, got["client"])) == got["kept"]


def test_cli_purge(tmp_path, capsys):
    from treadle.cli import main as cli_main

    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    args = ["purge", "p", "t", "b", "d", "--reason", "legal hold", "--root", str(tmp_path)]
    assert cli_main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"episodes": ["b", "d"]' in out and "legal hold" in out
    assert list(project.branch().table("t").pin().episodes().names) == ["a", "c"]
    assert cli_main(["purge", "p", "t", "zz", "--reason", "x", "--root", str(tmp_path)]) != 0
    assert "'zz'" in capsys.readouterr().err


def test_a_branch_made_before_the_purge_writes_no_blanked_rows(tmp_path):
    """A branch from a commit before the purge reads its other episodes; a write that
    would list the blanked rows again is a td.Purged (nothing committed) until the purged
    episodes are deleted on it."""
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    project.tag("old", project.branch().commit_id)
    project.purge("t", ["b", "d"], reason="erasure request")
    old = project.create_branch("old", from_=project.tags()["old"])
    t = old.table("t")
    head = old.commit_id
    episode = {"cam": frames(5), "note": np.array(["z"] * 6, dtype=object),
               "blob": [b"z"] * 6, "act": np.ones((6, 2), np.float32)}  # fmt: skip
    with pytest.raises(td.Purged, match="erasure request"):
        t.append_episode(episode, episode="z")
    with pytest.raises(td.Purged):
        t.add_column("ok", {}, default=True)
    assert old.commit_id == head
    t.delete_episodes(["b", "d"])
    t.append_episode(episode, episode="z")
    assert list(t.pin().episodes().names) == ["a", "c", "z"]
    assert len(hashes(recipe(t).plan())) == 3


def test_retention_expires_a_purged_version_like_any_other(tmp_path):
    """gc --keep-days: a replacement goes when no retained commit names the version it
    replaced, and reading that commit then says retention expired it."""
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    t = project.branch().table("t")
    old = project.branch().commit_id
    project.purge("t", ["b"], reason="r")
    report = project.gc(older_than=timedelta(0), keep_days=0)
    assert old in report.expired_commits and report.removed_versions > 0
    with pytest.raises(td.ExpiredCommit):
        t.at(old).to_arrow(filter="episode = 'a'")
    assert list(t.pin().episodes().names) == ["a", "c", "d"]
    assert t.pin().to_arrow(["act"]).num_rows == 18


def test_an_interrupted_purge_finishes_when_run_again(tmp_path, monkeypatch):
    import treadle.catalog.purge as purge_module

    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    old = project.branch().table("t").pin()
    real = purge_module.delete_replaced

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies once the record is stored

    monkeypatch.setattr(purge_module, "delete_replaced", crash)
    with pytest.raises(KeyboardInterrupt):
        project.purge("t", ["b", "d"], reason="first try")
    assert holders(client, (MARK,))  # nothing deleted yet, but reads already refuse
    with pytest.raises(td.Purged):
        recipe(project.branch().table("t").at(old.version)).plan()
    monkeypatch.setattr(purge_module, "delete_replaced", real)
    project.purge("t", ["b", "d"], reason="first try")
    assert holders(client, (MARK, TEXT.encode())) == []
    assert old.to_arrow(["act"], filter="episode = 'a'").num_rows == 6


def test_a_process_that_opened_a_version_before_the_purge_is_told(tmp_path):
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    old = project.branch().table("t").pin()
    old.to_arrow(["act"])  # opened (and cached) here
    td.Client(str(tmp_path)).project("p").purge("t", ["b"], reason="elsewhere")
    with pytest.raises(td.TreadleError, match="a new td.Client"):
        old.to_arrow(["act", "note", "blob"])
    fresh = td.Client(str(tmp_path)).project("p").branch().table("t").at(old.version)
    assert fresh.to_arrow(["act"], filter="episode = 'a'").num_rows == 6


def test_a_purge_beside_an_appending_writer_deletes_on_its_head(tmp_path, monkeypatch):
    """Another writer appended while the purge deleted on a branch: the purge raised the
    edit's CommitConflict ('nothing was committed', though branches before it kept their
    deletions), and a purge beside a steady importer never finished (fails before). It
    deletes on the new head; the writer's episode stays."""
    from treadle.catalog import transaction

    root = str(tmp_path)
    p = td.Client(root).project("p")
    for i in range(3):
        p.branch().table("t").append_episode({"x": np.full(3, float(i))}, episode=f"e{i}", fps=10)
    old = p.branch().commit_id
    real = transaction.Transaction._check_edited
    raced: list[str] = []

    def racing(self, head, versions):
        if self._edited and not raced:  # another writer's append lands before its commit
            raced.append("")
            other = td.Client(root).project("p").branch().table("t")
            raced[0] = other.append_episode({"x": np.full(2, 9.0)}, episode="late").id
            head = self.project.load_commit(raced[0])
        return real(self, head, versions)

    monkeypatch.setattr(transaction.Transaction, "_check_edited", racing)
    commit = p.purge("t", ["e1"], reason="consent withdrawn")
    assert raced and commit.parents == (raced[0],)
    t = p.branch().table("t").pin()
    assert list(t.episodes().names) == ["e0", "e2", "late"]
    with pytest.raises(td.Purged, match="consent withdrawn"):
        p.branch().table("t").at(old).to_arrow(filter="episode = 'e1'")


@pytest.mark.parametrize("dies_at", ["/stats/", "/data/"])
def test_a_purge_that_died_while_deleting_is_finished_whole(tmp_path, monkeypatch, dies_at):
    """A purge whose process died as it deleted the old version's statistics, or its first
    data file, is finished by the next purge of the table: the statistics, the data files
    and this machine's copies of them, the episodes' streams and their copies go. The
    statistics, the data files' copies and the streams stayed."""
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    store = client.store
    old = project.branch().table("t").pin()
    old.stats(["act"])  # kept under stats/t/v<N>/: the purged rows' values are in it
    cache = file_cache()
    assert not isinstance(cache, str), cache
    copies = {}
    for key, info in store.list_info(project.prefix).items():
        if "/data/" in key or "/media/" in key:
            cache.path(store, key, info.size)
            copies[key] = hashlib.sha256(f"{store.url}\0{key}\0{info.size}".encode()).hexdigest()
    real = store.delete

    def dies(key: str) -> None:
        if dies_at in key:
            raise KeyboardInterrupt  # the process dies here
        real(key)

    monkeypatch.setattr(store, "delete", dies)
    with pytest.raises(KeyboardInterrupt):
        project.purge("t", ["b", "d"], reason="first try")
    monkeypatch.setattr(store, "delete", real)
    media = set(store.list(f"{project.prefix}/media"))
    project.purge("t", ["b", "d"], reason="first try")
    assert holders(client, (MARK, TEXT.encode())) == []
    gone = media - set(store.list(f"{project.prefix}/media"))
    assert len(gone) == 1  # b's stream (d's is c's, which stays)
    left = {p.name for p in Path(default_dir()).iterdir()}
    assert not [k for k, name in copies.items() if not store.exists(k) and name[:40] in left]
    assert store.list(layout.stats_folder(project.prefix, "t", old.version)) == []
    assert old.to_arrow(["act"], filter="episode = 'a'").num_rows == 6

"""project.purge run again: a purge with nothing left to do commits nothing, one that died
is finished by running it again, and a purge walks only the records of earlier purges
that did not finish (records written before ``streams`` was kept included)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import treadle as td
from test_purge import MARK, TEXT, fill, holders
from treadle import layout


def _records(client: td.Client, project: td.Project) -> dict[str, dict]:
    folder = layout.purges_folder(project.prefix, "t")
    return {k: json.loads(client.store.get(k)) for k in client.store.list(folder)}


def _versions(project: td.Project) -> list[int]:
    return [int(v["version"]) for v in project.lance.load("t", None, "t").versions()]


def test_a_purge_run_again_once_done_commits_nothing(tmp_path):
    # before: every re-run wrote an empty commit, a new record and a new version of each
    # replacement (the blanked rows keep their episode names, so it found them again)
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    first = project.purge("t", ["b", "d"], reason="consent withdrawn")
    head, records, versions = (
        project.branch().commit_id,
        _records(client, project),
        _versions(project),
    )
    assert [r["finished"] for r in records.values()] == [True]
    again = project.purge("t", ["b"], reason="consent withdrawn")
    assert again.id == first.id
    assert project.branch().commit_id == head
    assert _records(client, project) == records and _versions(project) == versions


def _die_after_the_record(monkeypatch, project: td.Project) -> None:
    import treadle.catalog.purge as purge_module

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies once the record is stored

    with monkeypatch.context() as m:
        m.setattr(purge_module, "delete_replaced", crash)
        with pytest.raises(KeyboardInterrupt):
            project.purge("t", ["b", "d"], reason="first try")


def test_an_interrupted_purge_run_again_finishes_without_a_commit(tmp_path, monkeypatch):
    # before: the re-run committed again and wrote every replacement again
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    old = project.branch().table("t").pin()
    _die_after_the_record(monkeypatch, project)
    head, versions = project.branch().commit_id, _versions(project)
    [record] = _records(client, project).values()
    assert record["finished"] is False and holders(client, (MARK,))
    done = project.purge("t", ["b", "d"], reason="first try")
    assert done.id == record["commit"] == head == project.branch().commit_id
    assert holders(client, (MARK, TEXT.encode())) == []
    assert [r["finished"] for r in _records(client, project).values()] == [True]
    assert set(_versions(project)) == set(versions) - set(map(int, record["versions"]))
    assert old.to_arrow(["act"], filter="episode = 'a'").num_rows == 6


def test_a_purge_walks_only_the_records_not_finished(tmp_path, monkeypatch):
    # before: each purge asked the store for every data file every earlier purge removed
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    project.purge("t", ["b"], reason="one")
    [first] = _records(client, project).values()
    assert first["removed"]
    asked: list[str] = []
    real = client.store.size

    def size(key: str) -> int:
        asked.append(key)
        return real(key)

    monkeypatch.setattr(client.store, "size", size)
    project.purge("t", ["d"], reason="two")
    assert not [
        k for k in asked if k.rsplit("/", 1)[-1] in {p.rsplit("/", 1)[-1] for p in first["removed"]}
    ]
    assert [r["finished"] for r in _records(client, project).values()] == [True, True]


def test_a_record_from_before_streams_were_kept_is_finished_and_gc_takes_its_streams(
    tmp_path, monkeypatch
):
    client = td.Client(str(tmp_path))
    project = client.project("p")
    fill(project.branch())
    media = set(client.store.list(f"{project.prefix}/media"))
    _die_after_the_record(monkeypatch, project)
    [(key, record)] = _records(client, project).items()
    for field in ("streams", "finished"):  # as treadle wrote it before these were kept
        del record[field]
    client.store.put(key, json.dumps(record).encode())
    project.purge("t", ["b", "d"], reason="first try")
    assert _records(client, project)[key]["finished"] is True
    left = set(client.store.list(f"{project.prefix}/media"))
    assert holders(client, (TEXT.encode(),)) == [] and left == media  # b's stream: unknown
    project.gc(older_than=timedelta(0))
    assert len(media - set(client.store.list(f"{project.prefix}/media"))) == 1  # gc took it

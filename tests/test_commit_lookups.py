"""A commit never asks Lance for the table's latest version (issue 13).

Lance finds the latest version by listing ``_versions/`` (every version, each kept by a
tag): ``lance.dataset(uri)``, ``LanceDataset.latest_version``, and ``write_fragments`` or
``LanceDataset.commit`` given a uri all do it, so their cost grows with history. A commit
on top of a known version passes that opened version instead; this test records the
Lance calls of one commit (no timings).
"""

from __future__ import annotations

import lance
import numpy as np
import pytest

import treadle as td
from treadle.table import lancecommit, write


@pytest.fixture
def lookups(monkeypatch):
    """The Lance calls of the commit path that resolve the latest version."""
    seen: list[str] = []
    real_dataset, real_commit = lance.dataset, lance.LanceDataset.commit
    real_latest = lance.LanceDataset.latest_version

    def dataset(uri, *a, version=None, **k):
        if version is None:
            seen.append("lance.dataset(latest)")
        return real_dataset(uri, *a, version=version, **k)

    def commit(base, *a, **k):
        if isinstance(base, str):
            seen.append("LanceDataset.commit(uri)")
        return real_commit(base, *a, **k)

    def latest(self):
        seen.append("latest_version")
        return real_latest.fget(self)

    def fragments_of(real):
        def wrapped(data, target, *a, **k):
            if isinstance(target, str):
                seen.append("write_fragments(uri)")
            return real(data, target, *a, **k)

        return wrapped

    monkeypatch.setattr(lance, "dataset", dataset)
    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(commit))
    monkeypatch.setattr(lance.LanceDataset, "latest_version", property(latest))
    for mod in (write, lancecommit):
        monkeypatch.setattr(mod, "write_fragments", fragments_of(mod.write_fragments))
    return seen


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_commit_on_a_known_version_does_not_look_up_the_latest(where, request, lookups):
    root, opts = (
        (request.getfixturevalue("local_root"), None)
        if where == "local"
        else request.getfixturevalue("s3_root")
    )
    t = td.Client(root, storage_options=opts).project("p").branch("main").table("t")
    for i in range(4):  # the 4th merges the tail: compaction's write and commit too
        if i == 3:
            lookups.clear()
        t.append_episode({"v": np.full(3, i, np.float32)}, episode=f"e{i}")
    # before: the staged write, latest_version, the Append, compaction's write and commit
    assert lookups == [], lookups
    pinned = t.pin()
    assert pinned.episodes().names == ["e0", "e1", "e2", "e3"]
    assert pinned.take([9], ["v"]).to_pylist() == [{"v": 3.0}]

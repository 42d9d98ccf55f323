"""Tables know no branches; the catalog's Lance handle owns Lance; storage is obstore only.

Every import is read from the source (function-level and ``TYPE_CHECKING`` ones too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import treadle as td

SRC = Path(td.__file__).parent


def _imports(path: Path, runtime_only: bool = False) -> list[str]:
    """Every module ``path`` imports; with ``runtime_only``, not those under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_the_table_package_imports_nothing_of_the_catalog():
    # before: table/write.py imported treadle.catalog.commit and .leases, table.py and
    # write.py the catalog's Branch/Project/Commit for type hints
    bad = {
        f"{p.name}: {m}"
        for p in sorted((SRC / "table").glob("*.py"))
        for m in _imports(p)
        if m == "treadle.catalog" or m.startswith("treadle.catalog.")
    }
    assert not bad


def test_storage_is_obstore_only_and_small():
    import treadle.storage as storage

    # before: storage.py was one 641-line module holding lance_error
    assert not hasattr(storage, "lance_error")
    for p in sorted((SRC / "storage").glob("*.py")):
        assert len(p.read_text().splitlines()) <= 400, p.name
        assert not [m for m in _imports(p) if m == "lance" or m.startswith("lance.")], p.name
    for name in ("Store", "RangeRequest", "ObjectInfo", "default_root", "redact"):
        assert getattr(storage, name).__module__.startswith("treadle.storage")


def test_only_the_lance_handle_calls_lance_in_the_catalog():
    # before: catalog/client.py and catalog/gc.py opened datasets with lance.dataset
    users = sorted(
        p.name
        for p in (SRC / "catalog").glob("*.py")
        if any(m == "lance" or m.startswith("lance.") for m in _imports(p, runtime_only=True))
    )
    assert users == ["lance.py"]


def test_table_write_is_staging_only():
    text = (SRC / "table" / "write.py").read_text()
    assert len(text.splitlines()) <= 400
    assert "__module__" not in text  # isinstance, not the name of a value's module
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno + 1 <= 60, node.name


def test_project_versions_and_episode_indexes_come_from_its_lance_handle(local_root):
    project = td.Client(local_root).project("p")
    t = project.branch().table("t")
    t.append({"episode": ["a", "a", "b"], "frame": np.array([0, 1, 0], np.int32)})
    pinned = t.pin()
    # one cache: the pinned table's dataset is the handle's open version
    assert project.open_dataset("t", pinned.version) is project.lance.open("t", pinned.version)
    assert pinned.dataset is project.lance.open("t", pinned.version, pinned.commit_id)
    assert pinned.episodes() is project.lance.episode_index(pinned)
    assert project.table_uri("t") == project.lance.uri("t")
    assert list(pinned.episodes().names) == ["a", "b"]


class _MyFrames(td.VideoFrames):
    """A user's own frames type: still a video value."""


def test_a_subclass_of_video_frames_is_stored_as_video(local_root):
    # before: SchemaMismatch "column 'cam': cannot store values: Could not convert
    # _MyFrames(...) with type _MyFrames: did not recognize Python value type" (the value
    # was recognised by the name of its class's module, "treadle.video...")
    project = td.Client(local_root).project("p")
    frames = np.zeros((4, 16, 16, 3), np.uint8)
    t = project.branch().table("v")
    t.append_episode({"cam": _MyFrames(frames, fps=10), "a": np.ones((4, 2))}, episode="e0")
    assert t.pin().video_columns == ["cam"]
    assert t.pin().num_moments == 4


def test_an_object_that_is_not_a_video_value_is_not_encoded(local_root):
    project = td.Client(local_root).project("p")
    with pytest.raises(td.SchemaMismatch, match="'cam'"):
        project.branch().table("v").append_episode({"cam": object(), "a": np.ones((4, 2))})

"""layout.py builds every object key, and the docs show its LAYOUT."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treadle import layout

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    ("doc", "heading"),
    [
        ("storage.md", "## The layout under a root"),
        ("ARCHITECTURE.md", "## Storage layout under a root"),
    ],
)
def test_the_docs_show_the_layout(doc, heading):
    text = (DOCS / doc).read_text()
    block = text.split(heading, 1)[1].split("```", 2)[1]
    assert block.strip("\n") == layout.describe()


def _matches(key: str) -> str:
    """The LAYOUT pattern ``key`` is an instance of (the most literal one)."""
    found = []
    for pattern, _ in layout.LAYOUT:
        rx = re.escape(pattern)
        rx = re.sub(r"<seq:016d>", r"\\d{16}", rx)
        rx = re.sub(r"<object\\ key>", r".+", rx)
        rx = re.sub(r"<[^>]+>", r"[^/]+", rx)
        if re.fullmatch(rx + (".*" if pattern.endswith("/") else ""), key):
            found.append(pattern)
    found.sort(key=lambda p: p.count("<"))  # the most literal: source.json, not <key>.json
    assert found and (len(found) == 1 or found[0].count("<") < found[1].count("<")), (key, found)
    return found[0]


def test_every_key_function_builds_a_key_of_the_layout():
    p = layout.project_prefix("lab")
    keys = {
        layout.commit_key(p, "ab" * 32): "commits/<sha256>.json",
        layout.ref_key(p, "main", 7): "refs/<branch>/<seq:016d>.json",
        layout.tag_key(p, "v1"): "tags/<tag>.json",
        layout.table_key(p, "grasps") + "/data/x.lance": "tables/<table>.lance/",
        layout.under(p, layout.media_key("grasps", "cd" * 32)): "media/<table>/<sha256>.h264",
        layout.under(
            p, layout.media_key("grasps", "cd" * 32, "-1f")
        ): "media/<table>/<sha256>.h264",
        layout.episodes_key(p, "grasps", "a.lance"): "episodes/<table>/<data file>.json",
        f"{layout.stats_folder(p, 'grasps', 3)}/k.json": "stats/<table>/v<version>/<key>.json",
        layout.source_stats_key(p, "grasps", 3): "stats/<table>/v<version>/source.json",
        layout.runstats_key(p, "r1", "k"): "runstats/<run id>/<key>.json",
        layout.folder(p, layout.GC_WRITERS) + "/id/beat": "gc/writers/<id>/",
        layout.folder(p, layout.GC_USED) + "/media/t/x.h264": "gc/used/<object key>",
        layout.folder(p, layout.GC_SWEEPS) + "/id/start": "gc/sweeps/<id>/",
        layout.pending_key(p, "c1", "g1"): "retention/pending/<commit>/<gc>.json",
        layout.retention_key(p, "c1"): "retention/expired/<commit>.json",
    }
    for key, want in keys.items():
        assert _matches(key) == f"projects/<project>/{want}", key
    assert _matches(layout.MARKER) == "treadle.json"
    assert layout.ref_key(p, "main", 7) == "projects/lab/refs/main/0000000000000007.json"


def test_no_module_spells_a_key_of_its_own():
    """Key folders appear as string literals only in layout.py."""
    src = Path(layout.__file__).parent
    pattern = re.compile(
        r"f?\"[^\"]*(\}|^|/)(commits|refs|tags|tables|media|episodes|stats|runstats)/"
    )
    bad = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "layout.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "{" in code and "prefix" in code:
                bad.append(f"{path.relative_to(src)}:{n}: {line.strip()}")
    assert bad == [], "keys built outside layout.py:\n  " + "\n  ".join(bad)

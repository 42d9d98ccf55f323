"""The README's examples run as written, in order, in one fresh store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from test_docs import DOCS, PAGES, blocks, command_lines, parse_line

README = Path(__file__).parents[1] / "README.md"


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    """Run every ```python block of the README in order, in one namespace; return the
    namespace as it was after each block, by block name."""
    tmp_path = tmp_path_factory.mktemp("readme")
    scope: dict = {}
    code = blocks(README, "python")
    assert len(code) == 3 and not any("no-run" in info for info, _ in code)
    names = ["first look", "utilities", "lerobot"]
    after = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TREADLE_ROOT", str(tmp_path / "store"))
        mp.chdir(tmp_path)
        for name, (_, text) in zip(names, code, strict=True):
            exec(compile(text, f"README.md ({name})", "exec"), scope)
            after[name] = dict(scope)
        yield after


def test_readme_examples_run(readme):
    import treadle as td

    scope = readme["first look"]
    plan, row = scope["plan"], scope["row"]
    assert row.step == 50 and plan.run_id == row.run_id
    # The resumed loader delivered steps 50..99: the batches an uninterrupted run has there.
    trained = scope["trained"]
    assert len(trained) == 60 + 50
    uninterrupted = [b["_moment"] for b in td.TrainLoader(plan, steps=100)]
    assert all(torch.equal(a, b) for a, b in zip(trained[:60], uninterrupted[:60], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(trained[60:], uninterrupted[50:], strict=True))
    # ... whole batches too (video frames and actions), not only which moments.
    client = scope["client"]
    resumed = list(td.TrainLoader.from_state(row.loader_state, client, steps=53))
    straight = list(td.TrainLoader(plan, steps=53))[50:]
    assert len(resumed) == 3
    for a, b in zip(resumed, straight, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    scope = readme["utilities"]
    assert tuple(scope["aug"]["wrist_camera"].shape) == (32, 8, 48, 48, 3)
    assert scope["s"].mean.shape == (7,) and scope["val"].steps == 8 and len(scope["val"]) == 0


def test_readme_lerobot_example_runs(readme):
    batch, plan = readme["lerobot"]["batch"], readme["lerobot"]["plan"]
    assert tuple(batch["action"].shape) == (8, 10, 14)
    assert tuple(batch["action_is_pad"].shape) == (8, 10)
    assert batch["task"] == [["fold the towel"]] * 8
    assert plan.record.to_dict()["components"][0]["windows"]["action"]["offsets"] == {
        "range": [0, 10]
    }
    assert plan.record.components[1].where == "success"


def test_readme_command_lines_parse():
    """Every `treadle ...` line of the README's and the guide's shell blocks is valid grammar."""
    lines = command_lines(README)
    section = README.read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^treadle ", section, re.M)) >= 8
    assert len(lines) >= 8
    for page in PAGES:
        lines += command_lines(DOCS / page)
    assert len(lines) >= 40
    for words in lines:
        parse_line(words)
    text = README.read_text()
    assert "**0** success" in text and "**1** user error" in text and "**2** usage" in text


def test_readme_links_only_into_the_repository():
    text = README.read_text()
    assert "shared folder" not in text and "DESIGN.md" not in text
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert "docs/README.md" in targets
    for target in targets:
        if re.match(r"[a-z]+://", target):
            continue
        assert (README.parent / target.split("#", 1)[0]).exists(), target

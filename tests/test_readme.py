"""The README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_example_runs(tmp_path, monkeypatch):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    monkeypatch.setenv("TREADLE_ROOT", str(tmp_path / "store"))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["row"].step == 100
    assert tuple(scope["batch"]["wrist_camera"].shape) == (32, 8, 64, 64, 3)
    assert scope["plan"].run_id == scope["row"].run_id
    utilities = re.findall(r"```python\n(.*?)```", text, re.S)[1]
    exec(compile(utilities, "README.md (training utilities)", "exec"), scope)
    assert tuple(scope["aug"]["wrist_camera"].shape) == (32, 8, 48, 48, 3)
    assert scope["s"].mean.shape == (7,) and scope["val"].steps == 8 and len(scope["val"]) == 0


def test_readme_lerobot_example_runs(tmp_path, monkeypatch):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("## Coming from LeRobot", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    monkeypatch.setenv("TREADLE_ROOT", str(tmp_path / "store"))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    batch, plan = scope["batch"], scope["plan"]
    assert tuple(batch["action"].shape) == (8, 10, 14)
    assert tuple(batch["action_is_pad"].shape) == (8, 10)
    assert batch["task"] == [["fold the towel"]] * 8
    assert plan.record.to_dict()["components"][0]["windows"]["action"]["offsets"] == {
        "range": [0, 10]
    }
    assert plan.record.components[1].where == "success"


def test_readme_command_lines_parse():
    """Every line of the README's command-line block is valid `treadle` grammar."""
    from treadle.cli import build_parser

    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("## Command line", 1)[1]
    block = re.findall(r"```\n(.*?)```", section, re.S)[0]
    lines = [ln.split("#", 1)[0].split() for ln in block.splitlines() if ln.strip()]
    assert len(lines) >= 8 and all(ln[0] == "treadle" for ln in lines)
    parser = build_parser()
    for words in lines:
        args = parser.parse_args(words[1:])  # exits 2 on anything it does not know
        assert args.func is not None
    assert "**0** success" in text and "**1** user error" in text and "**2** usage" in text

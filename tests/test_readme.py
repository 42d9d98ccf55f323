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

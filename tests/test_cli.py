"""The catalog commands of the CLI."""

from __future__ import annotations

import numpy as np

import treadle as td
from treadle.cli import main


def test_projects_log_tables(local_root, capsys):
    main_branch = td.Client(local_root).project("robotics").branch()
    main_branch.table("failed").append_episode({"action": np.zeros((5, 7), np.float32)})
    c = main_branch.table("flat").append({"x": [1, 2]})
    assert main(["--root", local_root, "projects"]) == 0
    assert "robotics" in capsys.readouterr().out
    assert main(["--root", local_root, "log", "robotics"]) == 0
    out = capsys.readouterr().out
    assert c.short_id in out and "append to flat" in out
    assert main(["--root", local_root, "tables", "robotics"]) == 0
    out = capsys.readouterr().out
    assert "failed" in out and "5 moments" in out and "1 episodes" in out
    first = main_branch.log()[-1].short_id
    assert main(["--root", local_root, "tables", "robotics", "--at", first]) == 0
    assert "no tables" in capsys.readouterr().out
    assert main(["--root", local_root, "gc", "robotics"]) == 0
    assert "kept 2 table versions" in capsys.readouterr().out


def test_errors_are_one_line(local_root, capsys):
    assert main(["--root", local_root, "log", "nope"]) == 1
    assert "project 'nope' not found" in capsys.readouterr().err
    assert main(["--root", local_root, "log", "../etc"]) == 1
    assert "invalid project name" in capsys.readouterr().err

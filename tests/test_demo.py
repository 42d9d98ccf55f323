"""`treadle demo` end to end, on a short run."""

from __future__ import annotations

from pathlib import Path

from treadle.cli import main


def test_demo_trains_checkpoints_and_restarts_on_two_ranks(tmp_path, capsys):
    root = str(tmp_path / "store")
    args = ["demo", "--steps", "10", "--checkpoint-every", "4", "--check", "3", "--root", root]
    assert main(args) == 0
    out, err = capsys.readouterr()
    # off a terminal (captured here): one line per phase, no progress bar, no carriage return
    assert "\r" not in out + err
    assert "creating demo episodes: 20/20 episodes" in out
    assert "training: 10/10 steps, loss " in out
    assert "Run record" in out and "failed_grasps" in out and "nominal_grasps" in out
    # padded windows: every moment of both tables is an anchor
    assert out.count("moments kept (100%)") == 2 and "warning" not in out
    assert "latest checkpoint row (step 7)" in out
    assert "validation on failed_grasps: 432 moments once each, loss " in out
    assert out.count("  match\n") == 3 and "DIFFERENT" not in out
    assert "every batch matches" in out
    # a second run reuses the project (created once) and the same pinned versions
    assert main([*args, "--quiet"]) == 0
    again, err = capsys.readouterr()
    assert "creating demo episodes" not in again
    assert "training:" not in again and "\r" not in again + err  # --quiet: no progress at all
    assert "every batch matches" in again
    assert main(["--root", root, "tables", "robotics"]) == 0
    tables = capsys.readouterr().out
    assert "20 episodes" not in tables and "6 episodes" in tables and "14 episodes" in tables
    # examples/demo_recipe.toml is the same recipe: same run id
    run_id = out.split("Run record ", 1)[1].split()[0]
    recipe_file = str(Path(__file__).parents[1] / "examples" / "demo_recipe.toml")
    assert main(["--root", root, "plan", recipe_file, "--world-size", "4"]) == 0
    assert f"Run record {run_id}" in capsys.readouterr().out


def test_a_refused_root_prints_no_finished_phase(tmp_path, capsys):
    # before: "creating demo episodes: 0/20 episodes (0.0 s)" above the error, read as a phase
    # that had ended
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["demo", "--steps", "2", "--root", str(other)]) == 1
    out, err = capsys.readouterr()
    assert "episodes" not in out and "is not a treadle store" in err

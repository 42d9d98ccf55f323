"""The run-record card and ``treadle plan`` (TOML and Python recipes)."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction

import numpy as np
import pytest

import treadle as td
from plan_helpers import FakeRef, FakeTable
from treadle.cli.cmd_plan import plan_command, register
from treadle.errors import PlanWarning
from treadle.plan.card import render_card
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.video.values import VideoFrames


def parse(argv):
    parser = argparse.ArgumentParser(prog="treadle")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "store"
    client = td.Client(str(path), create=True)
    branch = client.project("robotics").branch("main")
    fails = branch.table("failed_grasps")
    for i in range(2):
        fails.append_episode(
            {
                "wrist_camera": VideoFrames(np.zeros((12, 16, 16, 3), np.uint8)),
                "action": np.zeros((12, 7), np.float32),
            },
            episode=f"f{i}",
        )
    branch.table("nominal_grasps").append_episode(
        {"action": np.zeros((40, 7), np.float32)}, episode="n0"
    )
    return str(path), branch.commit_id


TOML = """
project = "robotics"
root = "{root}"
seed = 2048
batch_size = 64

[[components]]
table = "failed_grasps"
weight = 0.3
[components.windows]
wrist_camera = {{ kind = "video", range = [0, 10], size = [32, 32] }}
action = {{ kind = "rows", offsets = [0, 2, 4] }}

[[components]]
table = "nominal_grasps"
weight = 0.7
"""


def test_toml_recipe_prints_the_card(root, tmp_path, capsys):
    path, head = root
    recipe = tmp_path / "r.toml"
    recipe.write_text(TOML.format(root=path))
    args = parse(["plan", str(recipe), "--world-size", "4"])
    assert args.func is plan_command
    assert plan_command(args) == 0
    out = capsys.readouterr().out
    assert f"failed_grasps  @ main ({head[:8]})" in out
    assert "24 moments, 2 episodes" in out and "40 moments, 1 episode\n" in out  # was "1 episodes"
    assert (
        "weight 0.3 → share 3/10 = 0.3, exact" in out
        and "19 or 20 per batch" in out
        and "44 or 45 per batch" in out
    )
    assert "wrist_camera Video[0..9] 32x32" in out and "action Rows[0, 2, 4]" in out
    assert "seed = 2048" in out
    assert "rank 0 [0000, 0004, 0008, …]" in out and "rank 3 [0003, 0007, 0011, …]" in out
    assert "rank 4" not in out


def test_json_output_is_the_run_record(root, tmp_path, capsys):
    path, _ = root
    recipe = tmp_path / "r.toml"
    recipe.write_text(TOML.format(root="/nonexistent"))
    assert plan_command(parse(["plan", str(recipe), "--json", "--root", path])) == 0
    record = RunRecord.from_json(capsys.readouterr().out)
    assert [t.name for t in record.tables] == ["failed_grasps", "nominal_grasps"]
    assert record.components[0].eligible == 2 * (12 - 9)


def test_python_recipe(root, tmp_path, capsys):
    path, _ = root
    script = tmp_path / "recipe.py"
    script.write_text(
        "import treadle as td\n"
        "from treadle.plan.recipe import Component, Recipe\n"
        f"branch = td.Client({path!r}).project('robotics').branch('main')\n"
        "def recipe():\n"
        "    return Recipe(7, 8, [Component(branch.table('nominal_grasps'))])\n"
    )
    assert plan_command(parse(["plan", str(script), "--world-size", "2", "--slots", "2"])) == 0
    out = capsys.readouterr().out
    assert "nominal_grasps" in out and "rank 1 [0001, 0003, …]" in out and "8 per batch" in out


@pytest.mark.parametrize(
    "text, message",
    [
        ("project = 'robotics'\nseed = 1\nbatch_size = 8\ncomponents = []\n", "components"),
        ("project = 'robotics'\nseed = 1\ncomponents = [{table = 'x'}]\n", "'batch_size'"),
        ("project = 'robotics'\nseed = 1\nbatch_size = 8\ncolour = 1\n", "'colour'"),
        (
            "project = 'robotics'\nseed = 1\nbatch_size = 8\n"
            "[[components]]\ntable = 'nominal_grasps'\nweight = 0\n",
            "weight",
        ),
        (
            "project = 'robotics'\nseed = 1\nbatch_size = 8\n"
            "[[components]]\ntable = 'nominal_grasps'\nwindows = { action = { kind = 'rows' } }\n",
            "'action' needs range",
        ),
        (
            "project = 'robotics'\nseed = 1\nbatch_size = 8\n"
            "[[components]]\ntable = 'nominal_grasps'\nwindows = { action = { kind = 'video', range = [0, 2] } }\n",
            "not a video column",
        ),
        (
            "project = 'robotics'\nseed = 1\nbatch_size = 6\n[[components]]\ntable = 'nominal_grasps'\n",
            "--world-size 4",
        ),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_bad_recipes_exit_1_with_a_message(root, tmp_path, capsys, text, message):
    path, _ = root
    recipe = tmp_path / "bad.toml"
    recipe.write_text(text)
    assert plan_command(parse(["plan", str(recipe), "--root", path, "--world-size", "4"])) == 1
    err = capsys.readouterr().err
    assert err.startswith("treadle plan: ") and message in err


def test_missing_recipe_file(tmp_path, capsys):
    assert plan_command(parse(["plan", str(tmp_path / "nope.toml")])) == 1
    assert "does not exist" in capsys.readouterr().err


def test_card_from_a_record_alone():
    t = FakeTable("t", [5, 5])
    plan = Recipe(1, 6, [Component(FakeRef(t), weight=1), Component(FakeRef(t), weight=3)]).plan()
    card = render_card(plan.record, world_size=3, slots=5)
    assert card.startswith(f"Run record {plan.run_id}")
    assert (
        "share 1/4 = 0.25, exact" in card
        and "1 or 2 per batch" in card
        and "4 or 5 per batch" in card
    )
    assert "rank 2 [0002, 0005]" in card and "step 0" not in card
    card = render_card(plan.record, world_size=4)
    assert "not divisible by 4 ranks" in card
    assert json.loads(plan.record.to_json())["run_id"] in card


def test_card_shows_asked_and_planned_shares():
    t = FakeTable("t", [5, 5])
    with pytest.warns(PlanWarning, match="share asked 0.000299910027, planned 3/10000"):
        plan = Recipe(
            1, 8, [Component(FakeRef(t), weight=w) for w in (1 / 3, 0.0004, 1.0)]
        ).plan()  # 1/3 prints as 0.3333333333333333: a denominator of 10**16, within 1e-6
    card = render_card(plan.record)
    lines = [line for line in card.splitlines() if line.startswith("   [")]
    asked = plan.record.asked_weights
    planned = plan.record.weights
    for line, a, w in zip(lines, asked, planned):
        assert f"share asked {float(a):.9g}, planned {w.numerator}/{w.denominator}" in line
        assert f"(off by {float(abs(w - a)):.2g})" in line
        assert abs(w - a) <= Fraction(1, 10**6)


def test_card_of_a_legacy_record_shows_its_rounded_share():
    from test_plan_record import LEGACY

    card = render_card(RunRecord.from_json(LEGACY))
    assert "treadle.plan/1" in card
    assert "weight 0.0004 → share asked 0.0004, planned 1/1000 = 0.001 (off by 0.0006)" in card
    assert "weight 0.3 → share asked 0.3, planned 300/1000 = 0.3 (off by 0)" not in card
    assert "weight 0.3 → share 3/10 = 0.3, exact" in card


def test_toml_recipe_with_padding_seconds_and_selection(root, tmp_path, capsys):
    path, _ = root
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f"""
project = "robotics"
root = "{path}"
seed = 1
batch_size = 4

[[components]]
table = "failed_grasps"
episodes = ["f1"]
where = "frame >= 2"
rename = {{ action = "act" }}
[components.windows]
action = {{ kind = "rows", range = [0, 4], pad = true }}
"""
    )
    assert plan_command(parse(["plan", str(recipe), "--json"])) == 0
    record = RunRecord.from_json(capsys.readouterr().out)
    c = record.components[0]
    assert (c.episodes, c.where, c.rename) == (("f1",), "frame >= 2", (("action", "act"),))
    assert c.eligible == 10 and c.windows["action"].pad
    assert plan_command(parse(["plan", str(recipe)])) == 0
    out = capsys.readouterr().out
    assert "10 of 24 moments kept (42%)" in out and "where: frame >= 2" in out
    assert "warning" in out and "selection" in out


def test_toml_recipe_weighs_by_moments(root, tmp_path, capsys):
    path, _ = root
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        TOML.format(root=path).replace("batch_size = 64", 'batch_size = 64\nweigh_by = "moments"')
    )
    assert plan_command(parse(["plan", str(recipe)])) == 0
    out = capsys.readouterr().out
    # 0.3 x 6 eligible moments (two 12-moment episodes, 10-moment windows) and 0.7 x 40
    assert "weight 0.3 × 6 moments → share 9/149 = 0.0604026846, exact" in out
    assert "weight 0.7 × 40 moments → share 140/149" in out
    recipe.write_text(
        TOML.format(root=path).replace("batch_size = 64", 'batch_size = 64\nweigh_by = "rows"')
    )
    assert plan_command(parse(["plan", str(recipe)])) == 1
    assert "weigh_by must be None or 'moments'" in capsys.readouterr().err

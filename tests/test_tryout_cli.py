"""What a new user ran into on the command line (issue 18's tryout), each as it was seen."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from treadle.cli import build_parser, main

sys.path.insert(0, str(Path(__file__).parent))
from importer_fixtures import make_wds  # noqa: E402


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for child in {id(c): c for c in action.choices.values()}.values():
                yield from _parsers(child)


def test_no_command_is_a_usage_error(capsys):
    # before: the help on stdout and exit 0, though a missing argument is documented as 2
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage: treadle" in err and "give a COMMAND" in err


def test_json_on_a_report_command_is_a_usage_error(tmp_path, capsys):
    # before: `treadle demo --json` ignored --json and ran the whole demo (exit 0)
    argv = ["demo", "--steps", "2", "--check", "1", "--quiet", "--json"]
    assert main([*argv, "--root", str(tmp_path / "store")]) == 2
    assert "--json: demo does not use it" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("given", [["--root", "/r"], ["--storage-option", "a=1"], ["--json"]])
def test_bench_refuses_global_options_it_would_ignore(given, tmp_path, capsys):
    # before: `treadle bench --root R` ran the suite on its own stores and ignored R
    argv = ["bench", "--tiny", "--cases", "plan", "--dir", str(tmp_path / "b")]
    assert main([*given, *argv]) == 2
    assert f"{given[0]}: bench does not use it" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_bench_cases_are_checked_when_parsed(tmp_path, capsys):
    # before: `--cases foo` made DIR, then bench/suite.py's own usage line (with options
    # treadle bench does not have, like --redraw) and exit 2
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--cases", "mix,foo", "--dir", str(tmp_path / "b")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown case 'foo'" in err and "--redraw" not in err
    assert not (tmp_path / "b").exists()


def test_bench_knows_the_suites_cases():
    from treadle.cli import cmd_bench as bench

    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    try:
        import suite
    finally:
        sys.path.pop(0)
    assert (bench.CASES, bench.OPT_IN) == (suite.CASES, suite.OPT_IN)
    assert set(suite.RUNNERS) == set(bench.CASES + bench.OPT_IN)


def test_help_shows_no_rest_markup():
    # before: `treadle --help` said "The ``treadle`` command line", `demo --help` likewise
    for parser in _parsers(build_parser()):
        assert "``" not in parser.format_help(), parser.prog


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    # before: `treadle demo | head -1` ended in a BrokenPipeError traceback
    (tmp_path / "empty").mkdir()
    argv = [sys.executable, "-m", "treadle.cli", "--root", str(tmp_path / "empty"), "projects"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # like `| head -0`: nobody reads what it prints
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert p.returncode == 1 and err == "", err


def test_import_creates_a_new_root_folder(tmp_path, capsys):
    # before: exit 1, "root '...' does not exist (create it, or pass create=True)" (an API hint)
    pattern = make_wds(tmp_path / "wds", n=4, per_shard=4)
    root = tmp_path / "new" / "store"
    argv = ["import", "webdataset", pattern, "--project", "p", "--table", "t", "--root", str(root)]
    assert main(argv) == 0, capsys.readouterr().err
    assert (root / "treadle.json").exists()
    assert main(["--root", str(root), "tables", "p"]) == 0
    assert "4 moments" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["webdataset", "mds", "lerobot", "hf"])
def test_import_errors_have_the_one_error_format(fmt, tmp_path, capsys):
    # before: "treadle import webdataset: NotFound: no WebDataset shard ...", unlike every
    # other "COMMAND: error: ..." line, and as many lines as the error had
    root = tmp_path / "store"
    root.mkdir()
    argv = ["import", fmt, str(tmp_path / "missing"), "--project", "p", "--table", "t"]
    assert main([*argv, "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"treadle import {fmt}: error: ") and err.count("\n") == 1, err
    assert "missing" in err


def test_a_python_recipe_that_raises_is_one_line_naming_file_and_line(tmp_path, capsys):
    # before: the ZeroDivisionError came out of main() as a traceback
    recipe = tmp_path / "recipe.py"
    recipe.write_text("import treadle as td\n\nrecipe = 1 / 0\n")
    assert main(["plan", str(recipe), "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "recipe.py', line 3 raised ZeroDivisionError" in err, err


def test_a_toml_recipe_error_names_the_file(tmp_path, capsys):
    # before: "treadle plan: recipe is missing 'project'" (which file?)
    recipe = tmp_path / "bad.toml"
    recipe.write_text("seed = 1\nbatch_size = 4\n")
    assert main(["plan", str(recipe), "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"treadle plan: error: recipe {str(recipe)!r} is missing 'project'\n", err


def test_stats_with_a_bad_where_is_one_line(tmp_path, capsys):
    # before: a traceback ending in Lance's "ValueError: Invalid user input: Schema error:
    # No field named frmae. Did you mean 'frame'?., /home/runner/work/lance/..."
    import numpy as np

    import treadle as td

    root = tmp_path / "store"
    root.mkdir()
    arm = td.Client(str(root)).project("p").branch("main").table("arm")
    arm.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="e")
    argv = ["--root", str(root), "stats", "p", "arm", "--where", "frmae > 1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "where='frmae > 1' on table 'arm'" in err, err
    assert "frame" in err and "/home/runner" not in err


def test_an_empty_root_is_refused_not_the_working_folder(tmp_path, monkeypatch, capsys):
    # before: `treadle --root "" projects` listed the working folder as the store
    monkeypatch.chdir(tmp_path)
    assert main(["--root", "", "projects"]) == 1
    assert "--root is empty" in capsys.readouterr().err
    assert main(["projects", "--root", " "]) == 1
    assert "--root is empty" in capsys.readouterr().err


def test_a_window_kind_typo_names_the_kind_as_written(tmp_path, capsys):
    # before: "bad window spec {'kind': 'rowz', 'offsets': {'range': [0, 2]}}: unknown
    # window spec kind 'rowz'", a dict the file never had (range rewritten as offsets)
    import numpy as np

    import treadle as td

    arm = td.Client(str(tmp_path)).project("p").branch("main").table("t")
    arm.append_episode({"action": np.zeros((4, 2), np.float32)}, episode="e")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        'project = "p"\nseed = 1\nbatch_size = 4\n[[components]]\ntable = "t"\n'
        '[components.windows]\naction = { kind = "rowz", range = [0, 2] }\n'
    )
    assert main(["plan", str(recipe), "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "window 'action' needs kind = \"video\" or \"rows\", not 'rowz'" in err, err
    assert "'offsets': {" not in err


def test_a_missing_root_names_the_command_line_fix(tmp_path, capsys):
    # before: "root '...' does not exist (create it, or pass create=True)": an API hint
    # where a command-line user has no create=True to pass
    missing = tmp_path / "no-such-store"
    assert main(["--root", str(missing), "projects"]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "check the path" in err and "treadle import" in err
    assert not missing.exists()


def test_a_missing_extra_is_named_with_its_pip_line(tmp_path, monkeypatch, capsys):
    # before: "install it, or the treadle extra that brings it", without naming the extra
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as in the runtime set: no treadle[ui]
    assert main(["--root", str(tmp_path), "ui", "--no-open", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "needs the package 'uvicorn'" in err and "pip install 'treadle[ui]'" in err


def test_help_summaries_are_current(capsys):
    # before: `treadle --help` listed four import formats of eight, `simulate --help` showed
    # ":mod:`treadle.plan.simulate`" and `demo --help` built "the seed page's recipe";
    top = build_parser().format_help()
    formats = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    imports = formats.choices["import"]
    names = next(a for a in imports._actions if isinstance(a.choices, dict)).choices
    line = " ".join(top[top.index("    import ") :].split("\n    demo")[0].split())
    for name in names:
        shown = {"webdataset": "WebDataset", "mds": "MDS", "lerobot": "LeRobot",
                 "hf": "Hugging Face", "rlds": "RLDS", "hdf5": "HDF5", "zarr": "Zarr",
                 "ros2": "ROS"}[name]  # fmt: skip
        assert shown in line, (name, line)
    for parser in _parsers(build_parser()):
        text = parser.format_help()
        assert re.search(r":[a-z]+:`", text) is None, parser.prog
        assert "seed page" not in text, parser.prog
        # before: purge, diff, merge, plan, ui, show and info printed one line of 100-200
        lines = (parser.description or "").splitlines()
        assert max(map(len, lines), default=0) <= 90, parser.prog


def test_bench_says_up_front_which_peers_are_missing_and_how_to_install_them(monkeypatch):
    """Without the peers, `treadle bench` ran for minutes and every peer row said "not
    installed" at the end, with no word at the start. (The message only: no benchmark.)"""
    import importlib.util

    from treadle.cli import cmd_bench as bench

    assert bench.peers_note([]) is None
    absent = {"streaming", "spdl"}
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name in absent else real("json")
    )
    missing = bench.missing_peers()
    assert [m[0] for m in missing] == ["streaming", "spdl"]
    note = bench.peers_note(missing)
    assert (
        "2 of 6 peer loaders are not installed: MosaicML Streaming (mosaicml-streaming), " in note
    )
    assert "SPDL (spdl);" in note and "bash scripts/install-peers.sh" in note
    assert "requirements/peers.txt" in note

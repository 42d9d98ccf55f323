"""The command line: its commands, its one grammar (global options anywhere), exit codes."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

import treadle as td
from treadle.cli import args as cliargs
from treadle.cli import build_parser, cmd_bench, main

sys.path.insert(0, str(Path(__file__).parent))
from importer_fixtures import make_wds  # noqa: E402

GLOBALS_BEFORE = ["--root", "/r/before", "--storage-option", "a=1", "--quiet"]
GLOBALS_AFTER = ["--root", "/r/after", "--storage-option", "b=2", "--json", "--config", "c.toml"]


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
    assert "5 moments, 1 episode  action" in out  # was "1 episodes", then "1 episode (episodes)"
    assert "2 moments (flat: no episodes)  x" in out  # was "2 moments (rows)"
    first = main_branch.log()[-1].short_id
    assert main(["--root", local_root, "tables", "robotics", "--at", first]) == 0
    assert "no tables" in capsys.readouterr().out
    assert main(["--root", local_root, "gc", "robotics"]) == 0
    assert "kept 2 table versions" in capsys.readouterr().out
    # --json: the same data, machine-readable, and the option may follow the command
    assert main(["projects", "--json", "--root", local_root]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"name": "robotics", "branches": ["main"], "tables_on_main": 2}
    ]
    assert main(["--json", "--root", local_root, "log", "robotics", "--limit", "1"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["id"] == c.id and entry["message"] == "append to flat"
    assert main(["tables", "robotics", "--root", local_root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {t["name"]: t["moments"] for t in doc["tables"]} == {"failed": 5, "flat": 2}


def test_a_typo_in_treadle_root_is_an_error_as_one_in_root_is(local_root, capsys, monkeypatch):
    """``$TREADLE_ROOT`` with a typo made an empty store there on a read command, and
    ``treadle projects`` listed nothing, exit 0; ``--root`` with the same typo is an error."""
    typo = str(Path(local_root).parent / "stroe")
    monkeypatch.setenv("TREADLE_ROOT", typo)
    for argv in (["projects"], ["log", "p"], ["tables", "p"], ["stats", "p", "t"]):
        assert main(argv) == 1
        assert f"$TREADLE_ROOT {typo!r} does not exist: check" in capsys.readouterr().err
    assert main(["--root", typo, "projects"]) == 1
    assert f"root {typo!r} does not exist" in capsys.readouterr().err
    assert not Path(typo).exists()
    monkeypatch.setenv("TREADLE_ROOT", local_root)  # an existing one is read as before
    td.Client(local_root).project("p")
    assert main(["projects"]) == 0 and "p" in capsys.readouterr().out


def test_errors_are_one_line(local_root, capsys):
    assert main(["--root", local_root, "log", "nope"]) == 1
    err = capsys.readouterr().err
    assert "project 'nope' not found" in err and err.count("\n") == 1
    assert main(["--root", local_root, "log", "../etc"]) == 1
    assert "invalid project name" in capsys.readouterr().err


def test_gc_reports_and_refuses_a_negative_grace(local_root, capsys):
    import pytest

    td.Client(local_root).project("p").branch().table("t").append({"x": [1, 2]})
    assert main(["--root", local_root, "gc", "p", "--older-than-hours", "0"]) == 0
    out = capsys.readouterr().out
    assert "kept 1 table versions" in out and "staged data files" in out
    with pytest.raises(SystemExit) as e:
        main(["--root", local_root, "gc", "p", "--older-than-hours", "-1"])
    assert e.value.code == 2
    assert "must be a finite number >= 0" in capsys.readouterr().err


# -- one grammar ------------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, leaf parser) for every command of the tree."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*path, name))


def _required(leaf: argparse.ArgumentParser) -> list[str]:
    """The least argv a command accepts: its positionals and required options."""
    out = []
    for a in leaf._actions:
        if not a.option_strings and a.nargs != "?":
            out.append("x")
        elif a.option_strings and a.required:
            out += [a.option_strings[0], _a_value(a)]
    return out


def _a_value(action: argparse.Action) -> str:
    """A value the option's type takes (``simulate --nodes`` takes a count, ``--latency`` a
    time)."""
    for text in ("x", "1", "30ms"):
        try:
            if action.type is not None:
                action.type(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        return text
    raise AssertionError(f"no sample value for {action.option_strings[0]}")


def _all_parsers(parser: argparse.ArgumentParser):
    yield parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for child in {id(c): c for c in a.choices.values()}.values():
                yield from _all_parsers(child)


def test_every_command_is_covered():
    names = {" ".join(p) for p, _ in _commands(build_parser())}
    assert {"projects", "log", "tables", "gc", "plan", "demo", "bench"} <= names
    assert {f"import {f}" for f in ("webdataset", "mds", "lerobot", "hf")} <= names


@pytest.mark.parametrize("path", [p for p, _ in _commands(build_parser())], ids=" ".join)
def test_global_options_before_or_after_every_command(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text('[storage]\na = "from-file"\nallow_http = true\n')
    parser = build_parser()
    leaf = dict(_commands(parser))[path]
    req = _required(leaf)

    before = cliargs.resolve(parser.parse_args([*GLOBALS_BEFORE, *path, *req]))
    assert before.root == "/r/before" and before.storage_options == {"a": "1"}
    assert before.quiet and not before.json

    after = cliargs.resolve(parser.parse_args([*path, *req, *GLOBALS_AFTER]))
    assert after.root == "/r/after" and after.json and not after.quiet
    assert after.storage_options == {"a": "from-file", "allow_http": True, "b": "2"}

    both = cliargs.resolve(parser.parse_args([*GLOBALS_BEFORE, *path, *req, *GLOBALS_AFTER]))
    assert both.root == "/r/after"  # the one after the command wins
    assert both.storage_options == {"a": "1", "allow_http": True, "b": "2"}  # flags beat the file
    assert both.quiet and both.json


def test_every_option_and_argument_has_help():
    missing = []
    for parser in _all_parsers(build_parser()):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{parser.prog}: {a.option_strings or a.dest}")
    assert missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--older-than-hours", "-1"],
        ["gc", "--older-than-hours", "nan"],
        ["log", "p", "--limit", "0"],
        ["demo", "--steps", "0"],
        ["demo", "--checkpoint-every", "0"],
        ["import", "lerobot", "x", "--project", "p", "--table", "t", "--tolerance-s", "-1"],
        ["bench", "--runs", "0"],
        ["plan", "r.toml", "--world-size", "0"],
        ["projects", "--storage-option", "no-equals-sign"],
        ["nosuchcommand"],
    ],
)
def test_out_of_range_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: treadle" in err and "error:" in err
    assert "no-equals-sign" not in err  # a malformed option is not echoed (it may be a secret)


def test_version_and_exit_codes_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"treadle {version('treadle')}"
    for argv in (["--help"], ["gc", "--help"], ["import", "webdataset", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "exit codes:" in out and "1  user error" in out and "2  usage error" in out


def test_one_version_string(capsys):
    """pyproject.toml's version, read once (``treadle.__version__``); ``--version`` prints it."""
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"treadle {td.__version__}"
    src = Path(__file__).resolve().parents[1] / "src" / "treadle"
    readers = sorted(
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if re.search(r"\bversion\(\s*[\"']treadle[\"']\s*\)", p.read_text())
    )
    assert readers == ["__init__.py"]
    written = [p.name for p in src.rglob("*.py") if f'"{version("treadle")}"' in p.read_text()]
    assert written == []


def test_a_missing_dependency_names_its_command_and_hides_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if the demo's progress bar were missing
    monkeypatch.delitem(sys.modules, "treadle.demo", raising=False)  # so it is imported again
    commands = {" ".join(p) for p, _ in _commands(build_parser())}
    assert {"bench", "demo", "import hf", "plan", "projects", "stats"} <= commands
    assert main(["--root", str(tmp_path), "projects"]) == 0
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "demo", "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("treadle: error: treadle demo needs the package 'tqdm', which is not ")
    assert err.count("\n") == 1


def test_bad_config_file_is_a_user_error(local_root, tmp_path, capsys):
    assert main(["projects", "--root", local_root, "--config", str(tmp_path / "no.toml")]) == 1
    assert "config file" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[storages]\nx = "1"\n')
    assert main(["projects", "--root", local_root, "--config", str(bad)]) == 1
    assert "unknown key 'storages'" in capsys.readouterr().err


# -- storage options reach the object store -------------------------------------------------


@pytest.fixture
def s3_project(s3_root):
    url, opts = s3_root
    td.Client(url, storage_options=opts).project("robots").branch().table("grasps").append(
        {"x": np.arange(7)}
    )
    return url, opts


@pytest.mark.s3
def test_storage_options_on_the_command_line_reach_s3(s3_project, capsys, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(var, raising=False)
    url, opts = s3_project
    flags = [x for k, v in opts.items() for x in ("--storage-option", f"{k}={v}")]
    assert main(["tables", "robots", "--root", url, *flags]) == 0
    assert "7 moments" in capsys.readouterr().out
    assert main([*flags[:4], "--root", url, "tables", "robots", *flags[4:]]) == 0  # split
    assert "7 moments" in capsys.readouterr().out


@pytest.mark.s3
def test_config_file_reaches_s3(s3_project, tmp_path, capsys, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    url, opts = s3_project
    cfg = tmp_path / "s3.toml"
    lines = [f'{k} = "{v}"' for k, v in opts.items() if k != "allow_http"]
    cfg.write_text(f'root = "{url}"\n[storage]\n' + "\n".join(lines) + "\nallow_http = true\n")
    assert main(["log", "robots", "--config", str(cfg)]) == 0
    assert "append to grasps" in capsys.readouterr().out


@pytest.mark.s3
def test_an_http_endpoint_without_allow_http_says_to_set_it(s3_project, capsys, monkeypatch):
    # before: StorageError "list s3://.../refs/main/ failed: GenericError: Generic S3 error:
    # Error performing list request: Error performing GET http://127.0.0.1:.../treadle?...
    # - HTTP error: builder error", nothing about allow_http
    for var in ("AWS_ALLOW_HTTP", "AWS_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    url, opts = s3_project
    plain = {k: v for k, v in opts.items() if k != "allow_http"}
    with pytest.raises(td.StorageError, match=r"allow_http=true.*--storage-option allow_http"):
        td.Client(url, storage_options=plain).project("robots", create=False).branch().tables()
    flags = [x for k, v in plain.items() for x in ("--storage-option", f"{k}={v}")]
    assert main(["tables", "robots", "--root", url, *flags]) == 1
    err = capsys.readouterr().err
    assert "allow_http=true" in err and "builder error" not in err
    assert opts["aws_secret_access_key"] not in err
    assert (
        main(["tables", "robots", "--root", url, *flags, "--storage-option", "allow_http=1"]) == 0
    )


@pytest.mark.s3
def test_environment_reaches_s3_allow_http_included(s3_project, capsys, monkeypatch):
    url, opts = s3_project
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", opts["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", opts["aws_secret_access_key"])
    monkeypatch.setenv("AWS_ENDPOINT", opts["aws_endpoint"])
    monkeypatch.setenv("AWS_REGION", opts["aws_region"])
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    assert main(["--root", url, "tables", "robots"]) == 0
    captured = capsys.readouterr()
    assert "7 moments" in captured.out, captured.err


# -- progress off a terminal ----------------------------------------------------------------


def test_import_output_off_a_terminal_has_no_carriage_returns(tmp_path, local_root, capsys):
    pattern = make_wds(tmp_path / "wds", n=12, per_shard=6)
    argv = ["import", "webdataset", pattern, "--project", "p", "--table", "t"]
    assert main([*argv, "--root", local_root]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert json.loads(out.strip().splitlines()[-1])["rows"] == 12


# -- no silent creation on read -------------------------------------------------------------


def test_project_typo_is_not_found_with_a_suggestion(local_root, capsys):
    client = td.Client(local_root)
    client.project("robotics").branch().table("t").append({"x": [1]})
    typo = client.project("robotcs")  # a handle: nothing is written yet
    for read in (
        lambda: typo.branch().log(),
        lambda: typo.branch().tables(),
        lambda: typo.branch().table("t").num_moments,
        lambda: typo.branch().table("t").to_arrow(),
        lambda: typo.branch("dev"),
        lambda: client.project("robotcs", create=False),
    ):
        with pytest.raises(
            td.NotFound, match="project 'robotcs' not found.*did you mean 'robotics'"
        ):
            read()
    assert client.projects() == ["robotics"]  # reading created nothing
    assert main(["--root", local_root, "log", "robotcs"]) == 1
    assert "did you mean 'robotics'?" in capsys.readouterr().err
    # the first write creates it
    typo.branch().table("t").append({"x": [1, 2]})
    assert (
        client.projects() == ["robotcs", "robotics"] and typo.branch().table("t").num_moments == 2
    )


def test_table_typo_is_not_found_with_a_suggestion(local_root, capsys):
    # before: the list of tables only, where a project typo said "did you mean"
    main_branch = td.Client(local_root).project("robotics").branch()
    main_branch.table("failed_grasps").append({"x": [1]})
    main_branch.table("nominal_grasps").append({"x": [1]})
    with pytest.raises(td.NotFound, match="did you mean 'failed_grasps'\\?; tables: \\["):
        main_branch.table("faild_grasps").pin()
    assert main(["--root", local_root, "stats", "robotics", "nominal_grasp"]) == 1
    assert "did you mean 'nominal_grasps'?" in capsys.readouterr().err
    with pytest.raises(td.NotFound) as far:
        main_branch.table("zzz").pin()
    assert "did you mean" not in str(far.value) and "tables: ['failed_grasps'" in str(far.value)


def test_a_folder_that_is_not_a_store_is_refused_on_first_write(tmp_path, capsys):
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    client = td.Client(str(other))
    assert main(["--root", str(other), "projects"]) == 1
    assert "not a treadle store" in capsys.readouterr().err
    with pytest.raises(td.StorageError, match="not a treadle store.*'notes.txt'"):
        client.project("p").branch().table("t").append({"x": [1]})
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]  # nothing written
    # an empty folder is fine, and gets the marker
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--root", str(empty), "projects"]) == 0
    assert "no projects" in capsys.readouterr().out
    td.Client(str(empty)).project("p").branch().table("t").append({"x": [1]})
    assert sorted(p.name for p in empty.iterdir()) == ["projects", "treadle.json"]


def test_a_store_written_before_the_marker_keeps_working(local_root):
    td.Client(local_root).project("p").branch().table("t").append({"x": [1]})
    (Path(local_root) / "treadle.json").unlink()  # as a store from before the marker
    client = td.Client(local_root)
    assert client.project("p").branch().table("t").num_moments == 1
    client.project("p").branch().table("t").append({"x": [2]})
    assert client.project("q").branch().table("u").append({"y": [1]})
    assert (Path(local_root) / "treadle.json").is_file()
    assert client.projects() == ["p", "q"]


# -- bench writes where it is told ----------------------------------------------------------


class _FakeSuite:
    """Stands in for bench/suite.py: records what ``treadle bench`` hands it."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self.data: str | None = None

    def main(self, argv: list[str]) -> int:
        import os

        self.argv, self.data = argv, os.environ.get("TREADLE_BENCH_DATA")
        return 0


def test_bench_writes_under_its_dir_never_the_checkout(tmp_path, monkeypatch, capsys):
    checkout = Path(__file__).resolve().parents[1]
    fake = _FakeSuite()
    monkeypatch.setitem(sys.modules, "suite", fake)
    monkeypatch.setenv("TREADLE_BENCH_DATA", "")  # restored (unset) after the test
    monkeypatch.delenv("TREADLE_BENCH_DATA")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its folder: not left in /tmp
    monkeypatch.setattr(cmd_bench, "missing_peers", lambda: [("spdl", "spdl", "SPDL")])
    assert main(["bench", "--tiny", "--cases", "plan"]) == 0
    assert "not installed: SPDL (spdl)" in capsys.readouterr().err  # said before the suite ran
    out = Path(fake.argv[fake.argv.index("--out") + 1])
    assert checkout not in out.parents and checkout not in Path(fake.data).parents
    assert out.parent == Path(fake.data).parent  # one temporary folder for both
    assert main(["bench", "--dir", str(tmp_path / "b")]) == 0
    assert fake.argv[-2:] == ["--out", str(tmp_path / "b" / "results")]
    assert fake.data == str(tmp_path / "b" / "data")


def test_gc_json(local_root, capsys):
    td.Client(local_root).project("p").branch().table("t").append({"x": [1, 2]})
    assert main(["gc", "p", "--json", "--root", local_root]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["project"] == "p" and out["kept_versions"] == 1 and out["removed_versions"] == 0


def test_missing_s3_credentials_name_the_flag_to_pass(local_root, monkeypatch, capsys):
    # before: the command line said "pass storage_options={...}", a Python argument; for an
    # import's source it needs --source-option, for the store --storage-option
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    assert main(["--root", "s3://bucket/store", "projects"]) == 1
    err = capsys.readouterr().err
    assert "no credentials for 's3://bucket/store'" in err
    assert "--storage-option aws_access_key_id=" in err and "--source-option" not in err
    argv = ["import", "webdataset", "s3://bucket/shards/a.tar", "--project", "p", "--table", "t"]
    assert main([*argv, "--root", local_root]) == 1
    err = capsys.readouterr().err
    assert "no credentials for 's3://bucket/shards'" in err
    assert "--source-option aws_access_key_id=" in err and "--storage-option" not in err
    with pytest.raises(td.CredentialsError, match=r"storage_options=\{'aws_access_key_id'"):
        td.Client("s3://bucket/store")


def test_an_unknown_window_key_in_a_recipe_lists_the_known_and_the_closest(tmp_path, capsys):
    """``offset = [0]`` in a TOML recipe's window said "has unknown key 'offset'" and no more:
    now it suggests 'offsets' and lists every key a window takes (and likewise for a
    component's and the recipe's keys)."""
    root = str(tmp_path / "root")
    arm = td.Client(root, create=True).project("robotics").branch().table("arm")
    arm.append_episode({"action": np.zeros((9, 7), np.float32)}, episode="e0")
    recipe = tmp_path / "r.toml"
    head = 'project = "robotics"\nseed = 1\nbatch_size = 2\n[[components]]\ntable = "arm"\n'
    recipe.write_text(head + '[components.windows.action]\nkind = "rows"\noffset = [0]\n')
    assert main(["plan", str(recipe), "--root", root]) == 1
    err = capsys.readouterr().err
    assert "window 'action' has unknown key 'offset'; did you mean 'offsets'?" in err
    assert "(known: ['dtype', 'kind', 'layout', 'mean', 'offsets', " in err
    recipe.write_text(head.replace("table =", "tabel = ") + 'table = "arm"\n')
    assert main(["plan", str(recipe), "--root", root]) == 1
    assert "unknown key 'tabel'; did you mean 'table'? (known: [" in capsys.readouterr().err

"""``treadle ui`` and ``treadle show`` say what they do (issue 49): ``--port 0`` prints
the port bound, a busy port is one line and exit 1, the printed URL carries the token
percent-encoded, the token cookie is named per port and found among other apps' cookies,
a token-protected viewer answers any ``Host``, its 401 page is styled, and ``show --out``
to a missing folder is one line. One real ``treadle ui`` process with a token."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import quote, urlsplit

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("starlette")

import treadle as td  # noqa: E402
from test_ui_hostile import ask, start_viewer  # noqa: E402
from treadle.cli import main  # noqa: E402

TOKEN = "a+b&c#d e"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("uicli") / "store")
    client = td.Client(path, create=True)
    branch = client.project("tiny").branch()
    branch.table("t").append_episode({"x": np.arange(4, dtype=np.float32)}, episode="e0")
    plan = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"))]).plan()
    row = pa.table({"run_id": [plan.run_id], "record": [plan.record.to_json()]})
    branch.table("runs").append(row)
    return path, plan.run_id


@pytest.fixture(scope="module")
def gated(root):
    proc, url = start_viewer(root[0], "--token", TOKEN)
    yield proc, url
    proc.terminate()
    proc.wait(10)


def test_the_printed_url_has_the_real_port_and_an_encoded_token(gated):
    _, url = gated
    parts = urlsplit(url)
    assert parts.port and parts.port != 0 and parts.query == "token=a%2Bb%26c%23d%20e"
    status, headers, _ = ask(url, f"/?{parts.query}")
    assert status == 200, status  # the printed URL opens
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"treadle_token_{parts.port}=") and "HttpOnly" in cookie
    for wrong in ("a+b", "a+b&c", quote("a b&c#d e", safe="")):  # the unencoded URL's reads
        assert ask(url, "/?token=" + wrong)[0] == 401


def test_the_cookie_is_per_port_and_parsed_leniently(gated):
    _, url = gated
    port = urlsplit(url).port
    status, headers, _ = ask(url, f"/?token={quote(TOKEN, safe='')}")
    value = headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
    others = 'prefs={"theme": "dark", "ids": [1, 2]}; session="x y"'
    jar = f"{others}; treadle_token_{port}={value}; other=1"
    assert ask(url, "/p/tiny", headers={"Cookie": jar})[0] == 200
    assert ask(url, "/p/tiny", headers={"Cookie": f"treadle_token_{port + 1}={value}"})[0] == 401
    assert ask(url, "/p/tiny", headers={"Cookie": f"treadle_token={value}"})[0] == 401


def test_a_token_protected_viewer_answers_any_host(gated):
    _, url = gated
    query = f"token={quote(TOKEN, safe='')}"
    assert ask(url, f"/p/tiny?{query}", host="viewer.example.org:443")[0] == 200
    assert ask(url, "/p/tiny", host="viewer.example.org")[0] == 401


def test_the_401_page_is_styled(gated):
    _, url = gated
    status, _, body = ask(url, "/p/tiny")
    assert status == 401 and b"/static/viewer.css" in body
    assert ask(url, "/static/viewer.css")[0] == 200 and ask(url, "/favicon.ico")[0] == 200
    assert ask(url, "/static/viewer.js")[0] == 401


def test_a_busy_port_is_one_line_and_exit_1(gated, root):
    _, url = gated
    port = str(urlsplit(url).port)
    cmd = [
        sys.executable,
        "-m",
        "treadle.cli",
        "ui",
        "--no-open",
        "--port",
        port,
        "--root",
        root[0],
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert done.returncode == 1 and "serving" not in done.stdout, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and port in lines[0] and "in use" in lines[0], done.stderr


def test_show_out_to_a_missing_folder_is_one_line(root, capsys):
    out = "/nonexistent-treadle-folder/x.html"
    args = ["show", root[1], "--step", "1", "--out", out, "--root", root[0]]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/nonexistent-treadle-folder" in err[0] and "Traceback" not in err[0]


def test_show_takes_the_short_run_id_that_log_prints(root, tmp_path, capsys):
    # before: `treadle log` names a checkpoint's run by 8 hex digits ("checkpoint run
    # e70b8ec5 step 194"); `treadle show e70b8ec5 ...` said "is not a run id (16 hex digits)"
    path, run_id = root
    out = str(tmp_path / "s.html")
    assert main(["show", run_id[:8], "--step", "1", "--out", out, "--root", path]) == 0
    assert f"run {run_id} step 1" in capsys.readouterr().out and os.path.getsize(out) > 0
    other = "0" * 8 if not run_id.startswith("0" * 8) else "f" * 8
    assert main(["show", other, "--step", "1", "--json", "--root", path]) == 1
    err = capsys.readouterr().err
    assert f"no run {other}" in err or f"run {other!r} is not" in err
    assert main(["show", "xyz", "--step", "1", "--json", "--root", path]) == 1
    assert "unique prefix" in capsys.readouterr().err

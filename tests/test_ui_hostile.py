"""The viewer under attack (issue 49): one real ``treadle ui`` process (``--port 0``,
``--allow-host viewer.test``, no token) over a store built to break it, asked over raw
HTTP (any ``Host``, ``Origin`` and ``Sec-Fetch-Site``) and through Debian's Chromium.

DNS rebinding (Host names), no write on any GET (not even for a table version no commit
names, nor for a table whose episode index was never stored), statistics by a same-origin
POST only, runs scoped to their project, NaN and inf as strict JSON, tables that only look
like run records, oversized numbers, and every episode name the write API accepts."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

pytest.importorskip("starlette")

from treadle.cli import main  # noqa: E402
from ui_helpers import ODD_NAMES, make_hostile_store  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
T = "/p/odd/t/cams/v/7"


def episode_url(name: str, suffix: str = "") -> str:
    """Where docs/viewer.md says an episode opens: its name percent-quoted in the path, or
    as ``?name=`` when it holds a ``/``."""
    if "/" in name:
        return f"{T}/episode{suffix}?name={quote(name, safe='')}"
    return f"{T}/e/{quote(name, safe='')}{suffix}"


def start_viewer(root: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """``treadle ui`` on a free port; the process and the URL it printed (read once it
    answers)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "treadle.cli", "ui", "--no-open", "--port", "0",
           "--root", root, *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    line = proc.stdout.readline()
    found = re.search(r"http://\S+", line)
    if not found:
        proc.kill()
        raise AssertionError(f"treadle ui printed {line!r}; stderr {proc.stderr.read()!r}")
    return proc, found.group(0)


def ask(base: str, path: str, *, method: str = "GET", host: str | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One raw HTTP request (``host``: the ``Host`` header to send)."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    for _ in range(100):  # a server that printed its URL before it listened: wait for it
        try:
            conn.connect()
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", u.netloc if host is None else host)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_hostile_store(str(tmp_path_factory.mktemp("hostile") / "store"))


@pytest.fixture(scope="module")
def viewer(store):
    proc, url = start_viewer(store.client.root, "--allow-host", "viewer.test")
    yield url.rstrip("/")
    proc.terminate()
    proc.wait(10)


@pytest.mark.parametrize(
    ("header", "loopback"),
    [("127.0.0.1:8765", True), ("LOCALHOST:9", True), ("[::1]:1", True), ("[::1]", True),
     ("localhost.", False), ("127.0.0.1.nip.io", False), ("", False), ("[::1]evil.com", False),
     ("[::1]:80evil", False), ("[::1", False), ("127.0.0.1:1:2", False),
     ("127.0.0.1@evil.com", False), ("[::ffff:127.0.0.1]", False)],
)  # fmt: skip
def test_host_names_that_only_look_loopback_are_not(header, loopback):
    from treadle.ui.gates import LOOPBACK, host_name

    assert (host_name(header) in LOOPBACK) is loopback


def test_port_0_prints_the_port_it_bound(viewer):
    assert not viewer.endswith(":0") and ask(viewer, "/")[0] == 200


def test_no_get_writes_anything(store, viewer):
    files = lambda: sorted(store.client.store.list(""))  # noqa: E731
    for key in store.client.store.list("projects/odd/episodes/"):
        store.client.store.delete(key)  # as a table written before treadle stored them
    before = files()
    run = store.plan.run_id
    pages = ["/", "/p/odd", "/p/odd/t/cams/v/7", T + "/episodes.json", "/p/big",
             episode_url("plain"), "/p/odd/runs", f"/p/odd/runs/{run}",
             f"/p/odd/runs/{run}/steps/2", f"/p/odd/runs/{run}/steps/2/samples", "/p/big/runs",
             f"/p/odd/runs/{run}/steps/2/samples/1"]  # fmt: skip
    unnamed = [f"/p/odd/t/cams/v/{v}{tail}" for v in (2, 5)  # steps of one append_episode
               for tail in ["", "/episodes.json", "/e/plain"]]  # fmt: skip
    got = {path: ask(viewer, path) for path in pages + unnamed}
    assert files() == before  # first: what a GET wrote
    for path in pages:
        assert got[path][0] == 200, path
    for path in unnamed:  # no commit names them
        assert got[path][0] == 404 and b"no commit" in got[path][2], (path, got[path][0])
    assert ask(viewer, T + "/stats.json")[0] == 404  # statistics: a POST only
    assert ask(viewer, T + "/stats")[0] == 405
    assert files() == before


def test_statistics_are_a_same_origin_post(store, viewer):
    port = urlsplit(viewer).port
    before = sorted(store.client.store.list(""))
    for headers in [{"Origin": "http://attacker.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "null"}, {"Origin": f"http://localhost:{port + 1}"}]:  # fmt: skip
        status, _, body = ask(viewer, T + "/stats", method="POST", headers=headers)
        assert status == 403 and b"viewer" in body, headers
    assert sorted(store.client.store.list("")) == before
    own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    status, _, body = ask(viewer, T + "/stats", method="POST", headers=own)
    assert status == 200 and set(json.loads(body)) >= {"x"}
    status, _, body = ask(viewer, T + "/stats", method="POST")  # curl: neither header
    stats = json.loads(body, parse_constant=_no_constant)  # strict JSON: NaN would raise
    assert status == 200 and stats["x"]["count"] is not None


def _no_constant(name: str):
    raise AssertionError(f"{name} is not JSON")


def test_nan_and_inf_are_null_in_strict_json(viewer):
    path = episode_url("plain", "/data.json")
    status, _, body = ask(viewer, path)
    data = json.loads(body, parse_constant=_no_constant)
    assert status == 200 and data["nonfinite"] == {"x": 2}
    assert data["series"]["x"][0][:6] == [40.0, 41.0, None, 43.0, 44.0, None]


def test_a_run_opens_only_under_its_project(store, viewer):
    run = store.plan.run_id
    assert ask(viewer, f"/p/odd/runs/{run}")[0] == 200
    for other in ("big", "nope"):
        for tail in ["", "/steps/0", "/composition.json"]:
            assert ask(viewer, f"/p/{other}/runs/{run}{tail}")[0] == 404, (other, tail)


def test_the_run_page_checks_the_world_size_as_the_step_page(store, viewer):
    run = store.plan.run_id
    for ws in ("-1", "0", "3", "9" * 5000):
        status, _, body = ask(viewer, f"/p/odd/runs/{run}?world_size={ws}")
        step, _, _ = ask(viewer, f"/p/odd/runs/{run}/steps/0?world_size={ws}")
        assert status == step == 400, (ws, status, step)
    assert ask(viewer, f"/p/odd/runs/{run}?world_size=2")[0] == 200


def test_tables_that_only_look_like_run_records_are_named(store, viewer, capsys):
    for project, table in (("odd", "looks_like_runs"), ("big", "deep")):
        status, _, body = ask(viewer, f"/p/{project}/runs")
        assert status == 200 and table.encode() in body.split(b'id="skipped"', 1)[1], project
    assert store.plan.run_id.encode() in ask(viewer, "/p/odd/runs")[2]
    args = ["show", store.plan.run_id, "--step", "1", "--json", "--root", store.client.root]
    assert main(args) == 0  # no --project: every project is searched
    assert json.loads(capsys.readouterr().out)["run_id"] == store.plan.run_id


def test_oversized_numbers_are_404_or_400(store, viewer):
    run = store.plan.run_id
    for path, want in [("/p/odd/t/cams/v/99999999999999999999", 404),
                       ("/p/odd/t/cams/v/" + "9" * 5000, 404),
                       (f"/p/odd/runs/{run}/steps/" + "9" * 5000, 404),
                       (f"/p/odd/runs/{run}/steps/99999999999999999999", 404),
                       (f"/p/odd/runs/{run}/steps/1?rank=" + "9" * 5000, 400),
                       (T + "/episodes.json?offset=" + "9" * 5000, 400),
                       (T + "/e/plain/frame/cam/" + "9" * 5000 + ".png", 404),
                       (f"/p/odd/runs/{run}/composition.json?start=" + "9" * 30, 400)]:  # fmt: skip
        assert ask(viewer, path)[0] == want, path


def test_every_episode_name_opens(store, viewer):
    listed = json.loads(ask(viewer, T + "/episodes.json")[2])["episodes"]
    assert [e["name"] for e in listed] == ODD_NAMES
    assert [e["href"] for e in listed] == [episode_url(n) for n in ODD_NAMES]
    for e in listed:
        status, _, body = ask(viewer, e["href"])
        assert status == 200 and b'id="episode"' in body, e
        base = re.search(rb'data-base="([^"]+)" data-query="([^"]*)"', body)
        data = ask(viewer, (base[1] + b"/data.json" + base[2]).decode().replace("&amp;", "&"))
        assert data[0] == 200 and json.loads(data[2])["frames"] == 8, e
    status, _, body = ask(viewer, T + "/e/nope%20here")
    assert status == 404 and b"nope here" in body


def test_the_episode_list_filters_by_name(viewer):
    page = json.loads(ask(viewer, T + "/episodes.json?filter=UP%200")[2])
    assert page["total"] == 1 and [e["name"] for e in page["episodes"]] == ["pick up 01"]
    page = json.loads(ask(viewer, T + "/episodes.json?offset=3&limit=1")[2])
    assert page["total"] == 5 and [e["name"] for e in page["episodes"]] == ["run/7"]


def test_named_versions_read_commits_only_until_found(store):
    from treadle.errors import NotFound
    from treadle.ui.readonly import NamedVersions

    named = NamedVersions(store.client)
    named.check("odd", "cams", 7)  # the head names it: one commit read
    assert len(named._walked["odd"]) == 1
    named.check("odd", "cams", 1)
    with pytest.raises(NotFound, match="v2: no commit of project 'odd' names this version"):
        named.check("odd", "cams", 2)
    assert len(named._walked["odd"]) == len(store.client.project("odd").branch().log())


def test_the_commit_log_has_a_pager(store):
    from treadle.ui.browse import project_page
    from treadle.ui.readonly import ViewerClient

    log = store.client.project("odd").branch().log()
    html = project_page(ViewerClient(store.client), "odd", limit=3, offset=3)
    rows = html.split('id="log"', 1)[1]
    assert [c.short_id for c in log[3:6]] == re.findall(r"/c/[0-9a-f]+\">([0-9a-f]+)<", rows)
    pager = html.split('id="log-pager"', 1)[1].split("</p>", 1)[0]
    assert "commits 4–6" in pager and "newer" in pager and "offset=6" in pager


def test_frame_numbers_out_of_range_are_clamped(viewer):
    for asked, shown in (("99999", "7"), ("-5", "0")):
        body = ask(viewer, T + f"/e/plain?frame={asked}")[2]
        assert f'data-frame="{shown}"'.encode() in body, asked


@pytest.fixture(scope="module")
def browser(viewer):
    if not CHROMIUM.exists():
        why = "Debian's chromium is not installed (scripts/test.sh installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


@pytest.mark.slow
def test_in_the_browser_names_gaps_stats_and_bounded_steps(store, viewer, page):
    page.goto(viewer + T)
    page.wait_for_selector("#episode-list")
    page.fill("#episode-filter", "caf")
    page.dispatch_event("#episode-filter", "change")
    page.wait_for_function("document.querySelectorAll('#episode-list tbody tr').length === 1")
    assert page.inner_text("#episode-list tbody").split("\t")[1] == "café"
    page.fill("#episode-filter", "")
    page.dispatch_event("#episode-filter", "change")
    page.wait_for_function("document.querySelectorAll('#episode-list tbody tr').length === 5")
    page.fill("#episode-jump", "4")  # go to the 4th episode: the page starts there
    page.dispatch_event("#episode-jump", "change")
    page.wait_for_function("document.querySelectorAll('#episode-list tbody tr').length === 2")
    assert "episodes 4–5 of 5" in page.inner_text("#episode-pager")
    page.click("#episode-list a:text('run/7')")  # a name with '/' opens (as ?name=)
    page.wait_for_selector("canvas.plot[data-column='x']")
    assert page.locator("#episode").get_attribute("data-frames") == "8"
    page.go_back()
    page.click("#compute-stats")  # the POST, from the viewer's own page
    page.wait_for_selector("#stats-result")
    assert "x" in page.locator("#stats-result tbody").inner_text()
    page.goto(viewer + T + "/e/plain?frame=99999")
    page.wait_for_selector("figcaption.nonfinite")
    assert "2 NaN or infinite values, drawn as gaps" in page.inner_text("#plots")
    page.goto(f"{viewer}/p/odd/runs/{store.plan.run_id}/steps/4?rank=1&world_size=2")
    page.wait_for_selector("#samples")
    n = len(store.plan.batch(4, 1, 2))
    assert page.locator("img.anchor").count() == n and page.locator(".strip img").count() == 0
    sizes = page.locator("img.anchor").evaluate_all("a => a.map(i => [i.naturalWidth, i.src])")
    assert all(w <= 128 and s.startswith("data:image/jpeg") for w, s in sizes)
    page.locator("button.more").first.click()
    page.wait_for_selector(".all-frames .strip img")
    assert page.locator(".all-frames .strip img").count() == 4
    hrefs = page.locator("#samples > tbody > tr td:nth-child(4) a").evaluate_all(
        "a => a.map(x => x.href)"
    )
    for href in hrefs:  # every episode link of the step opens, whatever the name
        assert page.goto(href).status == 200, href
        page.wait_for_selector("#episode")
    assert page.errors == []


@pytest.mark.slow
def test_a_row_only_episode_has_no_play_button(viewer, page):
    page.goto(viewer + "/p/odd/t/saved_runs/v/1/e/saved_runs")
    page.wait_for_selector("#scrub")
    assert page.locator("#play").count() == 0 and page.errors == []
    assert page.goto(viewer + "/favicon.ico").status == 200

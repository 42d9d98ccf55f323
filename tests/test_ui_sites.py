"""What another site's page can make the viewer do (an outside review of ``treadle ui``):
link to it or frame it (a page opens), but not load its resources (an ``<img>`` of a frame
tells the other page that a project, table and episode exist, and a step or video costs a
decode), and not POST to it, even from a browser that sends a ``Referer`` and no
``Origin``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # starlette 1.x asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

import treadle as td  # noqa: E402
from treadle.ui.app import create_app  # noqa: E402

LOCAL = "http://127.0.0.1"
E = "/p/w/t/cams/v/1/e/c0"
FRAME = E + "/frame/cam/0.png"
TASKS = ["pick \u202eup the cube", "place it", "wave"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    client = td.Client(str(tmp_path_factory.mktemp("sites") / "store"), create=True)
    frames = np.zeros((4, 32, 32, 3), np.uint8)
    tasks = np.array(TASKS + TASKS[:1], dtype=object)  # 3 distinct values over 4 frames
    client.project("w").branch().table("cams").append_episode(
        {"cam": td.VideoFrames(frames, fps=10), "x": np.arange(4, dtype=np.float32),
         "task": tasks},
        episode="c0",
    )  # fmt: skip
    return client


@pytest.fixture(scope="module")
def http(client):
    return TestClient(create_app(client), base_url=LOCAL)


def fetch(site: str, mode: str, dest: str) -> dict[str, str]:
    return {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}


@pytest.mark.parametrize(
    ("headers", "status"),
    [(fetch("cross-site", "no-cors", "image"), 403),  # <img src=...> on attacker.example
     (fetch("same-site", "no-cors", "image"), 403),  # the same from localhost:3000
     (fetch("cross-site", "cors", "empty"), 403),  # fetch()
     (fetch("cross-site", "navigate", "iframe"), 200),  # an editor's preview pane
     (fetch("cross-site", "navigate", "document"), 200),  # a link followed
     (fetch("same-origin", "no-cors", "image"), 200),  # the viewer's own page
     (fetch("none", "navigate", "document"), 200),  # typed or bookmarked
     ({}, 200)],  # curl, or a browser without fetch metadata
)  # fmt: skip
def test_other_sites_may_link_to_the_viewer_but_not_load_from_it(http, headers, status):
    r = http.get(FRAME, headers=headers)
    assert r.status_code == status, (headers, r.text[:300])
    page = http.get(E, headers=headers)
    assert page.status_code == status, headers


def test_a_form_posted_from_another_site_is_refused(client, http):
    before = sorted(client.store.list(""))
    nav = fetch("cross-site", "navigate", "document")
    assert http.post("/p/w/t/cams/v/1/stats", headers=nav).status_code == 403
    assert sorted(client.store.list("")) == before


def test_a_post_whose_referer_is_another_site_is_refused(client, http):
    before = sorted(client.store.list(""))
    for referer in ["http://attacker.example/page", "http://localhost:3000/", "null"]:
        r = http.post("/p/w/t/cams/v/1/stats", headers={"Referer": referer})
        assert r.status_code == 403 and "Referer" in r.json()["error"], referer
    assert sorted(client.store.list("")) == before
    own = http.post("/p/w/t/cams/v/1/stats", headers={"Referer": f"{LOCAL}/p/w/t/cams/v/1"})
    assert own.status_code == 200 and "x" in own.json()


def test_every_answer_forbids_sniffing(client, http):
    gated = TestClient(create_app(client, "tok"), base_url=LOCAL)
    answers = [http.get(E), http.get(FRAME), http.get("/no/such/page"), http.get("/static/viewer.js"),
               http.get(FRAME, headers=fetch("cross-site", "no-cors", "image")),
               gated.get(E, headers={"Authorization": "Bearer tok"})]  # fmt: skip
    for r in answers:
        assert r.headers["x-content-type-options"] == "nosniff", r.url
        assert r.headers["referrer-policy"] == "same-origin", r.url
    bearer = {"Authorization": "Bearer tok", **fetch("same-site", "no-cors", "image")}
    assert gated.get(FRAME, headers=bearer).status_code == 403


@pytest.mark.parametrize("token", [None, "tok"])
def test_no_websocket_reaches_the_routes(client, token):
    from starlette.websockets import WebSocketDisconnect

    http = TestClient(create_app(client, token), base_url=LOCAL)
    for path in ["/static/viewer.js", E, "/"]:
        with pytest.raises(WebSocketDisconnect) as refused:
            with http.websocket_connect(path, headers={"Host": "attacker.example"}):
                pass
        assert refused.value.code == 1008, path


@pytest.mark.parametrize("value", ["http://devbox.lan", "", " ", "*", "devbox.lan/ui", "a b"])
def test_an_allow_host_that_is_no_host_name_is_refused(client, value):
    from treadle.errors import TreadleError

    with pytest.raises(TreadleError, match="is not a host name"):
        create_app(client, allow_hosts=[value])


def test_allow_host_takes_a_name_with_a_port_or_brackets(client):
    http = TestClient(create_app(client, allow_hosts=["DevBox.lan:8800", "[fd00::1]"]))
    for host, status in [("devbox.lan:1", 200), ("[fd00::1]:8765", 200), ("devbox.lan.", 403),
                         ("", 403), ("http", 403)]:  # fmt: skip
        assert http.get("/", headers={"Host": host}).status_code == status, host


@pytest.mark.slow
def test_text_with_a_right_to_left_override_cannot_reorder_other_text(client):
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_ui_browser import ARGS, CHROMIUM, Server

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    server = Server(create_app(client))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            page.goto(server.url + E)
            page.wait_for_selector("#tasks p.task")
            isolated = page.locator("#tasks bdi").evaluate_all(
                "bs => bs.map(b => [b.textContent, getComputedStyle(b).unicodeBidi])"
            )
            assert isolated == [[t, "isolate"] for t in sorted(TASKS)]
            for sel in [".crumbs a", ".crumbs span"]:
                style = page.locator(sel).last.evaluate("e => getComputedStyle(e).unicodeBidi")
                assert style == "isolate", sel
            browser.close()
    finally:
        server.stop()


def test_every_route_refuses_a_foreign_host_and_answers_a_loopback_one(client):
    """Every route of the app (found by walking it: a route added later is covered), its
    static files, a 404, a 405 and a trailing-slash redirect."""
    from starlette.routing import Mount, Route

    app = create_app(client)
    values = {"project": "w", "table": "cams", "version": "1", "episode": "c0", "column": "cam",
              "frame": "0", "run_id": "0" * 16, "n": "0", "k": "0", "commit": "abcd"}  # fmt: skip
    asks = [("DELETE", "/"), ("GET", "/no/such/page"), ("GET", "/p/w/")]
    for route in app.app.app.routes:  # HostGate(SiteGate(Starlette))
        if isinstance(route, Mount):
            asks.append(("GET", route.path + "/viewer.js"))
            continue
        assert isinstance(route, Route), route
        path = route.path
        for name, value in values.items():
            path = path.replace("{" + name + "}", value)
        assert "{" not in path, route.path
        asks += [(method, path) for method in route.methods]
    http = TestClient(app, base_url=LOCAL, follow_redirects=False)
    for method, path in asks:
        for host in ["attacker.example", "localhost.", "127.0.0.1.nip.io", "[::1]evil"]:
            r = http.request(method, path, headers={"Host": host})
            said = "this viewer answers only" in r.text or method == "HEAD"  # HEAD: no body
            assert r.status_code == 403 and said, (method, path)
        r = http.request(method, path, headers={"Host": "[::1]:8765"})
        assert r.status_code != 403, (method, path, r.text[:300])

"""Cameras stored as their own images in the viewer and ``treadle show`` (issue 44), and
the one-line change summary of each commit (issue 47): a table with a JPEG column and a
16-bit PNG depth column, served over HTTP (Starlette's test client); every frame the
viewer serves is checked against Pillow's decode of the stored bytes."""

from __future__ import annotations

import base64
import html
import io
import re
import warnings

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # starlette 1.x asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

from PIL import Image  # noqa: E402

import treadle as td  # noqa: E402
from treadle.cli import main  # noqa: E402
from treadle.ui.app import create_app  # noqa: E402

LOCAL = "http://127.0.0.1"
FRAMES = 6
WINDOWS = td.Windows({"jpg": td.Video([0, 1]), "depth": td.Video([0], channels=1),
                      "x": td.Rows([0])})  # fmt: skip


def jpeg(i: int) -> bytes:
    a = np.zeros((24, 32, 3), np.uint8)
    a[..., 0], a[..., 2] = 20 * i, 255 - 20 * i
    a[4:12, i : i + 8] = 250
    out = io.BytesIO()
    Image.fromarray(a).save(out, format="JPEG", quality=90)
    return out.getvalue()


def depth(i: int) -> bytes:
    a = (np.arange(24 * 32).reshape(24, 32) * 3 + 1000 + 100 * i).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(a).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Project ``cams``: table ``grasps`` (3 episodes of 6 frames: ``jpg``, ``depth``,
    ``x``) at ``version``, a run of it saved as a record row, a table ``broken`` whose
    second image is a truncated JPEG; then a labelling commit (a column added and an
    episode deleted in one transaction) and a deletion."""
    root = str(tmp_path_factory.mktemp("uiimg") / "store")
    client = td.Client(root, create=True)
    branch = client.project("cams").branch()
    for e in range(3):
        branch.table("grasps").append_episode(
            {"jpg": [jpeg(i + e) for i in range(FRAMES)], "depth": [depth(i) for i in range(FRAMES)],
             "x": np.arange(FRAMES, dtype=np.float32)}, episode=f"ep-{e}", fps=10)  # fmt: skip
    version = branch.table("grasps").pin().version
    recipe = td.Recipe(seed=2, batch_size=4,
                       components=[td.Component(branch.table("grasps"), WINDOWS)])  # fmt: skip
    plan = recipe.plan()
    row = pa.table({"run_id": [plan.run_id], "record": [plan.record.to_json()]})
    branch.table("saved_runs").append(row, message="save a run record")
    cut = jpeg(1)[:-40]  # the header parses; the pixels do not decode
    branch.table("broken").append_episode({"jpg": [jpeg(0), cut]}, episode="b", fps=10)
    with branch.transaction("label grasps") as tx:
        tx.table("grasps").add_column("success", {"ep-0": True, "ep-1": False, "ep-2": True})
        tx.table("grasps").delete_episodes(["ep-2"])
    branch.table("grasps").delete_episodes(["ep-1"], message="drop ep-1")
    http = TestClient(create_app(client), base_url=LOCAL)
    return client, branch, plan, version, http


def _at(store, episode: str = "ep-1") -> str:
    return f"/p/cams/t/grasps/v/{store[3]}/e/{episode}"


def _stored(store, column: str, row: int) -> bytes:
    t = store[0].project("cams").table_at("grasps", store[3])
    return t.take(np.array([row]), [column]).column(column)[0].as_py()


def _png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def test_the_episode_page_shows_each_image_column_as_a_camera(store):
    http = store[4]
    page = http.get(_at(store), params={"frame": 99}).text
    assert 'data-frame="5"' in page  # out of range: the nearest frame
    jpg = re.search(r'<img class="under camera" data-column="jpg" data-stretch="0"[^>]*'
                    r'src="([^"]+)"', page)  # fmt: skip
    assert jpg and jpg.group(1).endswith("/e/ep-1/frame/jpg/5.png")
    assert 'data-column="depth" data-stretch="1"' in page and "5.png?stretch=1" in page
    assert 'id="play"' in page and 'id="next-frame"' in page and 'id="prev-frame"' in page
    data = http.get(_at(store) + "/data.json").json()
    assert data["images"] == {"jpg": "jpeg 32x24", "depth": "png 32x24 16-bit"}
    assert data["videos"] == [] and list(data["series"]) == ["x"]
    table = http.get(f"/p/cams/t/grasps/v/{store[3]}").text
    assert "images (jpeg 32x24)" in table and "images (png 32x24 16-bit)" in table
    head = store[1].log()[-1].id  # the project's first commit has no tables
    commit = http.get(f"/p/cams/c/{store[1].commit_id}").text
    assert "jpg, depth" in commit and head not in commit


def test_the_frame_is_pillows_decode_of_the_stored_bytes(store):
    http = store[4]
    for row, frame in ((6, 0), (11, 5)):  # ep-1 starts at row 6
        got = _png(http.get(f"{_at(store)}/frame/jpg/{frame}.png").content)
        want = np.asarray(Image.open(io.BytesIO(_stored(store, "jpg", row))).convert("RGB"))
        assert got.shape == (24, 32, 3) and np.array_equal(got, want)
        raw = http.get(f"{_at(store)}/frame/depth/{frame}.png").content
        want16 = np.asarray(Image.open(io.BytesIO(_stored(store, "depth", row))))
        assert Image.open(io.BytesIO(raw)).mode == "I;16" and want16.dtype == np.uint16
        assert np.array_equal(_png(raw), want16)  # the values, not a picture of them
        shown = _png(http.get(f"{_at(store)}/frame/depth/{frame}.png?stretch=1").content)
        lo, hi = float(want16.min()), float(want16.max())
        assert np.array_equal(shown, np.floor((want16 - lo) * 255 / (hi - lo) + 0.5))
        assert shown.min() == 0 and shown.max() == 255


def test_frame_requests_are_bounded_and_named(store, monkeypatch):
    http = store[4]
    bad = [("frame/jpg/6.png", 404, "frames 0..5, not frame 6"),
           ("frame/x/0.png", 404, "no video or image column 'x'"),
           ("frame/nope/0.png", 404, "no video or image column 'nope'"),
           (f"frame/jpg/{10**20}.png", 404, "not a number")]  # fmt: skip
    for path, status, said in bad:
        r = http.get(f"{_at(store)}/{path}")
        assert r.status_code == status and said in html.unescape(r.text), (path, r.text)
    v = store[1].table("broken").pin().version
    r = http.get(f"/p/cams/t/broken/v/{v}/e/b/frame/jpg/1.png")
    said = html.unescape(r.text)
    assert r.status_code == 500 and f"table 'broken' v{v}, column 'jpg', row 1" in said, said
    assert "does not decode" in said
    from treadle.ui import image_frames

    monkeypatch.setattr(image_frames, "MAX_VIEW_PIXELS", 24 * 32 - 1)
    r = http.get(f"{_at(store)}/frame/jpg/0.png")
    assert r.status_code == 500 and "a 32x24 image; the viewer decodes at most 767" in r.text


def test_image_frames_keep_the_host_rule_and_write_nothing(store):
    client, http = store[0], store[4]
    foreign = TestClient(create_app(client), base_url="http://rebind.example")
    assert foreign.get(f"{_at(store)}/frame/jpg/0.png").status_code == 403
    before = sorted(client.store.list(""))
    for path in ["", "/data.json", "/frame/jpg/3.png", "/frame/depth/3.png?stretch=1"]:
        assert http.get(_at(store) + path).status_code == 200, path
    assert http.get(f"/p/cams/t/grasps/v/{store[3]}").status_code == 200
    assert sorted(client.store.list("")) == before


def _strip(page: str, column: str) -> np.ndarray:
    found = re.findall(rf'data-column="{column}" data-t="(\d+)"[^>]*'
                       r'src="data:image/png;base64,([^"]+)"', page)  # fmt: skip
    frames = {int(t): _png(base64.b64decode(b)) for t, b in found}
    return np.stack([frames[t] for t in range(len(frames))])


def test_a_step_shows_the_image_frames_the_loader_delivers(store, tmp_path):
    client, plan, http, step = store[0], store[2], store[4], 3
    (want,) = list(td.TrainLoader.from_state({"record": plan.record.to_dict(), "step": step},
                                             client, steps=step + 1))  # fmt: skip
    at = f"/p/cams/runs/{plan.run_id}/steps/{step}/samples"
    first = http.get(at).text
    for col in ("jpg", "depth"):  # the first screen: one frame per sample and camera
        assert len(re.findall(rf'class="anchor" data-slot="\d+" data-column="{col}"', first)) == 4
    for k in range(len(want["x"])):
        page = http.get(f"{at}/{k}").text
        assert np.array_equal(_strip(page, "jpg"), want["jpg"][k].numpy())
        depth16 = _strip(page, "depth")
        assert depth16.dtype == np.uint16
        assert np.array_equal(depth16, want["depth"][k].numpy()[..., 0])
    out = tmp_path / "step.html"
    assert main(["show", plan.run_id, "--step", str(step), "--root", client.root,
                 "--out", str(out)]) == 0  # fmt: skip
    shown = out.read_text()
    for col in ("jpg", "depth"):
        anchors = re.findall(rf'class="anchor" data-slot="\d+" data-column="{col}" '
                             r'alt="[^"]*" src="data:image/jpeg;base64,([^"]+)"', shown)  # fmt: skip
        assert len(anchors) == 4
        img = Image.open(io.BytesIO(base64.b64decode(anchors[0])))
        assert img.size == (32, 24) and img.mode == ("RGB" if col == "jpg" else "L")


def test_tables_lists_the_image_columns_as_cameras(store, capsys):
    capsys.readouterr()
    assert main(["tables", "cams", "--root", store[0].root, "--at", store[1].log()[3].id]) == 0
    out = capsys.readouterr().out
    assert "jpg [jpeg 32x24]" in out and "depth [png 32x24 16-bit]" in out


def test_columns_whose_writes_recorded_no_sizes_are_cameras_by_their_first_image(
    store, monkeypatch
):
    from treadle.ui import image_frames

    tab = store[0].project("cams").table_at("grasps", store[3])
    recorded = image_frames.image_cameras(tab)
    monkeypatch.setattr(image_frames, "recorded_images", lambda schema: {})
    assert image_frames._find_cameras(tab) == recorded  # the same, read from row 0
    assert [c.label for c in recorded.values()] == ["jpeg 32x24", "png 32x24 16-bit"]


def test_the_log_says_what_each_commit_changed_in_one_line(store):
    log = store[1].log()
    assert log[0].summary == "grasps: delete 1 episode"
    assert log[1].summary == "grasps: add_column success, delete 1 episode"
    assert log[2].summary == "broken: append" and log[-1].summary == ""
    assert "changes='grasps: delete 1 episode'" in repr(log[0])
    assert "changes=" not in repr(log[-1])
    page = store[4].get("/p/cams").text
    rows = page.split('id="log"', 1)[1].split("<tbody>", 1)[1].split("</tr>")
    assert "label grasps" in rows[1] and "grasps: add_column success, delete 1 episode" in rows[1]
    assert "drop ep-1" in rows[0] and "grasps: delete 1 episode" in rows[0]
    assert "<th>changes</th>" in page


def test_treadle_log_prints_the_same_line(store, capsys):
    capsys.readouterr()
    assert main(["log", "cams", "--root", store[0].root, "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.strip() for x in lines[2::3]] == [
        "grasps: delete 1 episode",
        "grasps: add_column success, delete 1 episode",
    ]


def test_a_summary_counts_repeats_and_bounds_the_tables():
    from treadle.catalog.commit import change_summary

    said = change_summary({"t": ("update task", "update task", "rename_columns a->b,c->d",
                                 "drop_columns x,y")})  # fmt: skip
    assert said == "t: update task ×2, rename a->b, c->d, drop x, y"
    many = change_summary({f"t{i:02d}": ("append",) for i in range(11)})
    assert many.startswith("t00: append; t01: append") and many.endswith("; and 3 more tables")


@pytest.mark.slow
def test_in_a_browser_the_cameras_step_and_play_frame_by_frame(store):
    """Chromium: both cameras load, "▶" steps one frame, play runs to the last frame and
    stops, and the pixels the browser shows are Pillow's decode of the stored JPEG."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_ui_browser import ARGS, CHROMIUM, Server

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    server = Server(create_app(store[0]))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            page.goto(server.url + _at(store))
            page.wait_for_function("[...document.querySelectorAll('img.camera')].length === 2 &&"
                                   " [...document.querySelectorAll('img.camera')]"
                                   ".every((i) => i.complete && i.naturalWidth === 32)")  # fmt: skip
            page.wait_for_selector("canvas.plot[data-column='x']")
            page.click("#next-frame")
            jpg = "document.querySelector('img.camera[data-column=jpg]')"
            page.wait_for_function(f"{jpg}.src.endsWith('/frame/jpg/1.png') && {jpg}.complete")
            assert page.inner_text("#cursor-frame") == "1"
            page.click("#play")
            page.wait_for_function("document.getElementById('cursor-frame').textContent === '5'"
                                   " && document.getElementById('play').textContent === 'play'",
                                   timeout=30_000)  # fmt: skip
            page.wait_for_function(f"{jpg}.src.endsWith('/frame/jpg/5.png') && {jpg}.complete")
            rgba = page.evaluate(f"""(() => {{ const img = {jpg}, c = document.createElement('canvas');
                c.width = img.naturalWidth; c.height = img.naturalHeight;
                const g = c.getContext('2d'); g.drawImage(img, 0, 0);
                return Array.from(g.getImageData(0, 0, c.width, c.height).data); }})()""")
            browser.close()
    finally:
        server.stop()
    shown = np.array(rgba, np.uint8).reshape(24, 32, 4)[..., :3]
    want = np.asarray(Image.open(io.BytesIO(_stored(store, "jpg", 11))).convert("RGB"))
    assert np.array_equal(shown, want)

"""The viewer's resource bounds (an outside review of ``treadle ui``): an episode's plots
read a wide column in blocks of rows and carry a bounded number of values (the page says
how many frames it plots, and keeps following the cursor past them); an episode's MP4 is
built once for concurrent requests and refused, naming its size, past the cap; byte
ranges are served without copying the video."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # starlette 1.x asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

import treadle as td  # noqa: E402
from treadle.table.table import Table  # noqa: E402
from treadle.ui import episode  # noqa: E402
from treadle.ui.app import create_app  # noqa: E402

ROWS, DIMS = 3000, 300
LOCAL = "http://127.0.0.1"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Project ``w``: table ``emb`` (one episode of a 300-float embedding, a scalar and a
    text column per row) and table ``cams`` (a video column and a scalar, 8 frames)."""
    client = td.Client(str(tmp_path_factory.mktemp("bounds") / "store"), create=True)
    branch = client.project("w").branch()
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((ROWS, DIMS)).astype(np.float32)
    texts = np.array([f"task {i // 1000}" for i in range(ROWS)], dtype=object)
    branch.table("emb").append_episode(
        {"emb": emb, "t": np.arange(ROWS, dtype=np.float64), "task": texts}, episode="e0"
    )
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    frames[:, 8:16, 8:16] = 200
    x = np.arange(8, dtype=np.float32)
    branch.table("cams").append_episode({"cam": td.VideoFrames(frames, fps=10), "x": x},
                                        episode="c0")  # fmt: skip
    return client, emb


@pytest.fixture(scope="module")
def http(store):
    return TestClient(create_app(store[0]), base_url=LOCAL)


def test_a_wide_column_is_read_in_blocks_of_rows(store, http, monkeypatch):
    _, emb = store
    read = []
    take = Table.take

    def counting_take(self, rows, columns=None):
        out = take(self, rows, columns)
        read.append(out.nbytes)
        return out

    monkeypatch.setattr(Table, "take", counting_take)
    monkeypatch.setattr(episode, "READ_VALUES", 50_000, raising=False)
    data = http.get("/p/w/t/emb/v/1/e/e0/data.json").json()
    assert data["frames"] == data["shown"] == ROWS and data["dims"]["emb"] == DIMS
    assert len(data["series"]["emb"]) == episode.MAX_DIMS
    got = np.array(data["series"]["emb"], np.float64).T
    np.testing.assert_array_equal(got, emb[:, : episode.MAX_DIMS].astype(np.float64))
    assert data["series"]["t"] == [list(map(float, range(ROWS)))]
    assert data["tasks"]["task"] == ["task 0", "task 1", "task 2"]
    # 3000 x 301 values are 3.6 MB; no read holds more than a block of 50,000 values
    assert read and max(read) <= 50_000 * 4 + 64 * 1024, read


def test_many_plotted_values_plot_the_first_rows_and_say_how_many(store, http, monkeypatch):
    monkeypatch.setattr(episode, "MAX_PLOTTED", 17 * 100, raising=False)  # 16 + 1 dims
    data = http.get("/p/w/t/emb/v/1/e/e0/data.json").json()
    assert data["frames"] == ROWS and data["shown"] == 100
    assert [len(s) for s in data["series"]["emb"]] == [100] * episode.MAX_DIMS
    assert len(data["series"]["t"][0]) == 100
    assert data["tasks"]["task"] == ["task 0", "task 1", "task 2"]  # texts: every row


@pytest.mark.slow
def test_past_the_plotted_frames_the_page_says_so_and_follows_the_cursor(store, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_ui_browser import ARGS, CHROMIUM, Server

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    monkeypatch.setattr(episode, "MAX_PLOTTED", 4, raising=False)  # x: 4 of its 8 frames
    monkeypatch.setattr(episode, "MAX_ROWS", 4)  # the same before MAX_PLOTTED existed
    server = Server(create_app(store[0]))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/p/w/t/cams/v/1/e/c0?frame=6")
            page.wait_for_selector("canvas.plot[data-column='x']")
            page.wait_for_function("document.querySelector('img.under').src.endsWith('/6.png')")
            assert "frames 0–3 of 8" in page.inner_text("#plots-shown")
            assert "frames 0–3 only" in page.inner_text("#values")
            page.click("#prev-frame")
            page.wait_for_function("document.querySelector('img.under').src.endsWith('/5.png')")
            page.eval_on_selector(
                "#scrub", "s => { s.value = '2'; s.dispatchEvent(new Event('input')); }"
            )
            page.wait_for_function("document.querySelector('img.under').src.endsWith('/2.png')")
            assert page.inner_text("#values") == "x: [2.000]"
            assert errors == []
            browser.close()
    finally:
        server.stop()

"""The viewer's resource bounds (an outside review of ``treadle ui``): an episode's plots
read a wide column in blocks of rows and carry a bounded number of values (the page says
how many frames it plots, and keeps following the cursor past them); an episode's MP4 is
built once for concurrent requests and refused, naming its size, past the cap; byte
ranges are served without copying the video."""

from __future__ import annotations

import html
import re
import socket
import threading
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # starlette 1.x asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

import treadle as td  # noqa: E402
from treadle.table.table import Table  # noqa: E402
from treadle.ui import app as ui_app  # noqa: E402
from treadle.ui import episode  # noqa: E402
from treadle.ui.app import ByteLRU, create_app  # noqa: E402

ROWS, DIMS = 3000, 300
RECORDS = 2000
LOCAL = "http://127.0.0.1"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Project ``w``: table ``emb`` (one episode of a 300-float embedding, a scalar and a
    text column per row), table ``cams`` (a video column and a scalar, 8 frames) and
    ``checkpoints`` (2000 rows of one run's record)."""
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
    plan = td.Recipe(seed=1, batch_size=8, components=[td.Component(branch.table("cams"))]).plan()
    rows = pa.table({"run_id": [plan.run_id] * RECORDS, "record": [plan.record.to_json()] * RECORDS,
                     "step": list(range(RECORDS))})  # fmt: skip
    branch.table("checkpoints").append(rows)
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


def _ask_at_once(n: int, ask) -> list:
    """``ask(i)`` in ``n`` threads started together; their results (or exceptions)."""
    out: list = [None] * n

    def one(i: int) -> None:
        try:
            out[i] = ask(i)
        except Exception as e:  # noqa: BLE001 (the test reads it)
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _blocking_make(calls: list, running: list, release: threading.Event, want: int):
    """A ``make`` that counts its calls and the most running at once, and waits for
    ``release`` (set once ``want`` calls have started, or after a second: a cache that
    makes a key once never gets there)."""
    lock = threading.Lock()

    def make(value: bytes):
        def run() -> bytes:
            with lock:
                calls.append(value)
                running[0] += 1
                running[1] = max(running[1], running[0])
                if len(calls) >= want:
                    release.set()
            release.wait(1.0)
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return value

        return run

    return make


def test_a_video_asked_for_at_once_is_made_once():
    cache = ByteLRU(1 << 20)
    calls: list = []
    make = _blocking_make(calls, [0, 0], threading.Event(), want=8)
    got = _ask_at_once(8, lambda i: cache.get("video", make(b"mp4")))
    assert got == [b"mp4"] * 8 and len(calls) == 1


def test_at_most_two_videos_are_made_at_a_time():
    cache = ByteLRU(1 << 20)
    calls: list = []
    running = [0, 0]
    make = _blocking_make(calls, running, threading.Event(), want=6)
    got = _ask_at_once(6, lambda i: cache.get(i, make(bytes([i]))))
    assert got == [bytes([i]) for i in range(6)] and len(calls) == 6 and running[1] <= 2


def test_the_cache_counts_its_bytes_and_keeps_the_newest():
    cache = ByteLRU(10)
    for i in range(5):
        cache.get(i, lambda i=i: bytes(4))
    assert list(cache._items) == [3, 4]


def test_a_video_over_the_cap_is_refused_naming_its_size(store):
    http = TestClient(create_app(store[0], video_cache_bytes=100), base_url=LOCAL)
    r = http.get("/p/w/t/cams/v/1/e/c0/video/cam.mp4")
    assert r.status_code == 500, r.status_code
    said = html.unescape(r.text)
    assert "episode 'c0' of table 'cams' v1, column 'cam': its stored video is" in said
    assert "the viewer plays at most 100 per episode" in said
    ok = TestClient(create_app(store[0]), base_url=LOCAL).get("/p/w/t/cams/v/1/e/c0/video/cam.mp4")
    assert ok.status_code == 200 and ok.content[4:8] == b"ftyp"


def test_ranges_of_a_video_are_its_bytes(store, monkeypatch):
    made = []
    to_mp4 = ui_app.media.to_mp4
    monkeypatch.setattr(ui_app.media, "to_mp4", lambda *a: made.append(1) or to_mp4(*a))
    http = TestClient(create_app(store[0]), base_url=LOCAL)
    path = "/p/w/t/cams/v/1/e/c0/video/cam.mp4"
    whole = http.get(path).content
    for rng, want in [("bytes=0-9", whole[:10]), ("bytes=-7", whole[-7:]),
                      ("bytes=5-", whole[5:])]:  # fmt: skip
        r = http.get(path, headers={"Range": rng})
        assert r.status_code == 206 and r.content == want, rng
    assert len(made) == 1


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closes ``conn`` (within a minute) without answering."""
    conn.settimeout(60)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False
    finally:
        conn.close()


@pytest.mark.slow
def test_a_client_slow_to_send_its_headers_is_closed(store):
    from test_ui_hostile import ask, start_viewer
    from treadle.ui.deadline import HEADER_SECONDS

    proc, url = start_viewer(store[0].root)
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        assert ask(url, "/")[0] == 200
        silent = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        kept = socket.create_connection(("127.0.0.1", port))  # keep-alive: a 2nd request late
        kept.sendall(b"GET /favicon.ico HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b"</svg>" not in got:  # the whole first answer
            got += kept.recv(4096)
        assert got.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /favicon.ico HTTP/1.1\r\n")
        assert HEADER_SECONDS < 60
        assert _closed_by_server(silent) and _closed_by_server(slow)
        assert _closed_by_server(kept)
        assert ask(url, "/")[0] == 200  # the server still answers
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_table_of_run_records_is_read_in_blocks(store, http, monkeypatch):
    from treadle.ui import runs

    whole = store[0].project("w").table_at("checkpoints", 1).to_arrow().nbytes
    read = []
    take, to_arrow = Table.take, Table.to_arrow

    def counting(fn):
        def read_rows(self, *args, **kwargs):
            out = fn(self, *args, **kwargs)
            read.append(out.nbytes)
            return out

        return read_rows

    monkeypatch.setattr(Table, "take", counting(take))
    monkeypatch.setattr(Table, "to_arrow", counting(to_arrow))
    monkeypatch.setattr(runs, "RECORD_BYTES", 20_000, raising=False)
    page = http.get("/p/w/runs")
    assert page.status_code == 200 and "1998, 1999" in page.text
    assert whole > 20 * 20_000 and max(read) < whole / 10, (whole, max(read))


@pytest.mark.parametrize(
    ("header", "want"),
    [("bytes=0-9", (0, 10)), ("bytes=-7", (93, 100)), ("bytes=5-", (5, 100)),
     ("BYTES = 1 - 2", (1, 3)), ("bytes=0-999", (0, 100)), ("bytes=1_0-20", None),
     ("bytes=+1-2", None), ("bytes=٣-5", None), ("bytes=-", None), ("bytes=-0", None),
     ("bytes=0-1,2-3", None), ("items=0-1", None), ("bytes=100-", None), ("bytes=5-4", None),
     ("bytes=" + "9" * 5000 + "-", None)],
)  # fmt: skip
def test_a_range_is_one_range_of_decimal_digits(header, want):
    from treadle.ui.media import byte_range

    if want is None:
        with pytest.raises(ValueError):
            byte_range(header, 100)
    else:
        assert byte_range(header, 100) == want


def test_a_step_is_shown_a_page_of_samples_at_a_time(store, http, monkeypatch):
    from treadle.ui import step

    monkeypatch.setattr(step, "PAGE", 3, raising=False)
    plan = td.Plan.from_record(
        td.RunRecord.from_json(store[0].project("w").table_at("checkpoints", 1).take([0])
                               .column("record")[0].as_py()), store[0])  # fmt: skip
    batch = plan.batch(5)
    assert len(batch) == 8
    base = f"/p/w/runs/{plan.run_id}/steps/5"
    seen = []
    for offset, shown in [
        (0, "samples 1–3 of 8"),
        (3, "samples 4–6 of 8"),
        (6, "samples 7–8 of 8"),
    ]:
        page = http.get(base + "/samples", params={"offset": offset} if offset else None).text
        assert shown in page, page[:500]
        rows = page.split("<tbody>", 1)[1].count("<tr>")
        assert rows == min(3, 8 - offset)
        assert ("next samples" in page) == (offset < 6) and ("previous" in page) == (offset > 0)
        seen += [int(m) for m in re.findall(r"<tr><td>(\d+)</td>", page.split("<tbody>", 1)[1])]
    assert seen == list(range(8))  # slots, rank 0 of 1: every sample once
    assert http.get(base + "/samples", params={"offset": 8}).status_code == 404
    assert 'offset=3"' in http.get(base, params={"offset": 3}).text  # the shell loads that page


def test_a_camera_read_without_a_window_is_shown_as_its_frame(store, http):
    """``td.Component(table)`` with no windows reads each camera as the moment's frame,
    ``[H, W, 3]``: an image on the step page, not a line plot of its pixel values."""
    rec = store[0].project("w").table_at("checkpoints", 1).take([0]).column("record")[0]
    plan = td.Plan.from_record(td.RunRecord.from_json(rec.as_py()), store[0])
    page = http.get(f"/p/w/runs/{plan.run_id}/steps/1/samples").text
    cells = page.split("<tbody>", 1)[1].split("<tr>")[1:]
    assert len(cells) == 8
    for cell in cells:
        assert '<img class="anchor"' in cell and 'data-column="cam"' in cell, cell[:400]
        assert "<b>cam</b> <small>" not in cell  # no plot of the pixels
    one = http.get(f"/p/w/runs/{plan.run_id}/steps/1/samples/0").text
    assert one.count('<div class="strip"><img') == 1 and 'data-column="cam"' in one

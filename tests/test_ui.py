"""The viewer's routes over HTTP (Starlette's test client): every page kind, 404 pages
that name the bad name, the token, byte ranges, codec-copy MP4, read-only, `treadle show`."""

from __future__ import annotations

import base64
import io
import json
import re
import warnings

import av
import numpy as np
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # starlette 1.x asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

import treadle as td  # noqa: E402
from treadle.cli import main  # noqa: E402
from treadle.ui.app import create_app  # noqa: E402
from treadle.ui.episode import decode_frame, find_episode  # noqa: E402
from treadle.ui.serve import check_host, viewer_url  # noqa: E402
from treadle.video.nal import iter_length_prefixed, iter_nal_units  # noqa: E402
from ui_helpers import BFRAMES, decode_png, make_project  # noqa: E402

T = "/p/robotics/t/nominal_grasps/v/1"
E = T + "/e/nominal_grasps-0003"
LOCAL = "http://127.0.0.1"


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    return make_project(str(tmp_path_factory.mktemp("ui") / "store"))


@pytest.fixture(scope="module")
def http(proj):
    return TestClient(create_app(proj.client), base_url=LOCAL)


def test_every_page_kind_answers_with_its_content(proj, http):
    run = proj.plan.run_id
    assert "robotics" in http.get("/").text
    log = http.get("/p/robotics").text
    assert log.count("<tr>") >= len(proj.branch.log()) + 1
    assert "save a run record" in log and "saved_runs v" in log
    tags = log.split('id="tags"', 1)[1].split("</table>", 1)[0]
    assert "first-look" in tags and proj.branch.commit_id[:8] in tags
    head = proj.branch.head()
    assert "nominal_grasps" in http.get(f"/p/robotics/c/{head.short_id}").text
    tab = http.get(T).text
    assert "1,008" in tab and "fixed_size_list" in tab and "shape [7]" in tab
    eps = http.get(T + "/episodes.json", params={"offset": 10, "limit": 100}).json()
    assert eps["total"] == 14 and [e["name"] for e in eps["episodes"]] == [
        f"nominal_grasps-{i:04d}" for i in range(10, 14)
    ]
    assert 'data-frames="72"' in http.get(E).text
    data = http.get(E + "/data.json").json()
    assert data["frames"] == 72 and len(data["series"]["action"]) == 7
    runs = http.get("/p/robotics/runs").text
    assert run in runs and proj.saved.run_id in runs
    card = http.get(f"/p/robotics/runs/{run}").text
    assert "share 3/10 = 0.3, exact" in card and "share 7/10 = 0.7, exact" in card
    comp = http.get(f"/p/robotics/runs/{run}/composition.json", params={"count": 5}).json()
    assert comp["counts"] == [proj.plan.counts(s).tolist() for s in range(5)]


def test_a_table_with_no_time_axis_is_one_episode_of_bounded_rows(proj, http, monkeypatch):
    from treadle.ui import episode

    monkeypatch.setattr(episode, "MAX_ROWS", 1)
    data = http.get("/p/robotics/t/saved_runs/v/1/e/saved_runs/data.json").json()
    assert data["frames"] == 1 and data["shown"] == 1
    assert [len(v) for v in data["tasks"]["record"]] == [episode.MAX_TEXT]  # cut, not whole
    cp = http.get("/p/robotics/t/checkpoints/v/1/e/checkpoints/data.json").json()
    assert cp["series"]["step"] == [[7.0]]


def test_bad_names_are_404_pages_that_name_them(http):
    for path, named in [
        ("/p/no-such-project", "no-such-project"),
        ("/p/robotics/t/bad..name/v/1", "bad..name"),
        ("/p/robotics/t/nominal_grasps/v/1/e/nope-7", "nope-7"),
        ("/p/robotics/runs/0123456789abcdef", "0123456789abcdef"),
        ("/p/robotics/runs/zz", "zz"),
        ("/p/..%2F..%2Fetc", "etc"),
        (T + "/e/nominal_grasps-0003/video/action.mp4", "action"),
    ]:
        r = http.get(path)
        assert r.status_code == 404, path
        assert named in r.text, (path, r.text)


def test_the_video_is_the_stored_packets_in_mp4(proj, http):
    whole = http.get(E + "/video/wrist_camera.mp4")
    assert whole.status_code == 200 and whole.headers["accept-ranges"] == "bytes"
    part = http.get(E + "/video/wrist_camera.mp4", headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == whole.content[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(whole.content)}"
    tail = http.get(E + "/video/wrist_camera.mp4", headers={"Range": "bytes=-10"})
    assert tail.content == whole.content[-10:]
    bad = http.get(E + "/video/wrist_camera.mp4", headers={"Range": f"bytes={10**9}-"})
    assert bad.status_code == 416
    tab = proj.branch.table("nominal_grasps").pin()
    _, start, length = find_episode(tab, "nominal_grasps-0003")
    rows = tab.take(np.arange(start, start + length), ["wrist_camera"]).to_pylist()
    key = "projects/robotics/" + rows[0]["wrist_camera"]["stream"]
    raw = proj.client.store.get(key)
    stored = [raw[r["wrist_camera"]["offset"] :][: r["wrist_camera"]["size"]] for r in rows]
    with av.open(io.BytesIO(whole.content)) as f:
        got = [bytes(p) for p in f.demux(video=0) if p.size]
        assert f.streams.video[0].codec_context.width == 64
    assert len(got) == length  # codec copy: each sample holds the stored packet's NAL units
    for g, s in zip(got, stored):
        assert [u for _, u in iter_length_prefixed(g, 4)] == [u for _, u in iter_nal_units(s)]


def test_b_frames_play_in_display_order_at_their_times(proj, http):
    tab = proj.branch.table("bframes").pin()
    decode = tab.take(np.arange(BFRAMES), ["cam"]).column("cam").combine_chunks().field("decode")
    assert decode.to_pylist() != list(range(BFRAMES))  # the fixture has B-frames
    mp4 = http.get("/p/robotics/t/bframes/v/1/e/b0/video/cam.mp4").content
    with av.open(io.BytesIO(mp4)) as f:
        frames = list(f.decode(video=0))
    assert [round(float(x.time) * 24, 6) for x in frames] == list(range(BFRAMES))
    for i, x in enumerate(frames):
        want = decode_frame(proj.client, tab, "cam", 0, BFRAMES, i)
        assert np.array_equal(x.to_ndarray(format="rgb24"), want), i


def test_frame_png_is_treadles_decode(proj, http):
    tab = proj.branch.table("nominal_grasps").pin()
    _, start, length = find_episode(tab, "nominal_grasps-0003")
    want = decode_frame(proj.client, tab, "wrist_camera", start, length, 40)
    got = decode_png(http.get(E + "/frame/wrist_camera/40.png").content)
    assert np.array_equal(got, want) and want.max() > 200  # the yellow square is in it


def test_step_page_lists_plan_batch(proj, http):
    step, rank, world = 10**12, 1, 2
    at = f"/p/robotics/runs/{proj.plan.run_id}/steps/{step}"
    query = {"rank": rank, "world_size": world}
    shell = http.get(at, params=query).text  # the page comes first, its samples load after
    assert "loading…" in shell and f'data-src="{at}/samples?rank=1&amp;world_size=2"' in shell
    page = http.get(at + "/samples", params=query).text
    batch = proj.plan.batch(step, rank, world)
    body = page.split('id="samples"', 1)[1].split("<tbody>", 1)[1]
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>.*?</td><td>(\d+)</td><td>(\d+)</td>", body)
    assert [(int(c), int(m)) for _, c, _, m in rows] == list(zip(batch.component, batch.moment))
    assert page.count('class="anchor" ') == len(batch)  # the first screen: one frame each
    assert page.count('class="more"') == len(batch)  # the rest on demand


def test_a_bad_step_query_is_answered_before_any_read(proj, http):
    r = http.get(
        f"/p/robotics/runs/{proj.plan.run_id}/steps/3", params={"rank": 5, "world_size": 2}
    )
    assert r.status_code == 400 and "rank must be in 0..1, got 5" in r.text


def test_a_token_gates_every_request(proj):
    gated = TestClient(create_app(proj.client, token="s3cret-token"), base_url=LOCAL)
    for path in ["/", "/static/viewer.js", T, E + "/video/wrist_camera.mp4"]:
        assert gated.get(path).status_code == 401, path
        assert gated.get(path, params={"token": "wrong"}).status_code == 401
    first = gated.get("/", params={"token": "s3cret-token"})
    assert first.status_code == 200 and "treadle_token" in first.headers["set-cookie"]
    assert gated.get(T).status_code == 200  # the cookie carries it from here on
    bearer = TestClient(create_app(proj.client, token="s3cret-token"), base_url=LOCAL)
    assert bearer.get(T, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200


def test_local_by_default_and_a_token_for_any_other_host():
    from treadle.cli import build_parser

    ns = build_parser().parse_args(["ui"])
    assert ns.host == "127.0.0.1" and ns.port == 8765 and ns.token is None
    assert check_host("127.0.0.1", None) is None
    made = check_host("0.0.0.0", None)
    assert made and len(made) >= 24 and check_host("0.0.0.0", None) != made
    assert check_host("0.0.0.0", "mine") == "mine"
    assert viewer_url("0.0.0.0", 9, "t") == "http://0.0.0.0:9/?token=t"


def test_browsing_writes_nothing(proj, http):
    store = proj.client.store
    before = sorted(store.list(""))
    run = proj.plan.run_id
    for path in ["/", "/p/robotics", T, T + "/episodes.json", E, E + "/data.json",
                 E + "/video/wrist_camera.mp4", E + "/frame/wrist_camera/3.png",
                 "/p/robotics/runs", f"/p/robotics/runs/{run}",
                 f"/p/robotics/runs/{run}/steps/3", f"/p/robotics/runs/{run}/steps/3/samples"]:  # fmt: skip
        assert http.get(path).status_code == 200, path
    assert sorted(store.list("")) == before


def _strip_pixels(html: str) -> np.ndarray:
    imgs = re.findall(r'data-slot="(\d+)" data-column="wrist_camera" data-t="(\d+)"[^>]*'
                      r'src="data:image/png;base64,([^"]+)"', html)  # fmt: skip
    frames = {int(t): decode_png(base64.b64decode(b)) for _, t, b in imgs}
    return np.stack([frames[t] for t in range(len(frames))])


def _anchors(html: str) -> list[np.ndarray]:
    from PIL import Image

    found = re.findall(r'class="anchor" data-slot="\d+" data-column="wrist_camera"[^>]*'
                       r'src="data:image/jpeg;base64,([^"]+)"', html)  # fmt: skip
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")) for b in found]


def test_show_html_is_bounded_and_each_sample_holds_the_loaders_pixels(proj, http, tmp_path,
                                                                       capsys):  # fmt: skip
    root, run, step = proj.client.root, proj.plan.run_id, 5
    out = tmp_path / "step.html"
    args = ["show", run, "--step", str(step), "--rank", "1", "--world-size", "2", "--root", root]
    assert main([*args, "--out", str(out)]) == 0
    html = out.read_text()
    assert "/static/" not in html and "<style>" in html  # opens with no server
    assert 'href="/' not in html  # no link a file cannot follow
    loader = td.TrainLoader.from_state({"record": proj.plan.record.to_dict(), "step": step},
                                       proj.client, rank=1, world_size=2, steps=step + 1)  # fmt: skip
    (want,) = list(loader)  # step 5 only: the loader resumes there and stops after it
    frames = want["wrist_camera"].numpy()
    anchors = _anchors(html)
    assert len(anchors) == len(frames) and "image/png" not in html
    for got, w in zip(anchors, frames):  # the window's first frame (offset 0), as a JPEG
        assert got.shape == (64, 64, 3) and np.abs(got - w[0].astype(float)).mean() < 4
    for k in (0, len(frames) - 1):  # "all frames": the loader's pixels, lossless
        at = f"/p/robotics/runs/{run}/steps/{step}/samples/{k}"
        page = http.get(at, params={"rank": 1, "world_size": 2})
        assert np.array_equal(_strip_pixels(page.text), frames[k])
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    batch = proj.plan.batch(step, 1, 2)
    assert [s["moment"] for s in listed["samples"]] == batch.moment.tolist()
    assert [s["component"] for s in listed["samples"]] == batch.component.tolist()
    assert listed["samples"][0]["pad"]["action"] == [False] * 8


def test_show_needs_a_step_and_one_output(proj, capsys):
    run, root = proj.plan.run_id, proj.client.root
    # a missing --step is a usage error (exit 2, as documented); it was exit 1
    with pytest.raises(SystemExit) as exited:
        main(["show", run, "--json", "--root", root])
    assert exited.value.code == 2
    assert "the following arguments are required: --step" in capsys.readouterr().err
    assert main(["show", run, "--step", "0", "--root", root]) == 1
    assert "--out FILE.html" in capsys.readouterr().err


def test_show_names_an_unknown_run(proj, capsys):
    assert main(["show", "00000000000000ff", "--step", "0", "--json",
                 "--root", proj.client.root]) == 1  # fmt: skip
    assert "00000000000000ff" in capsys.readouterr().err


@pytest.mark.s3
@pytest.mark.slow
def test_pages_on_every_root_kind_show_no_credentials(any_root):
    root, options = any_root
    client = td.Client(root, options, create=True)
    branch = client.project("tiny").branch("main")
    frames = np.zeros((6, 32, 32, 3), np.uint8)
    frames[:, 8:16, 8:16] = 200
    branch.table("cam").append_episode(
        {"cam": td.VideoFrames(frames, fps=10), "x": np.arange(6, dtype=np.float32)}, episode="e0"
    )
    http = TestClient(create_app(td.Client(root, options)), base_url=LOCAL)
    pages = [http.get(p) for p in ["/", "/p/tiny", "/p/tiny/t/cam/v/1", "/p/tiny/t/cam/v/1/e/e0",
                                   "/p/tiny/t/cam/v/1/e/e0/video/cam.mp4"]]  # fmt: skip
    assert [p.status_code for p in pages] == [200] * 5
    with av.open(io.BytesIO(pages[-1].content)) as f:
        assert sum(1 for _ in f.decode(video=0)) == 6
    secrets = [str(v) for k, v in (options or {}).items() if "secret" in k or "key" in k]
    for p in pages[:-1]:
        assert "tiny" in p.text
        for s in secrets:
            assert s not in p.text


def test_a_100k_episode_table_is_served_in_pages(tmp_path):
    import pyarrow as pa

    client = td.Client(str(tmp_path / "big"), create=True)
    n = 100_000
    names = np.repeat([f"ep-{i:06d}" for i in range(n)], 2)
    frames = np.tile(np.arange(2, dtype=np.int32), n)
    client.project("big").branch().table("eps").append(
        pa.table({"episode": names, "frame": frames})
    )
    http = TestClient(create_app(td.Client(str(tmp_path / "big"))), base_url=LOCAL)
    assert "100,000" in http.get("/p/big/t/eps/v/1").text
    page = http.get("/p/big/t/eps/v/1/episodes.json", params={"offset": 99_950, "limit": 10**6})
    eps = page.json()["episodes"]
    assert page.json()["total"] == n and len(eps) == 50  # at most one page, never the table
    assert eps[-1] == {"index": n - 1, "name": "ep-099999", "start": 2 * n - 2, "length": 2,
                       "href": "/p/big/t/eps/v/1/e/ep-099999"}  # fmt: skip
    assert len(http.get("/p/big/t/eps/v/1/episodes.json").json()["episodes"]) == 100
    assert 'data-frames="2"' in http.get("/p/big/t/eps/v/1/e/ep-099999").text


def _start(args: list[str]):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "treadle.cli", "ui", "--no-open", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    line = proc.stdout.readline()
    return proc, line


@pytest.mark.slow
def test_the_command_serves_127_0_0_1_and_a_token_elsewhere(proj):
    import socket

    import httpx

    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    port = free()
    proc, line = _start(["--root", proj.client.root, "--port", str(port)])
    try:
        assert f"http://127.0.0.1:{port}/ " in line, line
        assert "robotics" in _get(httpx, f"http://127.0.0.1:{port}/").text
    finally:
        proc.terminate()
        proc.wait(10)
    port = free()
    proc, line = _start(["--root", proj.client.root, "--port", str(port), "--host", "0.0.0.0"])
    try:
        token = line.split("?token=", 1)[1].split()[0]
        assert len(token) >= 24
        assert _get(httpx, f"http://127.0.0.1:{port}/").status_code == 401
        r = _get(httpx, f"http://127.0.0.1:{port}/p/robotics", params={"token": token})
        assert r.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "generated" in err and token in err  # printed once, for the user
    assert "GET /" not in err  # no access log: a logged URL would show the token


def _get(httpx, url: str, **kw):
    import time

    for _ in range(100):  # the server binds right after printing its URL
        try:
            return httpx.get(url, timeout=10, **kw)
        except httpx.ConnectError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer")

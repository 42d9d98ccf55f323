"""The viewer's web app: routes, its gates, errors as pages, bounded caches.

Every GET reads the store through a :class:`~treadle.ui.readonly.ViewerClient` (a store
that writes nothing, and only table versions a commit names): no GET writes. The one
route that writes is ``POST .../stats`` (``table.stats``, kept as the API keeps it),
refused for a foreign ``Origin`` or a cross-site ``Sec-Fetch-Site``. Names in paths are
checked by :func:`treadle.names.check_name` (episodes: any name the write API accepts);
a bad or unknown name, or a number no table or step has, is a 404 page naming it. The
gates (:mod:`treadle.ui.gates`): a loopback ``Host`` unless a token or ``allow_hosts``;
with a token, a request must carry it.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from treadle.errors import InvalidName, NotFound, PlanError, TreadleError
from treadle.names import check_name
from treadle.ui import browse, image_frames, media, runs, step
from treadle.ui import episode as ep
from treadle.ui.gates import LOOPBACK, HostGate, SiteGate, TokenGate, same_origin
from treadle.ui.html import STATIC, error_page
from treadle.ui.readonly import ViewerClient

_KINDS = {"project": "project", "branch": "branch", "table": "table", "column": "column"}
MAX_INT = 2**63 - 1
"""The largest step, version, frame or query number a request may give (larger: 404/400)."""


class ByteLRU:
    """A thread-safe LRU of byte strings bounded by their total size. A value is made once
    for concurrent askers of one key (a browser asks for a video in several ranges at
    once), and at most ``builds`` values are made at a time."""

    def __init__(self, max_bytes: int, builds: int = 2):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Any, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._making: dict[Any, threading.Lock] = {}
        self._builds = threading.BoundedSemaphore(builds)

    def _hit(self, key: Any) -> bytes | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def get(self, key: Any, make: Callable[[], bytes]) -> bytes:
        hit = self._hit(key)
        if hit is not None:
            return hit
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:  # another asker's make of this key: wait for it, then take its value
            hit = self._hit(key)
            if hit is not None:
                return hit
            try:
                with self._builds:
                    value = make()
                with self._lock:
                    self._items[key] = value
                    self._size += len(value)
                    while self._size > self.max_bytes and len(self._items) > 1:
                        self._size -= len(self._items.popitem(last=False)[1])
            finally:
                with self._lock:
                    self._making.pop(key, None)
        return value


def _query_int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    number = _number(value)
    if number is None:
        raise PlanError(f"query parameter {name}={value[:40]!r} must be an integer of at most "
                        "19 digits")  # fmt: skip
    return number


def _number(text: str) -> int | None:
    """``text`` as an int in -MAX_INT..MAX_INT (no more than 20 characters), else None."""
    t = text.strip()
    if not t or len(t) > 20 or not t.lstrip("+-").isdigit():
        return None
    n = int(t)
    return n if -MAX_INT <= n <= MAX_INT else None


def _path_int(text: str, what: str) -> int:
    """A path's number (a version, step, frame): 0..MAX_INT, else a 404 naming it."""
    n = _number(text) if text.isdigit() else None
    if n is None:
        raise NotFound(f"{what} {text[:40]!r} is not a number of at most 19 digits")
    return n


def _status(e: Exception) -> int:
    if isinstance(e, InvalidName | NotFound):
        return 404
    return 400 if isinstance(e, PlanError) else 500


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_response(value: Any, status: int = 200) -> Response:
    body = json.dumps(finite(value), allow_nan=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json")


def endpoint(fn: Callable[..., Any], kind: str = "html") -> Callable[[Request], Any]:
    """An async route of ``fn(request, **checked path names)`` run in a worker thread."""

    async def route(request: Request) -> Response:
        params = dict(request.path_params)
        wants_json = kind == "json"
        try:
            for key, value in params.items():
                if key in _KINDS:
                    check_name(value, _KINDS[key])
                elif key in ("version", "n", "frame"):
                    params[key] = _path_int(value, {"n": "step"}.get(key, key))
            out = await run_in_threadpool(fn, request, **params)
        except TreadleError as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if wants_json:
                return json_response({"error": msg}, _status(e))
            return HTMLResponse(error_page(_status(e), msg), status_code=_status(e))
        if isinstance(out, Response):
            return out
        return json_response(out) if wants_json else HTMLResponse(out)

    return route


def _episode_name(request: Request, episode_: str | None) -> str:
    """The episode of a request: its path segment, or ``?name=`` (a name with a ``/``)."""
    if episode_ is not None:
        return episode_
    name = request.query_params.get("name")
    if name is None:
        raise NotFound("give the episode as .../e/NAME or .../episode?name=NAME")
    return name


def _video(app_state: Any, request: Request, project: str, table: str, version: int,
           episode_: str, column: str) -> Response:  # fmt: skip
    client = app_state.client
    tab = client.table(project, table, version)
    _, start, length = ep.find_episode(tab, episode_)

    def make() -> bytes:
        video = media.episode_video(tab, column, start, length)
        where = f"episode {episode_!r} of table {table!r} v{version}, column {column!r}"
        media.check_video_size(video, app_state.videos.max_bytes, where)
        return media.to_mp4(client.store, video)

    data = app_state.videos.get((project, table, version, episode_, column), make)
    headers = {"Accept-Ranges": "bytes", "Content-Type": "video/mp4",
               "Cache-Control": "private, max-age=3600"}  # fmt: skip
    try:
        rng = media.byte_range(request.headers.get("range"), len(data))
    except ValueError:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{len(data)}"})
    if rng is None:
        return Response(data, headers=headers)
    a, b = rng
    headers["Content-Range"] = f"bytes {a}-{b - 1}/{len(data)}"
    return Response(memoryview(data)[a:b], status_code=206, headers=headers)  # no copy


def _frame_png(client: Any, project: str, table: str, version: int, episode_: str,
               column: str, frame: int, stretch: bool = False) -> Response:  # fmt: skip
    """Frame ``frame`` of a video column (treadle's decode) or of an image column (the
    stored image's decode; ``stretch``: a 16-bit one as 8-bit grey, for the eye)."""
    tab = client.table(project, table, version)
    _, start, length = ep.find_episode(tab, episode_)
    if column in tab.video_columns:
        pixels = ep.decode_frame(client, tab, column, start, length, frame)
    else:
        pixels = image_frames.image_frame(tab, column, start, length, frame)
        pixels = image_frames.stretched(pixels) if stretch else pixels
    return Response(media.png(pixels), media_type="image/png")


def _stats(state: Any, request: Request, project: str, table: str, version: int) -> Any:
    """``POST .../stats``: table.stats of a version a commit names, computed and kept."""
    refused = same_origin(request.headers)
    if refused:
        return json_response({"error": refused}, 403)
    state.client.versions.check(project, table, version)
    tab = state.writer.project(project, create=False).table_at(table, version)
    return json_response(browse.stats_json(tab))


def _episode_routes(state: Any, t: str) -> list[Route]:
    """An episode's page and resources, under ``.../e/NAME`` and ``.../episode?name=``."""
    c, q = state.client, _query_int

    def page(
        req: Request, project: str, table: str, version: int, episode: str | None = None
    ) -> str:
        return ep.episode_page(c, project, table, version, _episode_name(req, episode),
                                    q(req, "frame", 0))  # fmt: skip

    def data(
        req: Request, project: str, table: str, version: int, episode: str | None = None
    ) -> dict:
        return ep.episode_data(c, project, table, version, _episode_name(req, episode))

    def video(
        req: Request,
        project: str,
        table: str,
        version: int,
        column: str,
        episode: str | None = None,
    ) -> Response:
        return _video(state, req, project, table, version, _episode_name(req, episode), column)

    def frame(
        req: Request,
        project: str,
        table: str,
        version: int,
        column: str,
        frame: int,
        episode: str | None = None,
    ) -> Response:
        name = _episode_name(req, episode)
        stretch = _query_int(req, "stretch", 0) != 0
        return _frame_png(c, project, table, version, name, column, frame, stretch)

    out = []
    for base in (t + "/e/{episode}", t + "/episode"):
        out += [Route(base, endpoint(page)), Route(base + "/data.json", endpoint(data, "json")),
                Route(base + "/video/{column}.mp4", endpoint(video)),
                Route(base + "/frame/{column}/{frame}.png", endpoint(frame))]  # fmt: skip
    return out


def _routes(state: Any) -> list[Any]:
    c, r = state.client, state.runs
    t = "/p/{project}/t/{table}/v/{version}"
    s = "/p/{project}/runs/{run_id}/steps/{n}"
    q = _query_int
    return [
        Route("/", endpoint(lambda req: browse.projects_page(c))),
        Route("/favicon.ico", lambda req: Response((STATIC / "favicon.svg").read_bytes(),
                                                   media_type="image/svg+xml")),
        Route("/p/{project}", endpoint(lambda req, project: browse.project_page(
            c, project, check_name(req.query_params.get("branch", "main"), "branch"),
            offset=q(req, "offset", 0)))),
        Route("/p/{project}/c/{commit}", endpoint(
            lambda req, project, commit: browse.commit_page(c, project, commit))),
        Route(t, endpoint(lambda req, project, table, version: browse.table_page(
            c, project, table, version))),
        Route(t + "/episodes.json", endpoint(lambda req, project, table, version: browse
              .episodes_json(c, project, table, version, q(req, "offset", 0),
                             q(req, "limit", browse.PAGE), req.query_params.get("filter")),
              "json")),
        Route(t + "/stats", endpoint(lambda req, project, table, version: _stats(
            state, req, project, table, version), "json"), methods=["POST"]),
        *_episode_routes(state, t),
        Route("/p/{project}/runs", endpoint(lambda req, project: runs.runs_page(r, project))),
        Route("/p/{project}/runs/{run_id}", endpoint(lambda req, project, run_id: runs.run_page(
            r, project, run_id, q(req, "world_size", 1)))),
        Route("/p/{project}/runs/{run_id}/composition.json", endpoint(
            lambda req, project, run_id: runs.composition(r.plan(project, run_id),
                                                          q(req, "start", 0), q(req, "count", 200)),
            "json")),
        Route(s, endpoint(lambda req, project, run_id, n: step.step_shell(
            r.plan(project, run_id), n, q(req, "rank", 0), q(req, "world_size", 1),
            q(req, "offset", 0)))),
        Route(s + "/samples", endpoint(lambda req, project, run_id, n: step.samples_table(
            step.read_step(r.plan(project, run_id), n, q(req, "rank", 0),
                           q(req, "world_size", 1), anchors=True, first=q(req, "offset", 0),
                           count=step.PAGE)))),
        Route(s + "/samples/{k}", endpoint(lambda req, project, run_id, n, k: step.sample_html(
            step.read_step(r.plan(project, run_id), n, q(req, "rank", 0),
                           q(req, "world_size", 1), sample=_path_int(k, "sample"))))),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]  # fmt: skip


async def _no_page(request: Request, exc: Exception) -> Response:
    """A path no route has (e.g. a name with ``/`` or ``..`` in it): 404 naming the path."""
    return HTMLResponse(error_page(404, f"no page at {request.url.path!r}"), status_code=404)


class _State:
    def __init__(self, client: Any, video_cache_bytes: int):
        self.writer = client  # POST .../stats only
        self.client = ViewerClient(client)  # every GET: writes nothing
        self.runs = runs.Runs(self.client)
        self.videos = ByteLRU(video_cache_bytes)


def create_app(client: Any, token: str | None = None, *, allow_hosts: Iterable[str] = (),
               video_cache_bytes: int = 256 << 20) -> Any:  # fmt: skip
    """The viewer as an ASGI app over ``client``. With ``token``, every request needs it
    (and any ``Host`` is answered); without, only loopback hosts and ``allow_hosts``."""
    app = Starlette(routes=_routes(_State(client, video_cache_bytes)),
                    exception_handlers={404: _no_page})  # fmt: skip
    if token:
        return TokenGate(SiteGate(app), token)
    return HostGate(SiteGate(app), [*LOOPBACK, *allow_hosts])

"""The viewer's web app: routes, the token check, errors as pages, bounded caches.

Every route is a GET that reads the store through one :class:`~treadle.catalog.Client`;
no route writes to it (``stats.json`` keeps what it computes, as ``td.Table.stats``
does). Path names go through :func:`treadle.names.check_name`: a bad or unknown name is a
404 page that names it. With a token, a request must carry it (``?token=``, which also sets
a cookie for the links that follow, the cookie, or ``Authorization: Bearer``); else 401.
"""

from __future__ import annotations

import hmac
import threading
from collections import OrderedDict
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from treadle.errors import InvalidName, NotFound, PlanError, TreadleError
from treadle.names import check_name
from treadle.ui import browse, episode, media, runs, step
from treadle.ui.html import STATIC, error_page

_KINDS = {"project": "project", "branch": "branch", "table": "table", "episode": "episode",
          "column": "column"}  # fmt: skip
COOKIE = "treadle_token"


class ByteLRU:
    """A thread-safe LRU of byte strings bounded by their total size."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Any, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], bytes]) -> bytes:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while (
                sum(len(v) for v in self._items.values()) > self.max_bytes and len(self._items) > 1
            ):
                self._items.popitem(last=False)
        return value


def _query_int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise PlanError(f"query parameter {name}={value!r} must be an integer") from None


def _status(e: Exception) -> int:
    if isinstance(e, InvalidName | NotFound):
        return 404
    return 400 if isinstance(e, PlanError) else 500


def endpoint(fn: Callable[..., Any], kind: str = "html") -> Callable[[Request], Any]:
    """An async route of ``fn(request, **checked path names)`` run in a worker thread."""

    async def route(request: Request) -> Response:
        params = dict(request.path_params)
        wants_json = kind == "json"
        try:
            for key, value in params.items():
                if key in _KINDS:
                    check_name(value, _KINDS[key])
            out = await run_in_threadpool(fn, request, **params)
        except TreadleError as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if wants_json:
                return JSONResponse({"error": msg}, status_code=_status(e))
            return HTMLResponse(error_page(_status(e), msg), status_code=_status(e))
        if isinstance(out, Response):
            return out
        return JSONResponse(out) if wants_json else HTMLResponse(out)

    return route


def _video(app_state: Any, request: Request, project: str, table: str, version: int,
           episode_: str, column: str) -> Response:  # fmt: skip
    client = app_state.client
    tab = client.project(project, create=False).table_at(table, version)
    _, start, length = episode.find_episode(tab, episode_)

    def make() -> bytes:
        return media.to_mp4(client.store, media.episode_video(tab, column, start, length))

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
    return Response(data[a:b], status_code=206, headers=headers)


def _frame_png(client: Any, project: str, table: str, version: int, episode_: str,
               column: str, frame: int) -> Response:  # fmt: skip
    tab = client.project(project, create=False).table_at(table, version)
    _, start, length = episode.find_episode(tab, episode_)
    pixels = episode.decode_frame(client, tab, column, start, length, frame)
    return Response(media.png(pixels), media_type="image/png")


def _routes(state: Any) -> list[Any]:
    c, r = state.client, state.runs
    t = "/p/{project}/t/{table}/v/{version:int}"
    e = t + "/e/{episode}"
    q = _query_int
    return [
        Route("/", endpoint(lambda req: browse.projects_page(c))),
        Route("/p/{project}", endpoint(lambda req, project: browse.project_page(
            c, project, check_name(req.query_params.get("branch", "main"), "branch")))),
        Route("/p/{project}/c/{commit}", endpoint(
            lambda req, project, commit: browse.commit_page(c, project, commit))),
        Route(t, endpoint(lambda req, project, table, version: browse.table_page(
            c, project, table, version))),
        Route(t + "/episodes.json", endpoint(lambda req, project, table, version: browse
              .episodes_json(c, project, table, version, q(req, "offset", 0),
                             q(req, "limit", browse.PAGE)), "json")),
        Route(t + "/stats.json", endpoint(lambda req, project, table, version: browse
              .stats_json(c, project, table, version), "json")),
        Route(e, endpoint(lambda req, project, table, version, episode: episode_mod
              .episode_page(c, project, table, version, episode, q(req, "frame", 0)))),
        Route(e + "/data.json", endpoint(lambda req, project, table, version, episode:
              episode_mod.episode_data(c, project, table, version, episode), "json")),
        Route(e + "/video/{column}.mp4", endpoint(lambda req, project, table, version, episode,
              column: _video(state, req, project, table, version, episode, column))),
        Route(e + "/frame/{column}/{frame:int}.png", endpoint(lambda req, project, table,
              version, episode, column, frame: _frame_png(c, project, table, version, episode,
                                                          column, frame))),
        Route("/p/{project}/runs", endpoint(lambda req, project: runs.runs_page(r, project))),
        Route("/p/{project}/runs/{run_id}", endpoint(lambda req, project, run_id: runs.run_page(
            r, project, run_id, q(req, "world_size", 1)))),
        Route("/p/{project}/runs/{run_id}/composition.json", endpoint(
            lambda req, project, run_id: runs.composition(r.plan(project, run_id),
                                                          q(req, "start", 0), q(req, "count", 200)),
            "json")),
        Route("/p/{project}/runs/{run_id}/steps/{n:int}", endpoint(
            lambda req, project, run_id, n: step.step_shell(
                r.plan(project, run_id), n, q(req, "rank", 0), q(req, "world_size", 1)))),
        Route("/p/{project}/runs/{run_id}/steps/{n:int}/samples", endpoint(
            lambda req, project, run_id, n: step.samples_table(step.read_step(
                r.plan(project, run_id), n, q(req, "rank", 0), q(req, "world_size", 1))))),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]  # fmt: skip


episode_mod = episode


async def _no_page(request: Request, exc: Exception) -> Response:
    """A path no route has (e.g. a name with ``/`` or ``..`` in it): 404 naming the path."""
    return HTMLResponse(error_page(404, f"no page at {request.url.path!r}"), status_code=404)


class _State:
    def __init__(self, client: Any, video_cache_bytes: int):
        self.client = client
        self.runs = runs.Runs(client)
        self.videos = ByteLRU(video_cache_bytes)


def create_app(client: Any, token: str | None = None, *,
               video_cache_bytes: int = 256 << 20) -> Any:  # fmt: skip
    """The viewer as an ASGI app over ``client``; with ``token``, every request needs it."""
    app = Starlette(routes=_routes(_State(client, video_cache_bytes)),
                    exception_handlers={404: _no_page})  # fmt: skip
    return TokenGate(app, token) if token else app


class TokenGate:
    """ASGI middleware: 401 for any request without the token (compared in constant time)."""

    def __init__(self, app: Any, token: str):
        self.app, self.token = app, token

    def _given(self, scope: dict[str, Any]) -> tuple[str | None, bool]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0], True
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        jar = SimpleCookie(headers.get("cookie", ""))
        return (jar[COOKIE].value if COOKIE in jar else None), False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given, from_query = self._given(scope)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            body = error_page(401, "this viewer needs its token: open the URL it printed").encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"text/html; charset=utf-8"),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return None

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and from_query:
                cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
            await send(message)

        return await self.app(scope, receive, send_with_cookie)

"""What a request must show before the viewer answers it: a loopback ``Host`` (DNS
rebinding), the token, and, for the one request that writes (a POST), a same-origin page.

- **Host.** A page on ``attacker.example`` can rebind that name to 127.0.0.1 and then read
  the viewer as its own origin. Without a token, a request is answered only when its
  ``Host`` names ``127.0.0.1``, ``localhost`` or ``[::1]`` (any port: SSH and editor port
  forwarding change it) or a name given with ``--allow-host``; else 403. A token-protected
  viewer accepts any host (the token is the check).
- **Token.** ``?token=`` (which sets a cookie, named per port so that two viewers on one
  host do not log each other out), that cookie, or ``Authorization: Bearer``; compared in
  constant time; 401 otherwise. Cookies are parsed leniently: another localhost app's
  JSON-valued cookie does not hide the token.
- **Writes.** :func:`same_origin` refuses a request whose ``Origin`` (or ``Referer``, when
  there is no ``Origin``) is another origin or whose ``Sec-Fetch-Site`` says another site;
  curl and scripts send none, and pass.
- **Other sites.** :class:`SiteGate`: another site's page may link to the viewer (or frame
  it), but not load its resources (no ``<img>`` of a frame, no ``fetch``).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from treadle.errors import TreadleError
from treadle.ui.html import error_page

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
"""Host names a token-less viewer answers (on any port)."""
COOKIE = "treadle_token"
"""The token cookie's name, before its ``_PORT`` suffix (:func:`cookie_name`)."""


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def host_name(header: str) -> str:
    """The name of a ``Host`` header, lower case, without its port (``[::1]`` kept whole)."""
    h = header.strip().lower()
    if h.startswith("["):  # only a port may follow "]": "[::1]evil.com" is no loopback
        name, bracket, port = h.partition("]")
        ok = bracket and (not port or (port[0] == ":" and port[1:].isdigit()))
        return name + bracket if ok else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def cookie_name(scope: dict[str, Any]) -> str:
    """``treadle_token_PORT``: the port the viewer serves on (one cookie per viewer)."""
    server = scope.get("server") or ("", 0)
    return f"{COOKIE}_{server[1]}"


def parse_cookies(header: str) -> dict[str, str]:
    """``name=value`` pairs of a ``Cookie`` header; a pair that is not one is skipped (a
    JSON value with quotes, commas or spaces does not end the parse, as it does for
    :class:`http.cookies.SimpleCookie`)."""
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name and name not in out:
            out[name] = value.strip().strip('"')
    return out


async def _refuse(send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = error_page(status, message).encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_other(scope: dict[str, Any], send: Any) -> bool:
    """Refuse (and say True for) a scope that is neither HTTP nor lifespan: the viewer
    has no websocket, so none reaches its routes past the Host and token checks."""
    if scope["type"] in ("http", "lifespan"):
        return False
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
    return True


_HOST = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?\.?)(:[0-9]+)?")


def allowed_host(value: str) -> str:
    """The name of an ``--allow-host`` value (``devbox.lan``, ``devbox.lan:8800``,
    ``[fd00::1]``), lower case; TreadleError naming anything else (a URL, an empty
    value, a wildcard), which would answer another ``Host`` than the one meant or none."""
    if not _HOST.fullmatch(value.strip()):
        raise TreadleError(
            f"--allow-host {value!r} is not a host name: give the name a browser sends, as "
            "in its address bar without http:// or a path (devbox.lan, devbox.lan:8800)"
        )
    return host_name(value)


class HostGate:
    """ASGI middleware: 403 for a ``Host`` not in ``allowed`` (names, any port)."""

    def __init__(self, app: Any, allowed: Iterable[str]):
        self.app = app
        self.allowed = {allowed_host(h) for h in allowed}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await _refuse_other(scope, send):
            return None
        if scope["type"] == "http":
            name = host_name(_headers(scope).get("host", ""))
            if name not in self.allowed:
                msg = (f"this viewer answers only {', '.join(sorted(self.allowed))} (any port), "
                       f"not host {name!r}: open it as http://127.0.0.1:PORT/, or start it "
                       "with --allow-host NAME or a --token")  # fmt: skip
                return await _refuse(send, 403, msg, [])
        return await self.app(scope, receive, send)


class TokenGate:
    """ASGI middleware: 401 for any request without the token (compared in constant time).
    The viewer's CSS and icon are served without it, so the 401 page is styled."""

    OPEN = ("/static/viewer.css", "/favicon.ico")

    def __init__(self, app: Any, token: str):
        self.app, self.token = app, token

    def _given(self, scope: dict[str, Any]) -> tuple[str | None, bool]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0], True
        headers = _headers(scope)
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        value = parse_cookies(headers.get("cookie", "")).get(cookie_name(scope))
        return (None if value is None else unquote(value)), False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await _refuse_other(scope, send):
            return None
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            return await self.app(scope, receive, send)
        given, from_query = self._given(scope)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            msg = "this viewer needs its token: open the URL it printed"
            return await _refuse(send, 401, msg, [(b"www-authenticate", b"Bearer")])
        name = cookie_name(scope)

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and from_query:
                value = quote(self.token, safe="")
                cookie = f"{name}={value}; HttpOnly; SameSite=Strict; Path=/"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
            await send(message)

        return await self.app(scope, receive, send_with_cookie)


class SiteGate:
    """ASGI middleware: 403 for a request another site's page made (``Sec-Fetch-Site``
    ``cross-site`` or ``same-site``, e.g. an ``<img>``, ``<video>`` or ``fetch`` of a page
    on ``attacker.example`` or ``localhost:3000``) unless it opens a page (a link
    followed, or a frame: an editor's preview pane shows the viewer in one): a
    ``Sec-Fetch-Mode: navigate`` GET. Such a request could make the viewer decode a step or
    remux a video, and its load or error event tells the other page which projects, tables
    and episodes exist (a frame's load event fires for a 404 page too). Every answer
    forbids MIME sniffing and sends no ``Referer`` elsewhere. Browsers that send no
    ``Sec-Fetch-*`` headers (and curl) pass."""

    HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin")]
    PAGES = ("document", "iframe", "frame")
    """``Sec-Fetch-Dest`` of a navigation another site's page may make."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        site = headers.get("sec-fetch-site")
        opens = (
            headers.get("sec-fetch-mode") == "navigate"
            and headers.get("sec-fetch-dest", "document") in self.PAGES
            and scope.get("method") in ("GET", "HEAD")
        )
        if site in ("cross-site", "same-site") and not opens:
            msg = (f"Sec-Fetch-Site is {site!r}: another site's page may link to this viewer "
                   "but not load its resources")  # fmt: skip
            return await _refuse(send, 403, msg, self.HEADERS)

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def same_origin(headers: Any) -> str | None:
    """Why a state-changing request must be refused (None: it may go on). ``Origin`` (or,
    when a browser sent none, the origin of ``Referer``) must be this viewer's own
    (``http://`` + its ``Host``); ``Sec-Fetch-Site``, when sent, must be ``same-origin``.
    A request with none of them (curl, a script) may go on."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {site!r}: only a page of this viewer may ask"
    origin, said = headers.get("origin"), "Origin"
    if origin is None and headers.get("referer") is not None:
        parts = urlsplit(headers["referer"])
        origin, said = f"{parts.scheme}://{parts.netloc}", "Referer"
    if origin is not None:
        own = {f"http://{headers.get('host', '')}", f"https://{headers.get('host', '')}"}
        if origin.lower() not in {o.lower() for o in own}:
            return f"{said} {origin!r} is not this viewer: only a page of this viewer may ask"
    return None

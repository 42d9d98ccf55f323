"""Run the viewer: bind 127.0.0.1 unless told otherwise, and then only with a token.

The URL printed (and opened, unless ``open_browser=False``) carries the token when there
is one (percent-encoded), and the port bound (``--port 0``: the one the system chose); a
port in use is one line and exit 1. uvicorn's access log is off (a logged URL would show
the token) and the viewer logs nothing of the store's options; a client must send each
request's headers within :data:`treadle.ui.deadline.HEADER_SECONDS` (slow-loris).
"""

from __future__ import annotations

import errno
import secrets
import socket
import sys
import threading
import webbrowser
from typing import Any
from urllib.parse import quote

from treadle.errors import TreadleError

LOCAL = ("127.0.0.1", "localhost", "::1")


def check_host(host: str, token: str | None) -> str | None:
    """The token to use: ``token``; a new one when ``host`` is not local and none is given
    (the caller prints it); None for a local host without one."""
    if not host:
        raise TreadleError("--host is empty: give 127.0.0.1 or an address to bind")
    if token is not None and not token.strip():
        raise TreadleError("--token is empty: give a token or leave the option out")
    if token is None and host not in LOCAL:
        return secrets.token_urlsafe(24)
    return token


def viewer_url(host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port); TreadleError in one line when
    the port is taken or the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise TreadleError(f"port {port} on {host} is in use: give another --port "
                               "(0 picks a free one)") from None  # fmt: skip
        raise TreadleError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(client: Any, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          open_browser: bool = True, allow_hosts: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Serve the viewer over ``client`` until interrupted (``allow_hosts``: ``Host`` names
    answered besides the loopback ones, when there is no token)."""
    import uvicorn

    from treadle.ui.app import create_app
    from treadle.ui.gates import allowed_host

    for name in allow_hosts:  # before the port is bound: a typo is one line, not a viewer
        allowed_host(name)
    given = token
    token = check_host(host, token)
    sock = bind(host, port)
    if token and given is None:
        print(f"treadle ui: {host} is not local, so every request needs a token; generated: "
              f"{token}", file=sys.stderr)  # fmt: skip
    app = create_app(client, token, allow_hosts=allow_hosts)
    link = viewer_url(host, sock.getsockname()[1], token)
    print(f"treadle ui: serving {link} (read-only; Ctrl-C stops)", flush=True)
    if open_browser:
        threading.Timer(1.0, lambda: webbrowser.open(link)).start()
    uvicorn.Server(server_config(app)).run(sockets=[sock])


def server_config(app: Any) -> Any:
    """uvicorn's configuration of the viewer: no access log (a logged URL would show the
    token), and a deadline for each request's headers (:mod:`treadle.ui.deadline`)."""
    import uvicorn

    from treadle.ui.deadline import DeadlineProtocol

    return uvicorn.Config(app, access_log=False, log_level="warning", http=DeadlineProtocol)

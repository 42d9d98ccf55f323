"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 endpoint (tests only).

Point a client's ``aws_endpoint`` at :attr:`FaultProxy.endpoint`; every request is
forwarded to ``upstream`` unchanged (the ``Host`` header too, so SigV4 signatures
still verify), except that a seeded fraction ``rate`` of requests meets a fault:

- ``drop``: the connection is closed before the request is forwarded (a reset);
- ``delay``: the request is held ``delay_s`` seconds, then forwarded;
- ``503``: answered ``503 SlowDown`` without being forwarded (throttling);
- ``lost``: forwarded (the server acts on it), then the connection is closed before
  the response: the client cannot tell whether its write landed;
- ``403``: answered ``403 AccessDenied`` (a *permanent* fault, for fail-fast tests);
- ``truncate``: forwarded, but only half of the response body is sent before the
  connection is closed (only for responses with a body of 2+ bytes);
- ``stall``: forwarded, the headers and half of the body sent, then nothing more while
  the connection stays open (a server that hangs mid-body), until the proxy stops;
- ``500``: answered ``500 InternalError`` without being forwarded;
- ``mute``: not forwarded and never answered, the connection left open (a store that
  accepts connections and then says nothing), until the proxy stops.

Faults never reach the server before failing, except ``truncate`` (reads only) and
``delay``, so injected faults are transient by construction. ``counts`` records what
was injected; ``requests`` how many requests arrived.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

KINDS = ("drop", "delay", "503", "truncate")  # transient; "403" is a permanent kind
_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>injected by fault proxy</Message></Error>"
)

_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>injected by fault proxy</Message></Error>"
)
_CANNED = {
    "503": (_SLOWDOWN, "Slow Down"),
    "403": (_DENIED, "Forbidden"),
    "500": (_INTERNAL, "Internal Server Error"),
}


class FaultProxy:
    """Use as a context manager; ``rate`` and ``kinds`` may be changed while it runs."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        seed: int = 0,
        kinds: tuple[str, ...] = KINDS,
        delay_s: float = 0.2,
        methods: tuple[str, ...] | None = None,
        paths: str | None = None,
    ):
        u = urlparse(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.rate = rate
        self.kinds = tuple(kinds)
        self.delay_s = delay_s
        self.methods = methods  # None: every method may meet a fault
        self.paths = paths  # None: every path; else only paths containing this text
        self.counts: Counter[str] = Counter()
        self.requests = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()  # releases the stalled responses

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "proxy not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def options(self, storage_options: dict[str, str]) -> dict[str, str]:
        """``storage_options`` with the endpoint replaced by this proxy."""
        return dict(storage_options, aws_endpoint=self.endpoint)

    def start(self) -> FaultProxy:
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests += 1
            if self.methods is not None and method not in self.methods:
                return None
            if self.paths is not None and self.paths not in path:
                return None
            if not self.kinds or self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
            if kind in ("truncate", "stall") and method != "GET":
                kind = "503"  # only reads have a body worth cutting
            self.counts[kind] += 1
            return kind

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        return c

    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes):
        for attempt in range(2):  # a stale keep-alive upstream connection: reconnect once
            conn = self._conn()
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    conn.putheader(k, v)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # not 5: hundreds of concurrent GETs are what it serves


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self) -> None:
        p = self.proxy
        body = self._body()
        fault = p.choose(self.command, self.path)
        if fault == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault == "mute":
            p._stopped.wait()
            self.close_connection = True
            return
        if fault in ("503", "403", "500"):
            text, reason = _CANNED[fault]
            self.send_response(int(fault), reason)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)
            return
        if fault == "delay":
            time.sleep(p.delay_s)
        headers = [
            (k, v)
            for k, v in self.headers.items()
            if k.lower() not in _HOP and k.lower() != "content-length"
        ]
        try:
            status, reason, rheaders, data = p.forward(self.command, self.path, headers, body)
        except (http.client.HTTPException, OSError):
            self.send_error(502)
            return
        if fault in ("truncate", "stall") and len(data) < 2:
            with p._lock:  # nothing to cut: not a fault after all
                p.counts[fault] -= 1
            fault = None
        if fault == "lost":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.send_response(status, reason)
        upstream_len = None
        for k, v in rheaders:
            lk = k.lower()
            if lk == "content-length":
                upstream_len = v
                continue
            if lk not in _HOP:
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", upstream_len or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault == "truncate" and len(data) >= 2:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault == "stall":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            p._stopped.wait()
            self.close_connection = True
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

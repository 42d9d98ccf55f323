"""A TCP proxy on 127.0.0.1 that holds every request ``delay_s`` (cloud latency on loopback).

Put it in front of a local S3 server (``aws_endpoint`` = :attr:`DelayProxy.endpoint`) and
each HTTP request the client sends reaches the server ``delay_s`` later, as if the server
were a cloud region away: bytes from the client are forwarded ``delay_s`` after they
arrived (in order, without waiting for each other: a request's later chunks are not
held again on top of the first's delay); responses pass at once. Bytes are never changed,
so SigV4 signatures still verify.

It also counts what goes through, for the bench rows and the tests:

- ``requests``: requests seen (a new request starts when a connection's client sends
  again after its server answered, the HTTP/1.1 turn taking that obstore/reqwest and
  Lance follow; nothing is pipelined);
- ``bytes_in``/``bytes_out``: bytes client -> server and server -> client;
  ``body_out``: the bytes of response bodies (the sum of their ``Content-Length``; none for
  ``HEAD``), the payload the store served without HTTP headers;
- ``log``: when set to a list, a :class:`Seen` per request (method, path, ``Range`` header,
  status, body bytes), for tests that compare what a run asked of the store with a model;
- ``max_waiting``: the most requests at once that were sent and not yet answered (their
  first response byte), i.e. in flight together: > 1 means the client overlapped them;
  ``max_watched`` the same of the requests whose request line holds ``watch``.

Bounded: at most ``max_connections`` connections forwarded at once (more wait; a
connection idle for ``idle_s`` is closed, as servers close idle keep-alive connections, so
clients that keep pools of them cannot hold every slot) and at most ``max_buffer`` bytes
held per connection (reading from the client pauses until the held bytes are forwarded). It stops by itself when its ``with`` block ends, when
:meth:`stop` is called, or ``lifetime_s`` after it started (a proxy left behind by a
crashed run does not live on). It listens on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Self

_CHUNK = 1 << 16


@dataclass
class Counts:
    """What went through the proxy (a snapshot, or the difference of two)."""

    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    body_out: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.requests - other.requests,
            self.bytes_in - other.bytes_in,
            self.bytes_out - other.bytes_out,
            self.body_out - other.body_out,
        )


@dataclass
class Seen:
    """One request as the store saw it: ``range`` is the ``Range`` header's ``(first,
    last)`` bytes (inclusive, as HTTP writes them) or None; ``body`` the response's
    ``Content-Length`` (0 for ``HEAD``; -1 until answered)."""

    method: str
    path: str
    range: tuple[int, int] | None
    status: int = 0
    body: int = -1


_RANGE = re.compile(rb"\r\nrange:\s*bytes=(\d+)-(\d+)", re.IGNORECASE)
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def _seen(data: bytes) -> Seen:
    """The request whose first bytes are ``data`` (request line and headers)."""
    line = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    m = _RANGE.search(data.split(b"\r\n\r\n", 1)[0])
    got = (int(m.group(1)), int(m.group(2))) if m else None
    return Seen(line[0], line[1] if len(line) > 1 else "", got)


class DelayProxy:
    """Use as a context manager; ``upstream`` is ``"http://127.0.0.1:PORT"`` (or a port)."""

    def __init__(
        self,
        upstream: str | int,
        delay_s: float = 0.030,
        *,
        max_connections: int = 1024,
        max_buffer: int = 8 << 20,
        lifetime_s: float = 3600.0,
        idle_s: float = 5.0,
    ):
        if isinstance(upstream, int):
            self.upstream = ("127.0.0.1", upstream)
        else:
            host, _, port = upstream.split("://", 1)[-1].rstrip("/").rpartition(":")
            self.upstream = (host or "127.0.0.1", int(port))
        if self.upstream[0] not in ("127.0.0.1", "localhost"):
            raise ValueError(f"DelayProxy forwards to loopback only, not {upstream!r}")
        self.delay_s = float(delay_s)
        self.max_connections = max_connections
        self.max_buffer = max_buffer
        self.lifetime_s = lifetime_s
        self.idle_s = idle_s
        self.port = 0
        self.max_waiting = 0
        #: a list to record (monotonic time, request line) of each request in, or None
        self.trace: list[tuple[float, str]] | None = None
        #: a list to record a :class:`Seen` of each request, or None
        self.log: list[Seen] | None = None
        #: text of the request lines ``max_watched`` counts (e.g. ``"/media/"``), or None
        self.watch: str | None = None
        self.max_watched = 0
        self._watched = 0
        self._counts = Counts()
        self._waiting = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    # -- public -------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, storage_options: dict[str, str]) -> dict[str, str]:
        """``storage_options`` with the endpoint replaced by this proxy."""
        return dict(storage_options, aws_endpoint=self.endpoint)

    def counts(self) -> Counts:
        """Requests and bytes so far."""
        with self._lock:
            c = self._counts
            return Counts(c.requests, c.bytes_in, c.bytes_out, c.body_out)

    def reset_peak(self) -> None:
        """Start measuring ``max_waiting`` and ``max_watched`` afresh."""
        with self._lock:
            self.max_waiting = self._waiting
            self.max_watched = self._watched

    def start(self, timeout: float = 10.0) -> Self:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="delay-proxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout) or not self.port:
            raise RuntimeError("DelayProxy did not start")
        return self

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop -----------------------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(ready))
        finally:
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(self.max_connections)
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        tasks: set[asyncio.Task[Any]] = set()
        self._tasks = tasks
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.lifetime_s)
        finally:
            server.close()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            async with self._slots:  # beyond max_connections, a connection waits its turn
                sr, sw = await asyncio.open_connection(*self.upstream)
                try:
                    await self._pump(cr, cw, sr, sw)
                finally:
                    sw.close()
        except (asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            cw.close()
            self._tasks.discard(task)

    async def _pump(
        self,
        cr: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        sr: asyncio.StreamReader,
        sw: asyncio.StreamWriter,
    ) -> None:
        # answered: the next client bytes open a request; watched: it is one watch names
        state: dict[str, Any] = {"waiting": False, "answered": True, "watched": False,
                                 "seen": None}  # fmt: skip
        last = [time.monotonic()]  # of the last bytes either way
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        room = asyncio.Semaphore(max(1, self.max_buffer // _CHUNK))

        async def up_read() -> None:
            while data := await cr.read(_CHUNK):
                last[0] = time.monotonic()
                await room.acquire()
                with self._lock:
                    self._counts.bytes_in += len(data)
                    if state["answered"]:
                        self._opened(state, data)
                held.put_nowait((time.monotonic() + self.delay_s, data))
            held.put_nowait((0.0, b""))

        async def up_write() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    with contextlib.suppress(OSError):
                        sw.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sw.write(data)
                room.release()
                await sw.drain()

        async def down() -> None:
            while data := await sr.read(_CHUNK):
                last[0] = time.monotonic()
                with self._lock:
                    self._counts.bytes_out += len(data)
                    if not state["answered"]:
                        self._status(state, data)
                    state["answered"] = True
                    self._answered(state)
                cw.write(data)
                await cw.drain()

        async def idle() -> None:  # a keep-alive connection unused for idle_s is closed
            while True:
                await asyncio.sleep(self.idle_s / 4)
                quiet = time.monotonic() - last[0] > self.idle_s
                if quiet and not state["waiting"] and held.empty():
                    return

        tasks = [asyncio.ensure_future(f()) for f in (up_read, up_write, down)]
        watchdog = asyncio.ensure_future(idle())
        try:
            await asyncio.wait([*tasks, watchdog], return_when=asyncio.FIRST_COMPLETED)
            if not watchdog.done():  # the client closed: let the held bytes and the answer through
                await asyncio.wait(tasks, timeout=self.delay_s + 5.0)
        finally:
            for t in [*tasks, watchdog]:
                t.cancel()
            await asyncio.gather(*tasks, watchdog, return_exceptions=True)
            with self._lock:
                self._answered(state)

    def _opened(self, state: dict[str, Any], data: bytes) -> None:
        """A request starts on a connection (``data``: its first bytes). Under the lock."""
        state["answered"], state["waiting"] = False, True
        self._counts.requests += 1
        state["seen"] = seen = _seen(data)
        if self.log is not None:
            self.log.append(seen)
        line = data.split(b"\r\n", 1)[0][:200].decode("latin-1")
        if self.trace is not None:
            self.trace.append((time.monotonic(), line))
        self._waiting += 1
        self.max_waiting = max(self.max_waiting, self._waiting)
        if self.watch is not None and self.watch in line:
            state["watched"] = True
            self._watched += 1
            self.max_watched = max(self.max_watched, self._watched)

    def _status(self, state: dict[str, Any], data: bytes) -> None:
        """The first bytes of the answer to the request open on a connection. Under the lock."""
        seen: Seen | None = state["seen"]
        head = data.split(b"\r\n\r\n", 1)[0]
        parts = head.split(b" ", 2)
        m = _LENGTH.search(head)
        body = int(m.group(1)) if m and seen is not None and seen.method != "HEAD" else 0
        self._counts.body_out += body
        if seen is not None:
            seen.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            seen.body = body

    def _answered(self, state: dict[str, Any]) -> None:
        """The request on a connection is answered (or the connection ends). Under the lock."""
        if state["waiting"]:
            state["waiting"] = False
            self._waiting -= 1
        if state["watched"]:
            state["watched"] = False
            self._watched -= 1

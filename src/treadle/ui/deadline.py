"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers (slow-loris).

uvicorn closes a connection idle between requests (``timeout_keep_alive``), but not one
that connects and sends nothing, nor one that sends its request line and headers a byte
at a time: each such client held a connection (and a file descriptor) for as long as it
liked, so enough of them kept every other client out. Here a connection whose request
headers are not complete :data:`HEADER_SECONDS` after it opened, or after its previous
response, is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_SECONDS = 20.0
"""Seconds a client has to send a whole request line and headers."""


class DeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` that closes a connection whose request headers are late."""

    _deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._deadline = self.loop.call_later(HEADER_SECONDS, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm()  # still before (the next request's) headers: the deadline stands
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request's headers: from now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

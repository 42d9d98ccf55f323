"""Reads of one object in several requests (byte ranges, a copy in parts) that never mix
two objects.

An object replaced by another of the same size between two reads (re-uploaded, a bucket
without versioning) would give a reader bytes of both: a silent wrong value. So every
ranged read asks for one version of the object, by its ETag: the one the request names
(:attr:`RangeRequest.etag`), else the one the first read of that key through this
:class:`Store` saw (its *pin*). The store is asked with ``If-Match`` (S3, GCS and Azure
answer 412 for another version) and each answer's own ETag is compared too (a server that
ignores ``If-Match``); a mismatch is :class:`~treadle.storage.store_errors.ChangedObject`
naming the object and both versions, never bytes. An object whose store gives no ETag is
not checked.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import obstore
from obstore.exceptions import PreconditionError

from treadle.errors import CredentialsError, NotFound, StorageError
from treadle.storage.coalesce import coalesced
from treadle.storage.fileio import write_at
from treadle.storage.loop import _Loop, request
from treadle.storage.objects import RangeRequest
from treadle.storage.retry import _RETRY_ATTEMPTS, _RETRY_BUDGET_S, _backoff, _transient, spent
from treadle.storage.store_errors import ChangedObject, ShortObject, no_answer

#: requests of one object in flight per call (object_store's ``get_ranges`` sends 10)
PARALLEL_RANGES = 10


class Pins:
    """The ETag each key was first read at. Readers on several threads share a store: a
    ``dict.setdefault`` of a ``str`` key is atomic (no lock, so none a fork could copy held)."""

    def __init__(self) -> None:
        self._etags: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self._etags.get(key)

    def settle(self, key: str, etag: str) -> str:
        """The ETag ``key`` is pinned to: ``etag`` unless another read pinned it first."""
        return self._etags.setdefault(key, etag)


class RangedReads:
    """:class:`~treadle.storage.store.Store`'s reads of byte ranges (a mixin: ``_inner``,
    ``url``, ``_claim`` and ``_error`` are the store's)."""

    _inner: Any
    url: str
    place: str
    _pins: Pins

    def _claim(self, op: str, key: str) -> None:
        raise NotImplementedError

    def _error(self, op: str, key: str, e: Exception) -> Exception:
        raise NotImplementedError

    def pinned(self, key: str) -> str | None:
        """The version (ETag) this store's reads of ``key`` are of: the one its first read
        saw, or :meth:`pin` named; None before any (or where the store gives no ETag)."""
        return self._pins.get(key)

    def pin(self, key: str, etag: str) -> None:
        """Pin ``key`` to version ``etag``, one recorded elsewhere (the node's chunk cache,
        by another process): later reads of it through this store ask for that version;
        :class:`ChangedObject` where this store's reads saw another."""
        if (had := self._pins.settle(key, etag)) != etag:
            raise self._changed(key, had, etag)

    def get_ranges(self, requests: Sequence[RangeRequest], copy: bool = True) -> list[Any]:
        """Fetch many byte ranges, many requests in flight; ranges of one object closer than
        1 MiB are one request (:func:`~treadle.storage.coalesce.coalesced`). Every range of
        one object comes from one version of it (see the module). ``copy=False``: views of
        obstore's buffers (any bytes-like use, e.g. ``os.pwrite``), not ``bytes`` (a copy of
        each, made holding the GIL)."""
        self._claim("read", requests[0].key if requests else "")
        if not requests:
            return []
        _Loop.get()  # a StorageError after the exit hook, before any coroutine exists
        by_key: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            if not 0 <= r.start <= r.end:
                raise ValueError(f"no such range of {self.url}/{r.key}: [{r.start}, {r.end})")
            by_key.setdefault(r.key, []).append(i)

        async def one(key: str, idx: list[int]) -> tuple[list[int], list[Any]]:
            return idx, await self._ranges_of(key, [requests[i] for i in idx])

        out: list[Any] = [b""] * len(requests)
        for idx, bufs in _Loop.run(_Loop.gather([one(k, v) for k, v in by_key.items()])):
            for i, b in zip(idx, bufs):
                out[i] = bytes(b) if copy else b
        return out

    async def _ranges_of(self, key: str, reqs: Sequence[RangeRequest]) -> list[Any]:
        """The ranges ``reqs`` of ``key``: one request per run of close ones, at most
        :data:`PARALLEL_RANGES` in flight."""
        etags = {r.etag for r in reqs if r.etag is not None}
        if len(etags) > 1:
            raise ValueError(f"ranges of {key!r} ask for {len(etags)} versions: {sorted(etags)}")
        named = next(iter(etags), None)
        spans = coalesced([(r.start, r.end) for r in reqs])
        limit = asyncio.Semaphore(PARALLEL_RANGES)

        async def span(a: int, b: int) -> Any:
            async with limit:
                return await self._range(key, a, b, named)

        bufs = await _Loop.gather([span(a, b) for a, b in spans])
        starts, out = [a for a, _ in spans], []
        for r in reqs:
            k = bisect.bisect_right(starts, r.start) - 1  # spans are sorted and disjoint
            a, b = spans[k]
            view = bufs[k] if (a, b) == (r.start, r.end) else memoryview(bufs[k])[r.start - a :]
            if len(view) < r.end - r.start:  # cut short
                raise await self._short_or(key, b, None)
            out.append(view if len(view) == r.end - r.start else view[: r.end - r.start])
        return out

    async def _range(self, key: str, start: int, end: int, named: str | None) -> Any:
        """Bytes ``[start, end)`` of ``key`` (fewer where it is shorter), of the version
        ``named``, else the one ``key`` is pinned to (pinned to this one if none)."""
        if start >= end:
            return b""
        expect = named if named is not None else self._pins.get(key)
        options: dict[str, Any] = {"range": (start, end)}
        if expect is not None:
            options["if_match"] = expect

        async def call() -> Any:
            got = await request(obstore.get_async(self._inner, key, options=options))
            return got.meta.get("e_tag"), await request(got.bytes_async())

        etag, buf = await self._read(key, end, call, expect)
        if etag is not None:
            first = expect if expect is not None else self._pins.settle(key, etag)
            if first != etag:  # a server that ignored If-Match, or two first reads
                raise self._changed(key, first, etag)
        return buf

    def download(self, key: str, fd: int, size: int, part: int, parallel: int) -> None:
        """Write the ``size`` bytes of ``key`` into the open file ``fd`` (at their offsets):
        parts of ``part`` bytes, ``parallel`` of them in flight (one GET each, retried), all
        of one version of it (see the module)."""
        self._claim("read", key)
        if not size:
            return
        limit = asyncio.Semaphore(max(1, parallel))

        async def one(own: int, start: int) -> None:
            end = min(size, start + part)
            async with limit:
                buf = await self._range(key, start, end, None)
                if len(buf) != end - start:
                    raise await self._short_or(key, end, None)
                write_at(own, memoryview(buf), start)  # a short write: an error, not a hole

        async def every(own: int) -> None:
            await _Loop.gather([one(own, s) for s in range(0, size, part)])

        # the parts write through a duplicate of ``fd``, closed once they ended: a caller
        # that gives up (Ctrl-C) closes ``fd`` at once, while a part may still write
        _Loop.run_through_dup(fd, every)

    async def _read(self, key: str, end: int, call: Callable[[], Awaitable[Any]],
                    expect: str | None = None) -> Any:  # fmt: skip
        """``await call()``, one obstore read of ``key`` up to ``end``, retried while the
        error is transient (within the retry budget); else :meth:`_short_or`'s error, or
        :class:`ChangedObject` where the store has no version ``expect`` (``If-Match``)."""
        start = time.monotonic()
        for attempt in range(_RETRY_ATTEMPTS):
            try:
                return await call()
            except Exception as e:
                if isinstance(e, PreconditionError) and expect is not None:
                    raise self._changed(key, expect, await self._etag_now(key)) from None
                last = attempt == _RETRY_ATTEMPTS - 1 or time.monotonic() >= start + _RETRY_BUDGET_S
                if last or not _transient(e):
                    # a range past the end: InvalidRange, a Rust panic when coalesced
                    raise await self._short_or(key, end, spent(e, attempt, start)) from None
            await asyncio.sleep(_backoff(attempt))
        raise AssertionError("unreachable: the last attempt raises")

    async def _etag_now(self, key: str) -> str | None:
        try:
            return (await request(obstore.head_async(self._inner, key))).get("e_tag")
        except Exception:  # noqa: BLE001 - only for the message: gone, or unreachable
            return None

    def _changed(self, key: str, first: str, now: str | None) -> ChangedObject:
        return ChangedObject(
            f"object {self.url}/{key} changed while it was being read: a read of it saw "
            f"version (ETag) {first}, a later one {now or 'another (or none: deleted)'}; it was "
            "replaced in the store (re-uploaded, or written again), and the bytes read would "
            "mix two objects. Restore the object (a table's data files never change once "
            "written), or, for a file being imported, import it again once it stays put",
            key,
            first,
            now,
        )

    async def _short_or(self, key: str, end: int, e: Exception | None) -> Exception:
        """:class:`ShortObject` (a ``CorruptData``) naming ``key`` when it is shorter than
        ``end`` (cut short or replaced), else the error ``e`` was."""
        err = None if e is None else self._error("read", key, e)
        if isinstance(err, (NotFound, CredentialsError)):  # not a range: no HEAD to ask
            return err
        if err is not None and no_answer(e):  # a HEAD would wait as long again
            return err
        try:
            size = int((await request(obstore.head_async(self._inner, key)))["size"])
        except Exception as head:
            return err if err is not None else self._error("stat", key, head)
        if size >= end:
            return err or StorageError(f"read {self.url}/{key} returned fewer bytes than asked")
        return ShortObject(
            f"object {self.url}/{key} is {size} bytes, but a read asked for bytes up to {end} "
            "(what was written there): it was cut short or replaced after it was written "
            "(write it again: re-append the episode that stored it)",
            key,
            size,
        )

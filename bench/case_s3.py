"""Case 3: cases 1 and 2 with the tables on a real S3 server (SeaweedFS on 127.0.0.1).

The local treadle projects of cases 1 and 2 are copied byte for byte into the bucket, then
read by ``td.TrainLoader`` through ``s3://``. The limit is raw parallel range GETs of the
same bytes with ``obstore`` (many requests in flight on one event loop, no decode):

- image + action: per batch, 19 + 45 ranges of one sample's size (image + action bytes) at
  random row-aligned offsets of the two tables' Lance data files;
- video: the exact byte range each of treadle's windows needs (``plan_window`` over the
  same plan), so GET-only useful frames/s.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_BYTES = 64 * 64 * 3 + 7 * 4


def upload(s3: Any, local: Path, prefix: str) -> int:
    """Copy every file under ``local`` to ``prefix/`` in the bucket; bytes copied."""
    import obstore

    store = raw_store(s3)
    total = 0
    for dirpath, _, files in os.walk(local):
        for f in files:
            p = Path(dirpath) / f
            key = f"{prefix}/{p.relative_to(local).as_posix()}"
            data = p.read_bytes()
            obstore.put(store, key, data)
            total += len(data)
    return total


def raw_store(s3: Any) -> Any:
    from obstore.store import S3Store

    o = s3.storage_options()
    return S3Store(
        s3.bucket,
        endpoint=o["aws_endpoint"],
        access_key_id=o["aws_access_key_id"],
        secret_access_key=o["aws_secret_access_key"],
        region=o["aws_region"],
        client_options={"allow_http": True},
        virtual_hosted_style_request=False,
    )


def lance_files(local_treadle: Path, prefix: str) -> list[tuple[str, int]]:
    """(bucket key, size) of each table's Lance data files."""
    out = []
    for p in sorted(local_treadle.glob("projects/bench/tables/*.lance/data/*.lance")):
        out.append((f"{prefix}/{p.relative_to(local_treadle).as_posix()}", p.stat().st_size))
    return out


def mix_batches(files: list[tuple[str, int]], batches: int, seed: int = 0) -> list[list[tuple]]:
    """Per batch: (key, start, end) of 19 + 45 sample-sized ranges in the two tables' files."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        b = []
        for (key, size), k in zip(files[:2], (19, 45)):
            rows = max(1, size // SAMPLE_BYTES - 1)
            for r in np.sort(rng.integers(0, rows, k)):
                b.append((key, int(r) * SAMPLE_BYTES, int(r + 1) * SAMPLE_BYTES))
        out.append(b)
    return out


def raw_get(store: Any, batches: list[list[tuple]], in_flight: int = 8) -> tuple[float, int]:
    """GET every range of ``batches`` (``in_flight`` batches at once); (wall s, bytes)."""
    import obstore

    async def one(batch: list[tuple]) -> int:
        by_key: dict[str, list[tuple[int, int]]] = {}
        for key, s, e in batch:
            by_key.setdefault(key, []).append((s, e))
        got = await asyncio.gather(
            *(
                obstore.get_ranges_async(store, k, starts=[s for s, _ in v], ends=[e for _, e in v])
                for k, v in by_key.items()
            )
        )
        return sum(len(x) for parts in got for x in parts)

    async def run() -> int:
        sem = asyncio.Semaphore(in_flight)

        async def guarded(b: list[tuple]) -> int:
            async with sem:
                return await one(b)

        return sum(await asyncio.gather(*(guarded(b) for b in batches)))

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(one(batches[0]))  # connect, warm up
        t0 = time.perf_counter()
        n = loop.run_until_complete(run())
        return time.perf_counter() - t0, n
    finally:
        loop.close()

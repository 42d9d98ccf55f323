"""The chunk store's make-room round with many objects in its folder, timed (issue 48).

A make-room round (``ChunkStore._room``: one scan per reservation, under the folder's lock) counts the bytes the
folder holds and, when a chunk does not fit, evicts the chunks needed farthest ahead. This
script builds a chunk folder of ``--objects`` objects of ``--chunks`` chunks each (1 KiB
chunks, a fake store whose bytes are a function of key and offset), of which ``--live`` hold
their chunks (present, fetched through the store's API) and the others hold none (as after
their chunks were evicted), and times, median over ``--rounds``:

- ``fits``: a round where the chunk fits (nothing to evict);
- ``evicts``: a round in a full cache (one chunk evicted);
- ``used``: ``ChunkStore.used()``.

It also prints the files left in the folder and the objects a round visits. The first
round after the objects were emptied is timed apart (``first``): it may remove their files.

``python bench/chunk_scan.py [--objects 20000] [--live 64] [--chunks 2] [--rounds 9]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from treadle.storage.chunkstore import ChunkStore
from treadle.storage.filecache import _locked

CHUNK = 1024


class FakeStore:
    """A store of immutable objects whose bytes are a function of key and offset."""

    url = "fake://bench"

    def get_ranges(self, reqs, copy=True):
        return [bytes((hash(r.key) + i) & 255 for i in range(r.start, r.end)) for r in reqs]


def build(folder: Path, objects: int, live: int, chunks: int) -> ChunkStore:
    """A store whose folder has ``objects`` objects, the first ``live`` holding every chunk,
    made by another store (as by the other processes of a node: the store timed has none of
    them mapped, and no process keeps 20,000 objects open)."""
    builder = ChunkStore(folder, live * chunks * CHUNK, CHUNK)
    store = FakeStore()
    for i in range(objects):
        obj = builder.object(store, f"data/{i:06d}.lance", chunks * CHUNK)
        if i < live:  # one round each, with room: fetched and kept
            builder.fetch(store, obj, list(range(chunks)), [1000 + i] * chunks, now=0)
        else:
            builder._objects.pop(obj.name).close()
    for obj in list(builder._objects.values()):
        obj.close()
    return ChunkStore(folder, live * chunks * CHUNK, CHUNK)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def round_fits(cs: ChunkStore) -> None:
    with _locked(cs.directory / ".lock"):
        cs._room(0, {}).make(0, 1)
        cs._folder.let_go()


def round_evicts(cs: ChunkStore, step: int) -> None:
    with _locked(cs.directory / ".lock"):
        assert cs._room(0, {}).make(CHUNK, step)
        cs._folder.let_go()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=20000)
    ap.add_argument("--live", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "chunks"
        t = time.perf_counter()
        cs = build(folder, args.objects, args.live, args.chunks)
        print(f"built {args.objects} objects ({args.live} live) in {time.perf_counter() - t:.1f} s")
        print(f"files in the folder: {len(os.listdir(folder))}")
        first = timed(lambda: round_fits(cs))
        print(f"files after one round: {len(os.listdir(folder))}")
        fits = [timed(lambda: round_fits(cs)) for _ in range(args.rounds)]
        used = [timed(cs.used) for _ in range(args.rounds)]
        evicts = [timed(lambda s=s: round_evicts(cs, s)) for s in range(args.rounds)]
        visited = getattr(getattr(cs, "_folder", None), "scanned", None)
        print(
            f"objects={args.objects} live={args.live} chunks={args.chunks}: "
            f"first {first * 1e3:.1f} ms, fits {statistics.median(fits) * 1e3:.2f} ms, "
            f"evicts {statistics.median(evicts) * 1e3:.2f} ms, "
            f"used {statistics.median(used) * 1e3:.2f} ms (median of {args.rounds})"
            + (f", last scan visited {visited}" if visited is not None else "")
        )


if __name__ == "__main__":
    main()

"""Shuffle quality of ``td.BlockShuffle`` against MosaicML Streaming's ``py1e`` at the same
block size, on the same data (issue 48).

The data: one table of episodes (lengths drawn from 50..500, seeded), one component, every
moment eligible. Each order is one epoch: the eligible index at every position.

- ``full``: treadle's default full permutation (:mod:`treadle.plan.order_full`);
- ``block w=W``: ``td.BlockShuffle(block_rows=S, window_blocks=W)`` (:mod:`treadle.plan.order_block`);
- ``py1e``: ``streaming.base.shuffle.get_shuffle_py1e`` over shards of ``--shard-rows`` rows,
  one canonical node, ``block_size=S``.

Columns: ``|rho|``: Spearman rank correlation between position and table order (0: no trace of
the table's order; 1: table order); ``>=k eps``: share of batches of ``--batch`` consecutive
positions that hold samples of at least ``k`` distinct episodes; ``chunks/win``: distinct
chunks of ``--shard-rows`` rows read by a window of ``S`` consecutive positions (what a cache
must hold while those draws are read; a full permutation reads about ``min(S, rows/chunk)``).

    python bench/shuffle_quality.py [--episodes 2000] [--batch 256] [--sizes 4096,16384,65536]
"""

from __future__ import annotations

import argparse

import numpy as np

from treadle.plan.order_block import BlockOrder
from treadle.plan.order_full import FullOrder


def _streaming_py1e():
    import torch

    try:  # PyPI's CUDA torchvision on CPU torch: the two op schemas it registers first
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _streaming_py1e.lib = lib  # type: ignore[attr-defined]
    except RuntimeError:
        pass
    from streaming.base.shuffle.py1e import get_shuffle_py1e

    return get_shuffle_py1e


def orders(rows: int, size: int, shard_rows: int, seed: int) -> dict[str, np.ndarray]:
    """Name -> one epoch's order (eligible index at each position)."""
    idx = np.arange(rows, dtype=np.int64)
    zero = np.zeros(rows, np.int64)
    out = {"full": FullOrder(seed, [rows]).eligible(zero, zero, idx)}
    for w in (1, 4, 16):
        out[f"block w={w}"] = BlockOrder(seed, [rows], [size], w, 1).eligible(zero, zero, idx)
    shards = np.full(rows // shard_rows, shard_rows, np.int64)
    if rows % shard_rows:
        shards = np.append(shards, rows % shard_rows)
    py1e = _streaming_py1e()
    out["py1e"] = np.asarray(py1e(shards, 1, seed, 0, size), np.int64)
    return out


def quality(order: np.ndarray, episode: np.ndarray, batch: int, size: int, chunk: int) -> dict:
    n = order.size
    assert np.array_equal(np.sort(order), np.arange(n)), "not a permutation"
    pos = np.arange(n, dtype=np.float64)
    rho = float(np.corrcoef(pos, order.astype(np.float64))[0, 1])  # ranks are the values
    full = n // batch * batch
    eps = episode[order[:full]].reshape(-1, batch)
    distinct = np.array([len(np.unique(r)) for r in eps])
    wins = order[: n // size * size].reshape(-1, size) // chunk
    chunks = float(np.mean([len(np.unique(r)) for r in wins]))
    return {"rho": abs(rho), "distinct": distinct, "chunks": chunks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--sizes", default="4096,16384,65536")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 501, args.episodes)
    episode = np.repeat(np.arange(args.episodes), lengths)
    rows = int(lengths.sum())
    ks = (args.batch // 8, args.batch // 4, args.batch // 2)
    print(f"{rows:,} rows in {args.episodes:,} episodes (mean {rows / args.episodes:.0f}); "
          f"batches of {args.batch}; chunks of {args.shard_rows} rows")  # fmt: skip
    head = f"{'block rows':>10}  {'order':<11} {'|rho|':>7} " + " ".join(
        f"{'>=' + str(k) + ' eps':>9}" for k in ks
    ) + f" {'mean eps':>8} {'chunks/win':>10}"  # fmt: skip
    print(head)
    for size in (int(s) for s in args.sizes.split(",")):
        for name, order in orders(rows, size, args.shard_rows, args.seed).items():
            q = quality(order, episode, args.batch, size, args.shard_rows)
            shares = " ".join(f"{float(np.mean(q['distinct'] >= k)):>9.3f}" for k in ks)
            print(f"{size:>10}  {name:<11} {q['rho']:>7.4f} {shares} "
                  f"{q['distinct'].mean():>8.1f} {q['chunks']:>10.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

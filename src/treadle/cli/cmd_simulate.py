"""``treadle simulate RECIPE --nodes N --ranks-per-node R --cache-bytes C --bandwidth B
--latency L``: walk a run's plan exactly and report, per node, what it asks of the object
store. ``RECIPE`` is a recipe file (as ``treadle plan`` reads) or ``synthetic:oxe``, a
26-table mix the size of Open X-Embodiment. What it prints, and what to set at 8 to 4,096
GPUs: docs/scale.md (the model: :mod:`treadle.plan.simulate`)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from typing import Any

from treadle.cli.args import int_at_least
from treadle.errors import PlanError, TreadleError

_REQUIRED = ("nodes", "ranks-per-node", "cache-bytes", "bandwidth", "latency")
_LATENCY = re.compile(r"^\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


_NEGATIVE = re.compile(r"^-[0-9.]+[A-Za-z]*$")
"""Values argparse must take as values, not options: ``--cache-bytes -5G`` said only
"expected one argument" (it reads ``-5G`` as an option; ``-5`` it knows as a number)."""


def _size(text: str) -> int:
    from treadle.storage.filecache import parse_bytes

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative: give a size of at least 1 byte")
    try:
        value = parse_bytes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 64G, 4M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def _latency(text: str) -> float:
    m = _LATENCY.match(text)
    try:
        value = float(m.group(1)) if m else None
    except ValueError:  # digits and dots that are no number: "1.2.3"
        value = None
    if value is None or not math.isfinite(value):  # "1e400s": an exponent past float's range
        raise argparse.ArgumentTypeError(f"{text!r} is not a latency (e.g. 30ms, 0.03)")
    if m and m.group(2) is None and value >= 1:  # "30" meant as ms modelled 30 s, silently
        raise argparse.ArgumentTypeError(
            f"{text!r} is {value:g} seconds a request: write {text.strip()}ms, or {text.strip()}s"
        )
    return value / (1000 if m and m.group(2) == "ms" else 1)


def _rate(text: str) -> float:
    """A positive, finite samples/s (``-5``, ``0`` and ``nan`` printed negative or nan GET/s)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of samples/s") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of samples/s, got {text!r}")
    return value


_OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    ("--nodes", int_at_least(1), None, "nodes"),
    ("--ranks-per-node", int_at_least(1), None, "ranks (GPUs) per node"),
    ("--cache-bytes", _size, None, "cache per node, e.g. 2T"),
    ("--bandwidth", _size, None, "bytes/s per node, e.g. 2G"),
    ("--latency", _latency, None, "per request, e.g. 30ms, 0.03 or 2s"),
    ("--steps", int_at_least(1), 200, "steps per window (default 200)"),
    ("--windows", int_at_least(1), 1, "contiguous windows of --steps spread over --run-steps"),
    ("--run-steps", int_at_least(1), None, "the run's length, for --windows"),
    (
        "--chunk-bytes",
        _size,
        None,
        "cache chunk size (default 1M; under a 16M cache, the "
        "largest power of two it holds 16 of, as a loader picks)",
    ),
    ("--lookahead", int_at_least(0), 2, "steps fetched ahead (default 2)"),
    (
        "--read-ahead",
        int_at_least(1),
        8,
        "batches the reader reads ahead: the lookahead "
        "fetches at least this + 1 steps ahead (default 8, a loader's on an object store)",
    ),
    ("--in-flight", int_at_least(1), 64, "requests in flight per node (default 64)"),
    ("--sample-nodes", int_at_least(1), 4, "nodes replayed, spread evenly (default 4)"),
    ("--rank-rate", _rate, None, "samples/s a rank consumes (default: what the link allows)"),
    ("--batch-per-rank", int_at_least(1), None, "batch size = this x the rank count"),
    ("--block-rows", int_at_least(1), None, "BlockShuffle block_rows (default: from the cache)"),
    ("--window-blocks", int_at_least(1), None, "BlockShuffle window_blocks (default 4)"),
    ("--partitions", int_at_least(1), None, "BlockShuffle partitions (default 1)"),
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``treadle simulate`` to the top parser's sub-commands."""
    p = subparsers.add_parser(
        "simulate",
        help="walk a run's plan and report each node's downloads, hit rate and GET/s",
        description=__doc__,
    )
    p.add_argument("recipe", help="a .toml or .py recipe, or synthetic:oxe")
    p.add_argument("--root", default=None, help="store root (overrides the TOML file's root)")
    for flag, kind, default, text in _OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text,
                       required=flag[2:] in _REQUIRED)  # fmt: skip
    p.add_argument(
        "--shuffle",
        choices=["recipe", "full", "block"],
        default="recipe",
        help="the recipe's, the full permutation, or td.BlockShuffle (options above)",
    )
    p.add_argument(
        "--pages",
        action="store_true",
        help="read each data file's footer: rows at the byte offsets the loader's chunk cache "
        "reads them from (wide columns only; default: all of a row's bytes from byte 0), and "
        "video windows' stream ranges from the stream index",
    )
    p._negative_number_matcher = _NEGATIVE  # argparse's own (private): no flag starts "-<digit>"
    p.set_defaults(func=simulate_command)
    return p


def _recipe(args: argparse.Namespace) -> Any:
    """The recipe to walk, with the command's overrides; synthetic tables when asked."""
    import treadle as td
    from treadle.plan.synthetic import oxe_tables

    if args.recipe == "synthetic:oxe":
        tables = oxe_tables()
        comps = [td.Component(t, weight=max(1, round(t.num_moments / 1000))) for t in tables]
        recipe = td.Recipe(0, 64, comps)
    elif args.recipe.startswith("synthetic:"):
        raise PlanError(f"unknown synthetic recipe {args.recipe!r} (there is synthetic:oxe)")
    else:
        from treadle.cli.recipe_files import load_recipe

        options = getattr(args, "storage_options", None) or None
        recipe = load_recipe(args.recipe, args.root, options)
    world = args.nodes * args.ranks_per_node
    if args.batch_per_rank is None and recipe.batch_size % world:
        raise PlanError(f"batch size {recipe.batch_size} is not divisible by {args.nodes} nodes "
                        f"x {args.ranks_per_node} ranks = {world} ranks: give --batch-per-rank "
                        f"N (a global batch of N x {world})")  # fmt: skip
    batch = recipe.batch_size if args.batch_per_rank is None else args.batch_per_rank * world
    shuffle = recipe.shuffle
    given = [
        f for f in ("block_rows", "window_blocks", "partitions") if getattr(args, f) is not None
    ]
    if given and args.shuffle != "block":
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise PlanError(f"{flags} set the BlockShuffle of --shuffle block; with --shuffle "
                        f"{args.shuffle} they would be ignored")  # fmt: skip
    if args.shuffle == "full":
        shuffle = None
    elif args.shuffle == "block":
        shuffle = td.BlockShuffle(args.block_rows, args.window_blocks, args.partitions or 1)
    return td.Recipe(recipe.seed, batch, recipe.components, recipe.schedule,
                     weigh_by=recipe.weigh_by, shuffle=shuffle)  # fmt: skip


def _steps(args: argparse.Namespace) -> tuple[list[list[int]], str]:
    run = args.run_steps or args.steps * args.windows
    if run < args.steps * args.windows:  # the windows would overlap: steps counted twice
        raise PlanError(f"--run-steps {run} is shorter than --windows {args.windows} x --steps "
                        f"{args.steps} = {args.steps * args.windows} steps")  # fmt: skip
    starts = [i * max(run - args.steps, 0) // max(args.windows - 1, 1) for i in range(args.windows)]
    windows = [list(range(s, s + args.steps)) for s in starts]
    where = ", ".join(f"{w[0]}..{w[-1]}" for w in windows[:6])
    return windows, f"{args.steps * len(windows)} steps in {len(windows)} windows ({where})"


def _pages(plan: Any, setup: Any, folder: str) -> tuple[Any, Any]:
    """The tables' true pages (:func:`treadle.read.simpages.page_layout`) and their video
    windows' stream ranges (:func:`treadle.read.simpages.media_windows`)."""
    from treadle.read.simpages import media_windows, page_layout
    from treadle.read.steps import host_reader
    from treadle.storage.chunkstore import ChunkStore

    if any(getattr(t, "rows_per_object", None) is not None for t in plan.tables):
        raise PlanError("--pages reads Lance tables' footers: a synthetic recipe has none")
    layout = page_layout(plan.tables, ChunkStore(folder, setup.cache_bytes, setup.chunk_bytes))
    reader = host_reader(plan, read_ahead=1, fixed_columns=False, copy_objects=False)
    return layout, media_windows(reader)


def simulate_command(args: argparse.Namespace) -> int:
    """``treadle simulate``: one report; 1 with a clear message on bad input."""
    from treadle.plan.simreport import render
    from treadle.plan.simulate import Link, Setup, simulate

    try:
        if args.chunk_bytes is None:  # as the loader's chunk store picks it
            from treadle.storage.chunkfiles import default_chunk_bytes

            args.chunk_bytes = default_chunk_bytes(args.cache_bytes)
        if args.cache_bytes < args.chunk_bytes:  # was modelled as one chunk, silently
            raise PlanError(f"--cache-bytes {args.cache_bytes:,} B is less than one chunk "
                            f"(--chunk-bytes {args.chunk_bytes:,} B): a loader's chunk cache "
                            "is off then, every row a Lance take")  # fmt: skip
        recipe = _recipe(args)
        saved = os.environ.get("TREADLE_CACHE_BYTES")
        os.environ["TREADLE_CACHE_BYTES"] = str(args.cache_bytes)  # BlockShuffle()'s sizing
        try:
            plan = recipe.plan()
        finally:
            if saved is None:
                del os.environ["TREADLE_CACHE_BYTES"]
            else:
                os.environ["TREADLE_CACHE_BYTES"] = saved
        setup = Setup(args.nodes, args.ranks_per_node, args.cache_bytes, args.chunk_bytes,
                      args.lookahead, args.sample_nodes, read_ahead=args.read_ahead)  # fmt: skip
        link = Link(float(args.bandwidth), args.latency, args.in_flight)
        windows, walked = _steps(args)
        reports = []
        with tempfile.TemporaryDirectory() as tmp:
            layout, media = (
                _pages(plan, setup, tmp) if getattr(args, "pages", False) else (None, None)
            )
            for steps in windows:  # each window from a cold cache
                reports += simulate(plan, plan.tables, setup, link, steps, layout, media)
        sys.stdout.write(render(reports, plan, setup, link, walked, args.rank_rate))
        return 0
    except (TreadleError, ValueError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        print(f"treadle simulate: error: {lines[0]}", file=sys.stderr)
        return 1

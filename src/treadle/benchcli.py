"""``treadle bench``: the benchmark suite of ``bench/`` (treadle beside the peer loaders).

The suite lives in the repository's ``bench/`` folder (it generates data under
``bench/data/`` and writes ``bench/results/``), so this command needs a checkout: an
editable install finds it beside ``src/``; elsewhere set ``TREADLE_BENCH_DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from treadle.errors import TreadleError


def bench_dir() -> Path:
    """The ``bench/`` folder of this checkout (or ``$TREADLE_BENCH_DIR``)."""
    env = os.environ.get("TREADLE_BENCH_DIR")
    here = Path(env) if env else Path(__file__).resolve().parents[2] / "bench"
    if not (here / "suite.py").is_file():
        raise TreadleError(
            f"treadle bench needs the repository's bench/ folder (no suite.py in {here}); "
            "run it from a checkout with an editable install, or set TREADLE_BENCH_DIR"
        )
    return here


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmarks beside MosaicML Streaming, WebDataset, HF datasets, Lance, FFmpeg, S3",
        description="Run bench/suite.py: image+action mix, video windows, S3, planner.",
    )
    p.add_argument(
        "--tiny", "--quick", action="store_true", help="small sizes, one round (a smoke run)"
    )
    p.add_argument(
        "--cases", default=None, help="comma-separated subset of mix,video,s3,plan (default all)"
    )
    p.add_argument("--runs", type=int, default=None, help="rounds per case (default 3; --tiny 1)")
    p.add_argument("--out", default=None, help="folder for the JSON and PNG results")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    where = bench_dir()
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    import suite  # bench/suite.py

    argv = ["--tiny"] if args.tiny else []
    if args.cases:
        argv += ["--cases", args.cases]
    if args.runs:
        argv += ["--runs", str(args.runs)]
    if args.out:
        argv += ["--out", args.out]
    return int(suite.main(argv) or 0)

"""``treadle bench``: the benchmark suite of ``bench/`` (treadle beside the peer loaders).

The suite's code lives in the repository's ``bench/`` folder, so this command needs a
checkout: an editable install finds it beside ``src/``; elsewhere set ``TREADLE_BENCH_DIR``.
What it writes (generated data in every library's format, results JSON/Markdown/PNG) goes
under ``--dir`` (default: a new temporary folder, printed), never into the checkout unless
``--dir``/``--out`` point there.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from treadle.cli.args import int_at_least
from treadle.errors import TreadleError

DATA_ENV = "TREADLE_BENCH_DATA"  # bench/case_*.py generate their data under this folder
# bench/suite.py's CASES and OPT_IN (a test checks)
CASES = ("mix", "video", "s3", "cloud", "plan", "cold")
OPT_IN = ("import_ray", "augment", "memory", "contents", "images")


# the peer loaders the cases compare with: (module, pip name, what the rows call it)
PEERS = (
    ("streaming", "mosaicml-streaming", "MosaicML Streaming"),
    ("webdataset", "webdataset", "WebDataset"),
    ("datasets", "datasets", "HF datasets"),
    ("torchcodec", "torchcodec", "torchcodec"),
    ("spdl", "spdl", "SPDL"),
    ("lerobot", "lerobot", "LeRobotDataset"),
)


def missing_peers() -> list[tuple[str, str, str]]:
    """The entries of :data:`PEERS` whose module is not installed (found, not imported)."""
    return [p for p in PEERS if importlib.util.find_spec(p[0]) is None]


def peers_note(missing: list[tuple[str, str, str]]) -> str | None:
    """What ``treadle bench`` says before it starts when peers are missing (None: none is):
    which, that their rows will only say "not installed", and how to install them."""
    if not missing:
        return None
    names = ", ".join(f"{label} ({pip})" for _, pip, label in missing)
    return (
        f"treadle bench: {len(missing)} of {len(PEERS)} peer loaders are not installed: "
        f'{names}; their rows will say "not installed" and have no numbers. Install '
        "them from a checkout with: bash scripts/install-peers.sh (requirements/peers.txt, "
        "pinned by requirements/constraints.txt; the treadle[bench] extra brings only the "
        "chart and the S3 server)"
    )


def case_list(text: str) -> str:
    """An argparse ``type``: comma-separated names of benchmark cases, each one we have."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES + OPT_IN]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"unknown case {bad[0] if bad else text!r}; choose from {', '.join(CASES + OPT_IN)}"
        )
    return ",".join(names)


def bench_dir() -> Path:
    """The ``bench/`` folder of this checkout (or ``$TREADLE_BENCH_DIR``)."""
    env = os.environ.get("TREADLE_BENCH_DIR")
    here = Path(env) if env else Path(__file__).resolve().parents[3] / "bench"
    if not (here / "suite.py").is_file():
        raise TreadleError(
            f"treadle bench needs the repository's bench/ folder (no suite.py in {here}); "
            "run it from a checkout with an editable install, or set TREADLE_BENCH_DIR"
        )
    return here


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``treadle bench`` to the top parser's sub-commands."""
    p = subparsers.add_parser(
        "bench",
        help="benchmarks beside MosaicML Streaming, WebDataset, HF datasets, Lance, FFmpeg, S3",
        description="Run bench/suite.py: image+action mix, video windows, S3, planner.",
    )
    p.add_argument(
        "--tiny", "--quick", action="store_true", help="small sizes, one round (a smoke run)"
    )
    p.add_argument(
        "--cases",
        type=case_list,
        default=None,
        help=f"comma-separated subset of {','.join(CASES)} (default: all of them), or the "
        f"opt-in {', '.join(OPT_IN)}",
    )
    p.add_argument(
        "--runs",
        type=int_at_least(1),
        default=None,
        help="rounds per case (>= 1; default 3, --tiny 1)",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="working folder: generated data in DIR/data, results in DIR/results "
        "(default: a new temporary folder)",
    )
    p.add_argument("--out", default=None, help="folder for the results (default: DIR/results)")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    where = bench_dir()
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="treadle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ[DATA_ENV] = str(work / "data")  # spawned workers inherit it
    out = args.out or str(work / "results")
    note = peers_note(missing_peers())
    if note:
        print(note, file=sys.stderr, flush=True)
    print(f"treadle bench: data in {work / 'data'}, results in {out}", flush=True)
    import suite  # bench/suite.py

    argv = ["--tiny"] if args.tiny else []
    if args.cases:
        argv += ["--cases", args.cases]
    if args.runs:
        argv += ["--runs", str(args.runs)]
    argv += ["--out", out]
    return int(suite.main(argv) or 0)

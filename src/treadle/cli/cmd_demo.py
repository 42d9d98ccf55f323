"""``treadle demo``: a synthetic robotics project, trained for a few hundred steps.

1. Creates (once) project ``robotics`` in the store with two time-indexed tables,
   ``failed_grasps`` and ``nominal_grasps``: synthetic episodes of an H.264 wrist
   camera (a dot moving with the action) and a 7-d action per moment.
2. Builds a recipe of both tables (weights 0.3/0.7, seed 2048, windows of frames and
   actions), pins it and prints the run record card.
3. Trains a tiny policy on CPU, saving checkpoint rows. Progress is a bar on a terminal,
   one line per phase otherwise (a log file gets no carriage returns), none with ``--quiet``.
4. Simulates a crash: forgets the loader, restarts from the last checkpoint row on
   2 ranks instead of 1, and shows that every global batch matches the original.
"""

from __future__ import annotations

import argparse

from treadle.cli.args import int_at_least


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``treadle demo`` to the top parser's sub-commands."""
    p = sub.add_parser(
        "demo",
        help="train a tiny policy on a synthetic robotics project",
        description=__doc__,
    )
    p.add_argument(
        "--steps", type=int_at_least(2), default=200, help="training steps (>= 2; default 200)"
    )
    p.add_argument(
        "--checkpoint-every",
        type=int_at_least(1),
        default=50,
        help="save a checkpoint row every this many steps (>= 1; default 50)",
    )
    p.add_argument(
        "--check",
        type=int_at_least(1),
        default=6,
        help="steps replayed and compared after the simulated crash (>= 1; default 6)",
    )
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from treadle.demo import run

    return run(
        args.root,
        args.storage_options,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        check=args.check,
        quiet=args.quiet,
    )

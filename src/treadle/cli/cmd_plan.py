"""``treadle plan RECIPE.toml|recipe.py``: pin a recipe's tables and print the run record."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from treadle.cli.args import int_at_least
from treadle.errors import PlanError, TreadleError


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``treadle plan`` to the top parser's sub-commands."""
    p = subparsers.add_parser(
        "plan",
        help="pin a recipe's tables and print its run record as a card",
        description="Pin every table of a recipe (RECIPE.toml or recipe.py) and print the run "
        "record: tables with commit and moment counts, weights, per-batch counts, seed, "
        "and the first slots of each rank.",
    )
    p.add_argument("recipe", help="a .toml recipe or a .py file that defines `recipe`")
    p.add_argument("--root", default=None, help="store root (overrides the TOML file's root)")
    p.add_argument(
        "--world-size", type=int_at_least(1), default=1, help="ranks to show (>= 1; default 1)"
    )
    p.add_argument(
        "--slots", type=int_at_least(1), default=3, help="slots to show per rank (>= 1; default 3)"
    )
    p.add_argument("--json", action="store_true", help="print the run record as JSON instead")
    p.set_defaults(func=plan_command)
    return p


def plan_command(args: argparse.Namespace) -> int:
    """``treadle plan``: print the card (or ``--json``); 1 with a clear message on bad input."""
    from treadle.cli.recipe_files import load_recipe
    from treadle.plan.card import render_card

    try:
        options = getattr(args, "storage_options", None) or None
        recipe = load_recipe(args.recipe, getattr(args, "root", None), options)
        plan = recipe.plan()
        if getattr(args, "json", False):
            print(json.dumps(plan.record.to_dict(), sort_keys=True, indent=2))
            return 0
        world = getattr(args, "world_size", 1)
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise PlanError(f"--world-size must be a positive integer, got {world!r}")
        if plan.batch_size % world:
            raise PlanError(
                f"batch_size {plan.batch_size} is not divisible by --world-size {world}"
            )
        slots = max(1, int(getattr(args, "slots", 3)))
        sys.stdout.write(render_card(plan.record, world_size=world, plan=plan, slots=slots))
        return 0
    except (TreadleError, ValueError) as e:  # one line, like argparse's own errors
        lines = str(e).strip().splitlines() or [type(e).__name__]
        prefix = "" if isinstance(e, TreadleError) else f"recipe {args.recipe!r}: "
        print(f"treadle plan: error: {prefix}{lines[0]}", file=sys.stderr)
        return 1

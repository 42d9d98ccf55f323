"""The ``treadle`` command line: browse projects, plan runs, import data, run the demo."""

from __future__ import annotations

import argparse
import sys

from treadle import __version__
from treadle.cli import args, bench, demo, imports, plan, store
from treadle.errors import MissingDependency, TreadleError

COMMANDS = (store, plan, imports, demo, bench)
"""Modules with a ``register(subparsers)``, in the order of ``treadle --help``. Each imports
what its command needs when the command runs, so a missing optional dependency names that
command (:class:`MissingDependency`) and hides nothing."""


def build_parser() -> argparse.ArgumentParser:
    """The whole ``treadle`` grammar (global options on the top parser and every command)."""
    parser = argparse.ArgumentParser(
        prog="treadle",
        description=__doc__,
        epilog=args.EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"treadle {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    for leaf in args.leaf_parsers(parser):
        leaf.epilog = leaf.epilog or args.EXIT_CODES
        leaf.formatter_class = argparse.RawDescriptionHelpFormatter
    args.install(parser)
    return parser


def missing_dependency(command: str, error: ModuleNotFoundError) -> MissingDependency:
    """``treadle COMMAND`` needs a package that is not installed: say which, and for what."""
    return MissingDependency(
        f"treadle {command} needs the package {error.name.split('.')[0]!r}, which is not "
        f"installed ({error}); install it, or the treadle extra that brings it"
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``treadle ARGV``; the exit code (0 ok, 1 user error, 2 usage)."""
    parser = build_parser()
    ns = parser.parse_args(argv)  # usage errors exit 2 here, with argparse's message
    if not getattr(ns, "func", None):
        parser.print_help()
        return 0
    try:
        args.resolve(ns)
        try:
            return int(ns.func(ns) or 0)
        except ModuleNotFoundError as e:
            if not e.name or e.name.split(".")[0] == "treadle":
                raise  # a broken install, not a missing extra: the traceback says where
            raise missing_dependency(ns.command, e) from e
    except TreadleError as e:
        first = str(e).strip().splitlines()
        print(f"treadle: error: {first[0] if first else type(e).__name__}", file=sys.stderr)
        return 1

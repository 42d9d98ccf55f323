"""The treadle command line: browse projects, plan runs, import data, run the demo."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import textwrap

from treadle import __version__
from treadle.cli import args
from treadle.cli import cmd_bench as bench
from treadle.cli import cmd_demo as demo
from treadle.cli import cmd_history as history
from treadle.cli import cmd_imports as imports
from treadle.cli import cmd_info as info
from treadle.cli import cmd_plan as plan
from treadle.cli import cmd_simulate as simulate
from treadle.cli import cmd_store as store
from treadle.cli import cmd_ui as ui
from treadle.errors import MissingDependency, TreadleError

COMMANDS = (store, history, plan, simulate, imports, demo, bench, ui, info)
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
    for p in _all_parsers(parser):  # docstrings become help: plain text, lines wrapped
        p.description = p.description and _plain(p.description)
    args.install(parser)
    return parser


def _plain(text: str, width: int = 90) -> str:
    """A docstring as help text: no reST marks (````code````, ``:mod:`name```), and a line
    longer than ``width`` wrapped (a raw description keeps the docstring's own lines)."""
    text = re.sub(r":[a-z]+:`([^`]*)`", r"\1", text.replace("``", ""))
    return "\n".join(textwrap.fill(line, width) if len(line) > width else line
                     for line in text.splitlines())  # fmt: skip


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every parser of the tree under it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _all_parsers(child)
    return out


UNUSED = {
    "demo": ("json",),
    "bench": ("json", "root", "storage_option"),
    "ui": ("json",),
    "info": ("root", "storage_option"),
    "simulate": ("json",),
}
"""Global options a command has no use for: given there, they are a usage error rather
than silently ignored (demo, bench and simulate print reports, not data; bench makes its own
stores under ``--dir``)."""


def unused_option(ns: argparse.Namespace) -> str | None:
    """The first global option given on the command line that ``ns.command`` does not use."""
    for name in UNUSED.get(ns.command, ()):
        if getattr(ns, name, None) or getattr(ns, args.TOP + name, None):
            return "--" + name.replace("_", "-")
    return None


# the extra of pyproject.toml that brings a command's optional packages
_EXTRAS = {"ui": "ui", "bench": "bench"}


def missing_dependency(command: str, error: ModuleNotFoundError) -> MissingDependency:
    """``treadle COMMAND`` needs a package that is not installed: say which, and for what."""
    extra = _EXTRAS.get(command)
    fix = f"pip install 'treadle[{extra}]'" if extra else "the treadle extra that brings it"
    return MissingDependency(
        f"treadle {command} needs the package {error.name.split('.')[0]!r}, which is not "
        f"installed ({error}); install it with: {fix}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``treadle ARGV``; the exit code (0 ok, 1 user error, 2 usage)."""
    parser = build_parser()
    ns = parser.parse_args(argv)  # usage errors exit 2 here, with argparse's message
    if not getattr(ns, "func", None):
        parser.print_usage(sys.stderr)
        print("treadle: error: give a COMMAND", file=sys.stderr)
        return 2
    unused = unused_option(ns)
    if unused:
        print(f"treadle {ns.command}: error: {unused}: {ns.command} does not use it "
              f"(see treadle {ns.command} --help)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        args.resolve(ns)
        try:
            code = int(ns.func(ns) or 0)
            sys.stdout.flush()  # here, so that a closed pipe is caught below
            return code
        except ModuleNotFoundError as e:
            if not e.name or e.name.split(".")[0] == "treadle":
                raise  # a broken install, not a missing extra: the traceback says where
            raise missing_dependency(ns.command, e) from e
    except TreadleError as e:
        first = str(e).strip().splitlines()
        print(f"treadle: error: {first[0] if first else type(e).__name__}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `treadle log P | head`: the reader left, nothing to report
        with contextlib.suppress(OSError, ValueError):  # no fd under a capturing test
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

"""The ``treadle`` command line: browse projects, plan runs, import data, run the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import timedelta

from treadle.errors import TreadleError


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from treadle.catalog import Client

    return Client(args.root) if args.root else Client()


def _cmd_projects(args: argparse.Namespace) -> int:
    client = _client(args)
    names = client.projects()
    if not names:
        print(f"no projects under {client.root}")
    for name in names:
        project = client.project(name, create=False)
        branches = project.branches()
        tables = project.branch("main").tables() if "main" in branches else []
        print(f"{name}  branches: {', '.join(branches)}  tables on main: {len(tables)}")
    return 0


def _cmd_log(args: argparse.Namespace) -> int:
    branch = _client(args).project(args.project, create=False).branch(args.branch)
    for c in branch.log(limit=args.limit):
        when = c.datetime.strftime("%Y-%m-%d %H:%M:%S")
        tables = ", ".join(f"{k}@v{v}" for k, v in sorted(c.tables.items())) or "-"
        print(f"{c.short_id}  {when}  {c.message}\n          {tables}")
    return 0


def _cmd_tables(args: argparse.Namespace) -> int:
    project = _client(args).project(args.project, create=False)
    branch = project.branch(args.branch)
    commit = project.commit(args.at) if args.at else branch.head()
    print(f"{project.name} @ {commit.short_id} ({commit.message})")
    if not commit.tables:
        print("  no tables")
    for name in sorted(commit.tables):
        t = branch.table(name).at(commit.id)
        kind = "episodes" if t.is_time_indexed else "rows"
        cols = ", ".join(
            f.name + (" [video]" if f.name in t.video_columns else "")
            for f in t.schema
            if f.name not in ("episode", "frame")
        )
        extra = f", {t.num_episodes} episodes" if t.is_time_indexed else ""
        print(f"  {name:<24} v{t.version:<5} {t.num_moments:>10,} moments{extra} ({kind})  {cols}")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    client = _client(args)
    names = [args.project] if args.project else client.projects()
    for name in names:
        report = client.project(name, create=False).gc(timedelta(hours=args.older_than_hours))
        print(
            f"{name}: kept {sum(len(v) for v in report.kept_versions.values())} table versions, "
            f"removed {report.removed_versions} versions, {report.removed_files} staged data "
            f"files, {len(report.removed_media)} media objects and "
            f"{len(report.removed_tables)} tables ({report.removed_bytes:,} bytes)"
        )
    return 0


def _hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not hours >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of hours >= 0, got {text!r}")
    return hours


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treadle", description=__doc__)
    parser.add_argument("--version", action="version", version="treadle 0.1.0")
    parser.add_argument(
        "--root", dest="global_root", help="store root (default: $TREADLE_ROOT or ~/.treadle)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("projects", help="list projects")
    p.set_defaults(func=_cmd_projects)

    p = sub.add_parser("log", help="commits of a branch, newest first")
    p.add_argument("project")
    p.add_argument("--branch", default="main")
    p.add_argument("--limit", type=int, default=None)
    p.set_defaults(func=_cmd_log)

    p = sub.add_parser("tables", help="tables of a project at a branch head or commit")
    p.add_argument("project")
    p.add_argument("--branch", default="main")
    p.add_argument("--at", help="commit id or prefix")
    p.set_defaults(func=_cmd_tables)

    p = sub.add_parser(
        "gc",
        help="remove table versions and media no commit reaches (safe while writers run)",
    )
    p.add_argument("project", nargs="?")
    p.add_argument(
        "--older-than-hours",
        type=_hours,
        default=1.0,
        help="grace: keep anything younger, and all a running write staged (default 1); "
        "0 may break writers that run meanwhile",
    )
    p.set_defaults(func=_cmd_gc)

    for register in _optional_commands():
        register(sub)
    return parser


def _optional_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Sub-commands that live beside their concept (plan, import, demo, bench)."""
    out = []
    for module, attr in (
        ("treadle.plan.card", "add_plan_parser"),
        ("treadle.importers.cli", "register"),
        ("treadle.demo", "register"),
        ("treadle.benchcli", "register"),
    ):
        try:
            mod = __import__(module, fromlist=[attr])
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("treadle"):
                continue
            raise
        if hasattr(mod, attr):
            out.append(getattr(mod, attr))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # `treadle --root R CMD` and `treadle CMD --root R` (where CMD takes one) both work
    if getattr(args, "root", None) is None:
        args.root = args.global_root
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except TreadleError as e:
        print(f"treadle: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``treadle projects|log|tables|gc|stats|tag``: browse and maintain a store."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from treadle.cli.args import float_at_least, int_at_least, read_root
from treadle.errors import TreadleError


def _client(args: argparse.Namespace):
    from treadle.catalog import Client

    return Client(read_root(args.root), getattr(args, "storage_options", None) or None)


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=1, sort_keys=True, default=str))


def _cmd_projects(args: argparse.Namespace) -> int:
    client = _client(args)
    names = client.projects()
    if not names:
        foreign = client.foreign_entries()
        if foreign:
            raise TreadleError(
                f"{client.root!r} is not a treadle store (no projects, no treadle.json; it "
                f"holds {', '.join(repr(n) for n in foreign[:5])}): check --root"
            )
        if not args.json:
            print(f"no projects under {client.root}")
    rows = []
    for name in names:
        project = client.project(name, create=False)
        branches = project.branches()
        tables = project.branch("main").tables() if "main" in branches else []
        rows.append({"name": name, "branches": branches, "tables_on_main": len(tables)})
        if not args.json:
            print(f"{name}  branches: {', '.join(branches)}  tables on main: {len(tables)}")
    if args.json:
        _print_json(rows)
    return 0


def _cmd_log(args: argparse.Namespace) -> int:
    branch = _client(args).project(args.project, create=False).branch(args.branch)
    commits = branch.log(limit=args.limit)
    if args.json:
        _print_json(
            [
                {"id": c.id, "time": c.datetime.isoformat(), "message": c.message,
                 "parents": list(c.parents), "tables": dict(sorted(c.tables.items())),
                 "changes": {k: list(v) for k, v in sorted(c.changes.items())}}
                for c in commits
            ]
        )  # fmt: skip
        return 0
    for c in commits:
        when = c.datetime.strftime("%Y-%m-%d %H:%M:%S")
        tables = ", ".join(f"{k}@v{v}" for k, v in sorted(c.tables.items())) or "-"
        did = c.summary  # one line, as branch.log() and the viewer say it
        print(
            f"{c.short_id}  {when}  {c.message}\n          {tables}"
            + (f"\n          {did}" if did else "")
        )
    return 0


def _cmd_tables(args: argparse.Namespace) -> int:
    project = _client(args).project(args.project, create=False)
    branch = project.branch(args.branch)
    commit = project.commit(args.at) if args.at else branch.head()
    rows = []
    for name in sorted(commit.tables):
        t = branch.table(name).at(commit.id)
        rows.append(
            {
                "name": name,
                "version": t.version,
                "moments": t.num_moments,
                "episodes": t.num_episodes if t.is_time_indexed else None,
                "columns": [f.name for f in t.schema if f.name not in ("episode", "frame")],
                "video_columns": list(t.video_columns),
                "image_columns": _image_columns(t),
            }
        )
    if args.json:
        _print_json({"project": project.name, "commit": commit.id, "message": commit.message,
                     "tables": rows})  # fmt: skip
        return 0
    print(f"{project.name} @ {commit.short_id} ({commit.message})")
    if not rows:
        print("  no tables")
    for r in rows:
        cols = ", ".join(c + (" [video]" if c in r["video_columns"] else "")
                         + (f" [{r['image_columns'][c]}]" if c in r["image_columns"] else "")
                         for c in r["columns"])  # fmt: skip
        n = r["episodes"]
        extra = " (flat: no episodes)" if n is None else f", {n:,} episode{'' if n == 1 else 's'}"
        print(f"  {r['name']:<24} v{r['version']:<5} {r['moments']:>10,} moments{extra}  {cols}")
    return 0


def _image_columns(tab: Any) -> dict[str, str]:
    """``{column: "jpeg 224x224"}`` of a table's binary columns of images (cameras that
    ``td.Video`` decodes; "several sizes" when they differ, "16-bit" for depth), as the
    viewer lists them: recorded by their writes, or found from the first value."""
    from treadle.ui.image_frames import image_cameras

    return {col: cam.label for col, cam in image_cameras(tab).items()}


def _cmd_gc(args: argparse.Namespace) -> int:
    client = _client(args)
    names = [args.project] if args.project else client.projects()
    for name in names:
        report = client.project(name, create=False).gc(
            timedelta(hours=args.older_than_hours), keep_days=args.keep_days
        )
        if args.json:
            _print_json(
                {
                    "project": name,
                    "kept_versions": sum(len(v) for v in report.kept_versions.values()),
                    "removed_versions": report.removed_versions,
                    "removed_files": report.removed_files,
                    "removed_media": len(report.removed_media),
                    "removed_tables": len(report.removed_tables),
                    "removed_bytes": report.removed_bytes,
                    "expired_commits": report.expired_commits,
                }
            )
            continue
        print(
            f"{name}: kept {sum(len(v) for v in report.kept_versions.values())} table versions, "
            f"removed {report.removed_versions} versions, {report.removed_files} staged data "
            f"files, {len(report.removed_media)} media objects and "
            f"{len(report.removed_tables)} tables ({report.removed_bytes:,} bytes)"
            + (f"; expired {len(report.expired_commits)} commits" if args.keep_days is not None
               else "")
        )  # fmt: skip
    return 0


def _cmd_tag(args: argparse.Namespace) -> int:
    project = _client(args).project(args.project, create=False)
    if args.name is not None:
        if args.commit is None:
            raise TreadleError(f"tag {args.name!r}: give the commit to tag (id or prefix)")
        c = project.tag(args.name, args.commit)
        if not args.json:
            print(f"{args.name} -> {c.short_id} ({c.message})")
    tags = project.tags()
    if args.json:
        _print_json(tags if args.name is None else {args.name: tags[args.name]})
    elif args.name is None:
        for name, cid in tags.items():
            print(f"{name}  {cid[:8]}")
        if not tags:
            print(f"no tags in project {project.name}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    import numpy as np

    executor = None
    if args.ray is not None:  # first: without Ray, say so before any work
        from treadle.importers.ray_executor import RayExecutor

        executor = RayExecutor(address=args.ray or None)
    project = _client(args).project(args.project, create=False)
    table = project.branch(args.branch).table(args.table)
    table = table.at(args.at) if args.at else table.pin()
    stats = table.stats(
        args.columns, where=args.where, frames=args.frames, seed=args.seed, executor=executor
    )
    if args.json:
        _print_json({"project": project.name, "table": table.name, "version": table.version,
                     "columns": {c: s.to_dict() for c, s in stats.items()}})  # fmt: skip
        return 0
    print(f"{project.name}/{table.name} v{table.version}")
    head = ("column", "count", "mean", "std", "min", "max", "q01", "q99")
    print("  " + "  ".join(f"{h:>12}" if i else f"{h:<24}" for i, h in enumerate(head)))
    for name, s in stats.items():
        flat = {f: np.asarray(getattr(s, f), np.float64).reshape(-1) for f in head[2:]}
        for i in range(len(flat["mean"])):
            label = name if len(flat["mean"]) == 1 else f"{name}[{i}]"
            cells = [f"{int(s.count):>12,}"] + [f"{flat[f][i]:>12.6g}" for f in head[2:]]
            print(f"  {label:<24}  " + "  ".join(cells))
    return 0


BRANCH_HELP = "branch name (default: main)"


def register(sub: Any) -> None:
    """Add the store commands to the top parser's sub-commands."""
    _add_browse(sub)
    _add_maintain(sub)


def _add_browse(sub: Any) -> None:
    """``projects``, ``log``, ``tables``."""
    p = sub.add_parser("projects", help="list projects", description="List the projects of a root.")
    p.set_defaults(func=_cmd_projects)

    p = sub.add_parser("log", help="commits of a branch, newest first")
    p.add_argument("project", help="project name")
    p.add_argument("--branch", default="main", help=BRANCH_HELP)
    p.add_argument(
        "--limit",
        type=int_at_least(1),
        default=None,
        help="show at most this many commits (default: all)",
    )
    p.set_defaults(func=_cmd_log)

    p = sub.add_parser("tables", help="tables of a project at a branch head or commit")
    p.add_argument("project", help="project name")
    p.add_argument("--branch", default="main", help=BRANCH_HELP)
    p.add_argument("--at", help="commit id or prefix (default: the branch head)")
    p.set_defaults(func=_cmd_tables)


def _add_maintain(sub: Any) -> None:
    """``gc``, ``stats``, ``tag``."""
    p = sub.add_parser(
        "gc",
        help="remove table versions and media no commit reaches (safe while writers run)",
    )
    p.add_argument("project", nargs="?", help="project name (default: every project)")
    p.add_argument(
        "--older-than-hours",
        type=float_at_least(0),
        default=1.0,
        help="grace: keep unreachable objects younger than this (>= 0; default 1); any grace, "
        "0 included, is safe beside running writers: what a commit names or a running write "
        "staged is never removed",
    )
    p.add_argument(
        "--keep-days",
        type=float_at_least(0),
        default=None,
        help="retention: also expire commits older than this many days that no branch head, "
        "tag or checkpoint run record pins (default: keep every commit readable)",
    )
    p.set_defaults(func=_cmd_gc)

    p = sub.add_parser("stats", help="normalisation statistics of a table's columns")
    p.add_argument("project", help="project name")
    p.add_argument("table", help="table name")
    p.add_argument("--columns", nargs="+", help="columns (default: every numeric, tensor "
                   "and video column)")  # fmt: skip
    p.add_argument("--where", help="a Lance SQL filter on the rows")
    p.add_argument("--frames", type=int_at_least(1), default=10_000,
                   help="video: frames sampled (default 10000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="video: sampling seed (default 0)")
    p.add_argument("--branch", default="main", help=BRANCH_HELP)
    p.add_argument("--at", help="commit id or prefix (default: the branch head)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="read numeric and tensor columns in Ray tasks (on the cluster at "
                   "ADDRESS, default: the local or $RAY_ADDRESS one); needs pip install "
                   "'treadle[ray]'")  # fmt: skip
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("tag", help="name a commit forever (gc keeps it); no NAME: list tags")
    p.add_argument("project", help="project name")
    p.add_argument("name", nargs="?", help="tag name (omit to list the tags)")
    p.add_argument("commit", nargs="?", help="commit id or prefix to tag")
    p.set_defaults(func=_cmd_tag)

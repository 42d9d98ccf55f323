"""``treadle diff|merge|purge``: what changed between two commits, merging branches, and
removing episodes from history."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _project(args: argparse.Namespace) -> Any:
    from treadle.catalog import Client
    from treadle.cli.args import read_root

    client = Client(read_root(args.root), getattr(args, "storage_options", None) or None)
    return client.project(args.project, create=False)


def _cmd_diff(args: argparse.Namespace) -> int:
    d = _project(args).diff(args.a, args.b)
    print(json.dumps(d.to_json(), indent=1, sort_keys=True) if args.json else str(d))
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    c = _project(args).merge(args.branch, into=args.into, message=args.message)
    if args.json:
        print(json.dumps({"id": c.id, "message": c.message, "parents": list(c.parents)}))
    else:
        print(f"{args.into} is at {c.short_id}: {c.message}")
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    project = _project(args)
    c = project.purge(args.table, args.episodes, reason=args.reason, branch=args.branch)
    if args.json:
        print(json.dumps({"id": c.id, "message": c.message, "episodes": args.episodes}))
    else:
        print(f"purged {len(args.episodes)} episode(s) of {args.table!r}: commit {c.short_id}")
    return 0


def _register_purge(sub: Any) -> None:
    p = sub.add_parser(
        "purge",
        help="remove episodes from a table and from every version of it (privacy, consent)",
        description="Delete EPISODEs from TABLE on every branch, rewrite every older version "
        "that held them with their rows blanked, and delete the old files and the media "
        "only they used. Runs pinned to them then raise td.Purged naming the reason.",
    )
    p.add_argument("project", help="project name")
    p.add_argument("table", help="table name")
    p.add_argument("episodes", nargs="+", metavar="EPISODE", help="episode names")
    p.add_argument("--reason", required=True, help="why (kept, and shown by td.Purged)")
    p.add_argument("--branch", default="main", help="the branch of the purge's commit")
    p.set_defaults(func=_cmd_purge)


def register(sub: Any) -> None:
    """Add ``diff``, ``merge`` and ``purge`` to the top parser's sub-commands."""
    _register_purge(sub)
    p = sub.add_parser(
        "diff",
        help="what changed between two commits, branches or tags, per table",
        description="Per table: episodes added and removed, columns added, removed and "
        "changed (names and types), moments before and after.",
    )
    p.add_argument("project", help="project name")
    p.add_argument("a", help="commit id or prefix, branch name or tag")
    p.add_argument("b", help="commit id or prefix, branch name or tag")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser(
        "merge",
        help="merge a branch into another (fast-forward, else three-way by table)",
        description="Merge BRANCH into --into; a conflict writes nothing and names the "
        "table and what each side did.",
    )
    p.add_argument("project", help="project name")
    p.add_argument("branch", help="the branch (or tag, or commit) to merge")
    p.add_argument("--into", default="main", help="the branch that moves (default: main)")
    p.add_argument("--message", default=None, help="the merge commit's message")
    p.set_defaults(func=_cmd_merge)

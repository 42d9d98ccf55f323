"""``treadle diff|merge``: what changed between two commits, and merging branches."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _project(args: argparse.Namespace) -> Any:
    from treadle.catalog import Client

    client = Client(args.root, getattr(args, "storage_options", None) or None)
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


def register(sub: Any) -> None:
    """Add ``diff`` and ``merge`` to the top parser's sub-commands."""
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

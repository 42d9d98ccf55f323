"""``treadle ui`` (the web viewer) and ``treadle show`` (one step of a run, as a file)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from treadle.cli.args import int_at_least, read_root
from treadle.errors import NotFound, TreadleError


def _client(args: argparse.Namespace):
    from treadle.catalog import Client

    return Client(read_root(args.root), getattr(args, "storage_options", None) or None)


def _cmd_ui(args: argparse.Namespace) -> int:
    from treadle.ui.serve import serve

    serve(_client(args), args.host, args.port, args.token, open_browser=not args.no_open,
          allow_hosts=tuple(args.allow_host or ()))  # fmt: skip
    return 0


def _find_run(client, run_id: str, project: str | None):
    """The plan of the run whose id is ``run_id`` or starts with it (4 to 16 hex digits:
    ``treadle log`` names a checkpoint's run by its first 8)."""
    from treadle.plan.plan import Plan
    from treadle.ui.runs import Runs, check_run_id_prefix

    check_run_id_prefix(run_id)
    runs = Runs(client)
    hits = {}
    for name in [project] if project else client.projects():
        found = runs.runs(name)  # tables that only look like run records are skipped
        hits.update({rid: run for rid, run in found.items() if rid.startswith(run_id)})
    if len(hits) > 1:
        raise NotFound(f"run id prefix {run_id!r} is ambiguous: runs {', '.join(sorted(hits))}")
    if hits:
        return Plan.from_record(next(iter(hits.values()))["record"], client)
    where = f"project {project!r}" if project else "any project of this store"
    raise NotFound(f"run {run_id!r} is not in {where} (no checkpoint row or saved record)")


def _cmd_show(args: argparse.Namespace) -> int:
    from treadle.ui.step import read_step, step_html, step_json

    if bool(args.out) == bool(args.json):
        raise TreadleError("treadle show: give exactly one of --out FILE.html and --json")
    folder = os.path.dirname(os.path.abspath(args.out)) if args.out else None
    if folder and not os.path.isdir(folder):
        raise TreadleError(f"treadle show: cannot write {args.out}: folder {folder} does not exist")
    plan = _find_run(_client(args), args.run_id, args.project)
    view = read_step(plan, args.step, args.rank, args.world_size, anchors=not args.json)
    if args.json:
        json.dump(step_json(view), sys.stdout, indent=1)
        print()
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(step_html(view, inline=True))
    except OSError as e:
        raise TreadleError(f"treadle show: cannot write {args.out}: {e.strerror or e}") from None
    print(f"wrote {args.out}: run {plan.run_id} step {view.step} rank {view.rank} of "
          f"{view.world_size}, {len(view.samples)} samples")  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="a read-only web viewer of the store (extra treadle[ui])",
                       description="A read-only web viewer: projects, branches, tables, episodes "
                       "(video and plots), runs and the samples of any step.")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                   "any other needs --token, or one is generated and printed)")  # fmt: skip
    p.add_argument("--port", type=int_at_least(0), default=8765,
                   help="port (default 8765; 0: a free one, printed)")  # fmt: skip
    p.add_argument("--token", default=None, help="every request must carry this token")
    p.add_argument("--allow-host", action="append", metavar="NAME", help="also answer "
                   "requests for this Host name (repeatable; without a token only 127.0.0.1, "
                   "localhost and [::1] are answered, on any port)")  # fmt: skip
    p.add_argument("--no-open", action="store_true", help="do not open a browser")
    p.set_defaults(func=_cmd_ui)
    s = sub.add_parser("show", help="the exact samples of one step of a run (HTML or JSON)",
                       description="The samples of step N of a run, as a self-contained HTML "
                       "file (frames inlined) or as JSON.")  # fmt: skip
    s.add_argument(
        "run_id", help="the run id (16 hex digits, or a unique prefix: the 8 of treadle log)"
    )
    s.add_argument("--step", type=int_at_least(0), required=True, help="the step")
    s.add_argument("--rank", type=int_at_least(0), default=0, help="rank (default 0)")
    s.add_argument("--world-size", type=int_at_least(1), default=1, help="ranks (default 1)")
    s.add_argument("--project", default=None, help="the run's project (default: search all)")
    s.add_argument("--out", default=None, help="write the step page to this .html file")
    s.set_defaults(func=_cmd_show)

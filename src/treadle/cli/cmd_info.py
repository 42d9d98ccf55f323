"""``treadle info``: versions and whether each fast path is on (``td.info()``)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``treadle info`` to the top parser's sub-commands."""
    p = sub.add_parser(
        "info",
        help="versions, and whether each fast path is on (and why not)",
        description=(
            "Print the versions treadle runs with and, for each fast path (native decode, "
            "direct conversion, fixed-width reads, NVDEC), on or off with the reason and "
            "what runs instead. Each path is probed on this machine; --json prints it as "
            "JSON."
        ),
    )
    p.set_defaults(func=_cmd_info)


def _cmd_info(ns: argparse.Namespace) -> int:
    from treadle.info import info

    found = info()
    print(json.dumps(found.to_dict(), indent=2) if ns.json else found)
    return 0

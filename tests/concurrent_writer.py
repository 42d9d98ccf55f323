"""A writer process of tests/test_evolve_concurrency.py, on table ``t`` of project ``p``.

Reads ``{"root", "options", "role", "ops", "barrier"}`` as JSON from ``$WRITER_ARGS``;
starts once every writer has announced itself in folder ``barrier``. Role ``append`` appends
episode ``n<i>`` (``x`` = i on every frame) ``ops`` times; role ``label`` adds column
``c<i>``, once ``i`` episodes were appended (i even: ``{episode: i}`` for every episode it sees, default -1) or updates the
previous one (i odd: ``c<i-1>`` = i where ``frame = 0``). Each operation is retried on
:class:`treadle.CommitConflict` until it lands. Prints one JSON line: per operation, the
commit that landed it, what it wrote, the conflicts it met and the rebases so far.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

import treadle as td
from treadle.catalog import rebase

_TRIES = 500
REBASED = [0]  # appends put on top of columns added meanwhile (rebase.defaults_for calls)


def _counted(*args, **kwargs):
    REBASED[0] += 1
    return _defaults_for(*args, **kwargs)


_defaults_for, rebase.defaults_for = rebase.defaults_for, _counted


def one(t: td.TableRef, role: str, i: int) -> dict:
    if role == "append":
        commit = t.append_episode({"x": np.full(3, float(i))}, episode=f"n{i}")
        return {"commit": commit.id, "episode": f"n{i}"}
    deadline = time.monotonic() + 120
    while len(names := list(t.pin().episodes().names)) < i + 1:
        if time.monotonic() > deadline:
            raise SystemExit(f"label operation {i}: the appender stopped at {len(names)} episodes")
        time.sleep(0.005)  # spread over the appender's run: ``i`` of its episodes first
    if i % 2 == 0:
        commit = t.add_column(f"c{i}", dict.fromkeys(names, float(i)), default=-1.0)
        return {"commit": commit.id, "add": f"c{i}", "value": float(i), "episodes": names}
    commit = t.update({f"c{i - 1}": float(i)}, where="frame = 0")
    return {"commit": commit.id, "update": f"c{i - 1}", "value": float(i)}


def wait_for_all(barrier: Path, role: str, writers: int = 2) -> None:
    (barrier / role).touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < writers:
        if time.monotonic() > deadline:
            raise SystemExit("the other writer never started")
        time.sleep(0.01)


def main() -> None:
    args = json.loads(os.environ["WRITER_ARGS"])
    t = td.Client(args["root"], storage_options=args["options"]).project("p").branch().table("t")
    t.pin().episodes()  # what the first operation would otherwise import and open
    wait_for_all(Path(args["barrier"]), args["role"])
    t0 = time.monotonic()
    done = []
    for i in range(args["ops"]):
        for conflicts in range(_TRIES):
            try:
                op = one(t, args["role"], i)
                op.update(
                    conflicts=conflicts, rebased=REBASED[0], s=round(time.monotonic() - t0, 2)
                )
                done.append(op)
                break
            except td.CommitConflict:
                continue
        else:
            raise SystemExit(f"{args['role']} operation {i} met {_TRIES} conflicts")
    print(json.dumps(done))


if __name__ == "__main__":
    main()

"""The commits reachable from one commit and not from another, found by reading only the
commits between the two and their common ancestors (``project.diff``).

Commits are walked newest first from both ends at once, each marked with the ends it is
reached from; the walk stops once every commit still to visit is reached from both (git's
"paint down to common"): what lies below them is common to both. Visiting newest first is
exact when every commit is newer than its parents: :meth:`Commit.create` makes it so for
every commit written, and the walk checks it on every parent it reads. A history that breaks
it (commits written by an older treadle on machines whose clocks disagreed) is walked whole
instead, as before: the answer is the same, only its cost is the history's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from treadle.catalog.commit import Commit

_LEFT, _RIGHT = 1, 2
_BOTH = _LEFT | _RIGHT


@dataclass(frozen=True)
class Sides:
    """The commits reachable from ``a`` and not ``b`` (``left``), from ``b`` and not ``a``
    (``right``); ``walked``: whether the whole history was walked (times out of order)."""

    left: frozenset[str]
    right: frozenset[str]
    walked: bool = False


def sides(load: Callable[[str], Commit], a: str, b: str) -> Sides:
    """:class:`Sides` of commits ``a`` and ``b`` (full ids), ``load`` reading a commit."""
    if a == b:
        return Sides(frozenset(), frozenset())
    got = _paint(load, a, b)
    if got is None:
        left, right = _reachable(load, a), _reachable(load, b)
        return Sides(frozenset(left - right), frozenset(right - left), walked=True)
    return got


def _paint(load: Callable[[str], Commit], a: str, b: str) -> Sides | None:
    """The walk of the module docstring; None when a parent is not older than its child."""
    flags = {a: _LEFT, b: _RIGHT}
    commits = {a: load(a), b: load(b)}
    heap = sorted([(-commits[a].time, a), (-commits[b].time, b)])
    busy = 2  # queued commits not reached from both: while any is left, the walk goes on
    while busy:
        _, cid = heapq.heappop(heap)
        c = commits.pop(cid)
        mark = flags[cid]
        busy -= mark != _BOTH
        for pid in c.parents:
            p = load(pid)
            if p.time >= c.time:
                return None
            old = flags.get(pid, 0)
            if old | mark == old:
                continue
            flags[pid] = old | mark
            if pid in commits:  # queued: now reached from both
                busy -= 1
            elif old:  # visited already: only times out of order get here
                return None
            else:
                commits[pid] = p
                heapq.heappush(heap, (-p.time, pid))
                busy += mark != _BOTH
    left = frozenset(c for c, f in flags.items() if f == _LEFT)
    right = frozenset(c for c, f in flags.items() if f == _RIGHT)
    return Sides(left, right)


def _reachable(load: Callable[[str], Commit], start: str) -> set[str]:
    """Every commit reachable from ``start`` (itself included): the whole walk."""
    seen, todo = {start}, [start]
    while todo:
        for p in load(todo.pop()).parents:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen

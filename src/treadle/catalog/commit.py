"""Commits: immutable, content-addressed snapshots of every table of a project."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from treadle.errors import CorruptData


def canonical_json(value: Any) -> bytes:
    """The one byte form of ``value`` that ids and hashes are computed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class Commit:
    """One commit: its parents, message, time and the Lance version of every table.

    ``id`` is the sha256 (hex) of the canonical JSON of the other fields, so the same
    content always has the same id and no commit can be changed after it is written.
    """

    parents: tuple[str, ...]
    message: str
    time: float
    tables: dict[str, int] = field(default_factory=dict)
    id: str = ""
    #: what this commit did to each table it wrote: operation kinds in order ("append",
    #: "add_column", "update", "rename_columns", "drop_columns", "delete_episodes",
    #: "compact", "merge"), each optionally followed by " <detail>"; merges read them
    changes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        parents: list[str],
        message: str,
        tables: dict[str, int],
        changes: dict[str, list[str]] | None = None,
        after: float = 0.0,
    ) -> Commit:
        """A new commit; ``after``: the newest of its parents' times, which its own time
        passes (by a microsecond if this machine's clock is behind), so that every commit
        is newer than its parents and histories are walked newest first
        (:mod:`treadle.catalog.between`)."""
        done = {k: tuple(v) for k, v in sorted((changes or {}).items()) if v}
        stamp = round(max(time.time(), after), 6)
        while stamp <= after:
            stamp = round(stamp + 1e-6, 6)
        c = cls(tuple(parents), str(message), stamp, dict(sorted(tables.items())), "", done)
        return c._with_id()

    def _body(self) -> dict[str, Any]:
        def entry(name: str, version: int) -> dict[str, Any]:
            e: dict[str, Any] = {"version": int(version)}
            if self.changes.get(name):  # absent when none: older commits keep their ids
                e["changes"] = list(self.changes[name])
            return e

        return {
            "parents": list(self.parents),
            "message": self.message,
            "time": self.time,
            "tables": {k: entry(k, v) for k, v in sorted(self.tables.items())},
        }

    def _with_id(self) -> Commit:
        cid = hashlib.sha256(canonical_json(self._body())).hexdigest()
        return Commit(self.parents, self.message, self.time, self.tables, cid, self.changes)

    def kinds(self, table: str) -> list[str]:
        """The operation kinds this commit applied to ``table`` (no details)."""
        return [c.split(" ", 1)[0] for c in self.changes.get(table, ())]

    @property
    def summary(self) -> str:
        """What this commit changed, in one line (``"grasps: add_column success, delete
        2 episodes; arm: append"``); "" for a commit that recorded nothing (the project's
        first, or one written before commits recorded their changes)."""
        return change_summary(self.changes)

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @property
    def datetime(self) -> datetime:
        return datetime.fromtimestamp(self.time, UTC)

    def to_bytes(self) -> bytes:
        return canonical_json(self._body())

    @classmethod
    def from_bytes(cls, data: bytes, expect_id: str | None = None) -> Commit:
        """Parse a stored commit; :class:`CorruptData` naming it if the bytes are damaged."""
        name = f"commit object {expect_id}" if expect_id else "commit object"
        try:
            body = json.loads(data)
            c = cls(
                tuple(str(p) for p in body["parents"]),
                str(body["message"]),
                float(body["time"]),
                {str(k): int(v["version"]) for k, v in body["tables"].items()},
                "",
                {
                    str(k): tuple(str(c) for c in v["changes"])
                    for k, v in body["tables"].items()
                    if v.get("changes")
                },  # fmt: skip
            )._with_id()
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptData(
                f"{name} cannot be parsed ({type(e).__name__}): its stored bytes are damaged"
            ) from None
        if expect_id is not None and c.id != expect_id:
            raise CorruptData(f"{name} does not hash to its id (got {c.id})")
        return c

    def __repr__(self) -> str:
        did = f", changes={self.summary!r}" if self.changes else ""
        return f"Commit({self.short_id} {self.message!r}, tables={self.tables}{did})"


MAX_SUMMARY_TABLES = 8
"""Tables a one-line summary names (the rest are counted)."""


def _said(change: str) -> str:
    """One recorded change as a person reads it (``delete_episodes 2`` -> ``delete 2
    episodes``; lists of columns spaced)."""
    kind, _, detail = change.partition(" ")
    if kind == "delete_episodes" and detail.isdigit():
        return f"delete {detail} episode{'' if detail == '1' else 's'}"
    if kind in ("rename_columns", "drop_columns") and detail:
        return f"{kind.split('_')[0]} {', '.join(detail.split(','))}"
    return change


def change_summary(changes: dict[str, tuple[str, ...]]) -> str:
    """``changes`` (a commit's) in one line: per table its changes in order, repeats
    counted (``update task ×3``), at most :data:`MAX_SUMMARY_TABLES` tables named."""
    parts = []
    for table, done in sorted(changes.items())[:MAX_SUMMARY_TABLES]:
        said: list[list[Any]] = []
        for c in done:
            if said and said[-1][0] == c:
                said[-1][1] += 1
            else:
                said.append([c, 1])
        ops = ", ".join(_said(c) + (f" ×{n}" if n > 1 else "") for c, n in said)
        parts.append(f"{table}: {ops}")
    more = len(changes) - MAX_SUMMARY_TABLES
    return "; ".join(parts) + (f"; and {more} more tables" if more > 0 else "")

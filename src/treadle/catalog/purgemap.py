"""The records of purges (``<project>/purges/<table>/<commit>.json``) and the purge map.

A purge (:mod:`treadle.catalog.purge`) replaces every Lance version of a table that held
a purged row by a version of the same rows with those rows blanked, and deletes the old
version. Its record, written before anything is deleted, says which: ``{old version:
replacement version}``, with the episodes, the purge's commit and its reason. The
:class:`PurgeMap` of a table is the union of its records: every open of a table version
(:meth:`treadle.catalog.lance.LanceTables.open`) reads the version it resolves to, and a
read that reaches a purged episode of it raises :class:`~treadle.errors.Purged`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from treadle import layout
from treadle.catalog.place import ProjectPlace
from treadle.errors import CorruptData, Purged


@dataclass(frozen=True)
class PurgeRecord:
    """One purge of one table: what it removed, why, and which versions it replaced."""

    table: str
    commit: str  # the commit that deleted the episodes from the branch (full id)
    reason: str
    episodes: tuple[str, ...]
    versions: dict[int, int] = field(default_factory=dict)  # old version -> replacement
    time: float = 0.0
    files: tuple[str, ...] = ()  # the data files holding the blanked rows (paths in data/)
    removed: tuple[str, ...] = ()  # the data files it deletes (a rerun finishes the job)
    streams: tuple[str, ...] = ()  # the purged rows' media keys (those no row names go)
    finished: bool = False  # what it deletes is deleted: a later purge does not walk it again
    #: False for a record written before ``streams`` was kept: its streams are not known
    #: (gc removes them, as media no row names)
    streams_known: bool = field(default=True, compare=False)

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "table": self.table,
            "commit": self.commit,
            "reason": self.reason,
            "episodes": list(self.episodes),
            "versions": {str(k): int(v) for k, v in sorted(self.versions.items())},
            "time": self.time,
            "files": list(self.files),
            "removed": list(self.removed),
            "streams": list(self.streams),
            "finished": self.finished,
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> PurgeRecord:
        try:
            b = json.loads(data)
            return cls(
                str(b["table"]),
                str(b["commit"]),
                str(b["reason"]),
                tuple(str(e) for e in b["episodes"]),
                {int(k): int(v) for k, v in b["versions"].items()},
                float(b.get("time", 0.0)),
                tuple(str(f) for f in b.get("files", ())),
                tuple(str(f) for f in b.get("removed", ())),
                tuple(str(s) for s in b.get("streams", ())),
                bool(b.get("finished", False)),
                "streams" in b,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptData(f"purge record {key} cannot be parsed ({type(e).__name__})") from None

    def error(self, episode: str, project: str, version: int) -> Purged:
        """The :class:`Purged` of reading ``episode`` of this table at ``version``."""
        return Purged(
            f"episode {episode!r} of table {self.table!r} (project {project!r}, version "
            f"{version}) was purged by commit {self.commit[:8]} ({self.reason!r}): its rows "
            "are gone from every version; a run that drew it cannot be replayed: plan a new "
            "run without it (episodes=)",
            episode=episode,
            table=self.table,
            commit=self.commit,
            reason=self.reason,
        )


def write_record(place: ProjectPlace, record: PurgeRecord) -> None:
    """Store ``record`` (before anything it replaced is deleted)."""
    key = layout.purge_key(place.prefix, record.table, record.commit)
    place.store.put(key, record.to_bytes())


def read_records(place: ProjectPlace, table: str) -> list[PurgeRecord]:
    """Every purge record of ``table``, oldest first (one LIST; none: an empty list)."""
    keys = sorted(place.store.list(layout.purges_folder(place.prefix, table)))
    records = [PurgeRecord.from_bytes(place.store.get(k), k) for k in keys if k.endswith(".json")]
    return sorted(records, key=lambda r: (r.time, r.commit))


class PurgeMap:
    """The purges of one table: which version a version now reads, and what it lost."""

    def __init__(self, project: str, records: list[PurgeRecord]):
        self.project = project
        self.records = records
        self._next: dict[int, int] = {}
        self._blanked: dict[str, PurgeRecord] = {}  # data file -> the purge that wrote it
        for r in records:
            self._next.update(r.versions)
            self._blanked.update(dict.fromkeys(r.files, r))

    def __bool__(self) -> bool:
        return bool(self.records)

    def chain(self, version: int) -> list[int]:
        """``version`` and each replacement after it (a version purged twice has two)."""
        out = [int(version)]
        while out[-1] in self._next and len(out) <= len(self._next):
            out.append(self._next[out[-1]])
        return out

    def resolve(self, version: int) -> int:
        """The version whose files hold ``version``'s rows now."""
        return self.chain(version)[-1]

    def purged(self, version: int) -> dict[str, Purged]:
        """``{episode: Purged}`` of the purged episodes a read of ``version`` reaches."""
        chain = set(self.chain(version))  # a replacement itself holds the blanked rows
        out: dict[str, Purged] = {}
        for r in self.records:
            if chain & (r.versions.keys() | set(r.versions.values())):
                for ep in r.episodes:
                    out.setdefault(ep, r.error(ep, self.project, version))
        return out

    def blanked(self, files: list[str]) -> PurgeRecord | None:
        """The purge whose blanked rows one of ``files`` (data file paths) holds, if any."""
        return next((self._blanked[f] for f in files if f in self._blanked), None)

"""Which of some episode names a table version already holds, without scanning its rows.

A commit refuses episode names its table already holds. Reading them from the rows
costs O(rows) a commit; the stored episode index (:mod:`treadle.table.episode_store`)
holds each fragment's names instead, and a fragment's data files never change, so a
fragment's names are read once and kept here by its stored object's key. A check then
lists the version's fragments (O(log rows) after compaction) and reads only the
objects of fragments it has not seen: the ones another writer committed meanwhile,
or that compaction wrote. A commit hands over the runs it stored
(:meth:`EpisodeNames.remember`), so a writer appending episode after episode reads no
object at all. A fragment of a table written before treadle stored the index gets its
runs computed from that fragment alone, once, and stored.

One :class:`EpisodeNames` per project; it keeps, per table, the names of the
fragments of the version it last checked (O(episodes of the table)).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from treadle.table.episode_store import FragmentRuns, fragment_key, fragment_runs, fragments

if TYPE_CHECKING:
    from treadle.table.table import TableSource


class EpisodeNames:
    """Episode names per fragment of each table of one project (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, dict[str, frozenset[str]]] = {}

    def remember(self, table: str, stored: dict[str, FragmentRuns]) -> None:
        """Keep the names of fragments whose runs a commit just stored, by object key."""
        with self._lock:
            known = self._tables.setdefault(table, {})
            known.update((key, frozenset(runs.names)) for key, runs in stored.items())

    def taken(
        self, project: TableSource, table: str, ds: Any, wanted: Iterable[str], where: str
    ) -> list:
        """Those of ``wanted`` that version ``ds`` of time-indexed table ``table`` holds,
        sorted; ``where`` names the version in errors about its stored index."""
        wanted = set(wanted)
        with self._lock:
            known = dict(self._tables.get(table, {}))
        now: dict[str, frozenset[str]] = {}
        for f in fragments(ds, where):
            key = fragment_key(project.prefix, table, f.metadata)
            names = known.get(key)
            if names is None:
                names = frozenset(fragment_runs(project, table, f, where).names)
            now[key] = names
        with self._lock:
            # fragments the version no longer lists (compacted away) are dropped
            self._tables[table] = now
        return sorted({n for names in now.values() for n in names.intersection(wanted)})

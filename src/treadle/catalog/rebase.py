"""Putting a transaction's staged rows on top of the table at the branch head.

Appends commute: rows staged against an older version of a table go on top of the
head's version as they are, when its schema is theirs. When the head only *added*
columns since (``add_column``, ``annotate``: nullable, or with a stored default), the
staged fragments get one more data file each, holding those columns' defaults (or
nulls), and go on top too: a writer that keeps appending while others label the table
is never refused for it. Any other difference (a column renamed, dropped, of another
type or shape) is a :class:`CommitConflict`; an episode name the head already has is
:class:`AlreadyExists`. Nothing is committed by either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from treadle.errors import AlreadyExists, CommitConflict, SchemaMismatch
from treadle.table.defaults import is_added
from treadle.table.episodes import EPISODE, FRAME
from treadle.table.evolve import defaults_for
from treadle.table.schema_records import rebased_records
from treadle.table.tensors import schema_difference
from treadle.table.write import StagedTable

if TYPE_CHECKING:
    from treadle.catalog.history import Repository


def added_since(head: pa.Schema, mine: pa.Schema) -> list[str] | None:
    """The columns ``head`` added to ``mine`` (the schema rows were staged in), when that is
    all that differs; None otherwise."""
    extra = [f for f in head if f.name not in mine.names]
    if not extra or not all(is_added(f) for f in extra):
        return None
    kept = pa.schema([f for f in head if f.name in mine.names])
    return [f.name for f in extra] if schema_difference(kept, mine) is None else None


def check_base(
    project: Repository,
    ds: Any,
    st: StagedTable,
    name: str,
    commit_id: str,
    before_write: Callable[[], None],
) -> None:
    """Make the rows of ``st`` fit on top of ``ds`` (the table at the branch head): same
    schema, tensor shapes included, or the head's with columns added (each staged fragment
    gets their defaults); and none of the same episode names."""
    where = f"table {name!r} of project {project.name!r} (commit {commit_id[:8]})"
    diff = schema_difference(ds.schema, st.schema)
    if diff is not None:
        added = added_since(ds.schema, st.schema)
        if added is None:
            raise CommitConflict(
                f"{where} was written by another writer with a different schema: {diff}; "
                "nothing was committed: retry the write on the new head"
            )
        st.fragments = defaults_for(ds, st.fragments, added, before_write)
        st.schema = pa.schema(list(ds.schema), metadata=st.schema.metadata)
    # what another writer recorded of its rows (schema_records), kept; of the base's
    # episodes, only what the head still records (a delete or purge since took some out)
    try:
        st.schema = rebased_records(st.schema, ds.schema, st.episodes)
    except SchemaMismatch as e:  # another writer named another frame rate meanwhile
        raise SchemaMismatch(f"{where}: {e}") from None
    if st.episodes and EPISODE in ds.schema.names and FRAME in ds.schema.names:
        # the names each fragment's stored episode index holds, not the rows: O(fragments)
        version = f"table {name!r} of project {project.name!r} (v{ds.version})"
        hit = project.lance.episode_names.taken(project, name, ds, st.episodes, version)
        if hit:
            raise AlreadyExists(
                f"{where} already has episode {hit[0]!r}; episode names must be "
                "unique in a table; nothing was committed"
            )

"""Staging in one process, committing in another: staged fragments handed over.

A distributed import's task stages its rows in a :class:`~treadle.Transaction` it never
commits (Lance data files no version references, video streams in ``media/``), takes
them out with :func:`take_staged` and returns them; the driver adds them to its own
transaction with :func:`add_staged`, in source order, and commits as usual — the same
checks (schema, episode names, every staged file still there) and one branch move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from lance.fragment import FragmentMetadata

from treadle.errors import SchemaMismatch
from treadle.table.schema_records import merge_records, without_records
from treadle.table.write import StagedTable


class Stager(Protocol):
    """What a table's writer (``tx.table(name)``) gives the hand-over: its table's
    staged rows, writing them out, and the media streams stored for the table."""

    name: str

    def _staging(self) -> StagedTable: ...

    def _where(self) -> str: ...

    def _flush(self) -> None: ...

    def _media_keys(self) -> list[str]: ...

    def _add_media(self, keys: list[str]) -> None: ...


@dataclass(frozen=True)
class StagedFragments:
    """What one process staged for one table: fragments, schema, rows, episode names and
    the full keys of the media streams it stored."""

    table: str
    schema: pa.Schema | None
    fragments: list[FragmentMetadata]
    rows: int
    episodes: frozenset[str]
    media: list[str]


def take_staged(tw: Stager) -> StagedFragments:
    """Write out ``tw``'s rows still in memory; everything staged for its table.

    Nothing is committed: the fragments stay unreferenced until a transaction adds them.
    """
    st = tw._staging()
    tw._flush()
    return StagedFragments(
        tw.name, st.schema, list(st.fragments), st.rows, frozenset(st.episodes), tw._media_keys()
    )


def add_staged(tw: Stager, staged: StagedFragments) -> None:
    """Add what another process staged to ``tw``, after the rows staged there so far.

    Its schema must equal ``tw``'s, field metadata included (a tensor's shape), else
    :class:`SchemaMismatch`; an episode staged twice is :class:`AlreadyExists`. The
    commit checks its files exist, as it checks its own.
    """
    st = tw._staging()
    if staged.schema is None or not staged.rows:
        return
    where = tw._where()
    if st.schema is None:
        st.schema = staged.schema
    elif not _bare(st.schema).equals(_bare(staged.schema), check_metadata=True):
        raise SchemaMismatch(
            f"{where}: rows staged elsewhere have schema {staged.schema}, the table has {st.schema}"
        )
    else:  # what each process recorded of its rows (schema_records): both kept
        st.schema = merge_records(st.schema, staged.schema)
    st.check_new_episodes(staged.episodes, where)
    tw._flush()
    st.fragments.extend(staged.fragments)
    st.rows += staged.rows
    st.episodes.update(staged.episodes)
    tw._add_media(staged.media)


def _bare(schema: pa.Schema) -> pa.Schema:
    """``schema`` without what each process records of its own rows (to compare them)."""
    return without_records(schema)

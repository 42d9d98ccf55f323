"""Staging in one process, committing in another: staged fragments handed over.

A distributed import's task stages its rows in a :class:`~treadle.table.write.Transaction`
it never commits (Lance data files no version references, video streams in ``media/``),
takes them out with :func:`take_staged` and returns them; the driver adds them to its own
transaction with :func:`add_staged`, in source order, and commits as usual — the same
checks (schema, episode names, every staged file still there) and one branch move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from lance.fragment import FragmentMetadata

from treadle.errors import AlreadyExists, SchemaMismatch

if TYPE_CHECKING:
    from treadle.table.write import TableWriter


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


def take_staged(tw: TableWriter) -> StagedFragments:
    """Write out ``tw``'s rows still in memory; everything staged for its table.

    Nothing is committed: the fragments stay unreferenced until a transaction adds them.
    """
    tx = tw.tx
    st = tx._staged(tw.name)
    tx._flush(tw.name, st)
    media = [k for k, t in tx._media.items() if t == tw.name]
    return StagedFragments(
        tw.name, st.schema, list(st.fragments), st.rows, frozenset(st.episodes), media
    )


def add_staged(tw: TableWriter, staged: StagedFragments) -> None:
    """Add what another process staged to ``tw``, after the rows staged there so far.

    Its schema must equal ``tw``'s, field metadata included (a tensor's shape), else
    :class:`SchemaMismatch`; an episode staged twice is :class:`AlreadyExists`. The
    commit checks its files exist, as it checks its own.
    """
    tx = tw.tx
    st = tx._staged(tw.name)
    if staged.schema is None or not staged.rows:
        return
    where = f"table {tw.name!r} of project {tx.project.name!r}"
    if st.schema is None:
        st.schema = staged.schema
    elif not st.schema.equals(staged.schema, check_metadata=True):
        raise SchemaMismatch(
            f"{where}: rows staged elsewhere have schema {staged.schema}, the table has {st.schema}"
        )
    again = sorted(st.episodes & staged.episodes)
    if again:
        raise AlreadyExists(
            f"{where}: episode {again[0]!r} is written twice in this transaction; "
            "episode names must be unique in a table"
        )
    tx._flush(tw.name, st)
    st.fragments.extend(staged.fragments)
    st.rows += staged.rows
    st.episodes.update(staged.episodes)
    tx._media.update(dict.fromkeys(staged.media, tw.name))

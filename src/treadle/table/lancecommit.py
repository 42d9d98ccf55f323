"""Lance versions that hold exactly what a treadle commit says, at a cost that does not grow.

Several branches share one Lance dataset per table, so a table version must list
exactly "the base version's fragments + the new ones", never another branch's rows.

- **Append** (the usual case: the dataset's latest version is the base): a Lance
  ``Append`` read at the base. Fragments keep their ids and new ones get the next ids,
  so fragment ids grow by the fragments written, and the transaction file lists only
  the new fragments. If Lance had to rebase it on another writer's version (its
  number is not base + 1) that version is not ours; it is left to gc.
- **Overwrite** (another branch or writer wrote the latest version): an explicit list
  of the base's fragments + the new ones. It renumbers the fragments it lists, which
  compaction keeps to O(log rows).
- **Compaction** of the tail, LSM-style: after a commit, the last fragments merge while
  the one before the merged run has at most as many rows as the run (and the run stays
  under ``MAX_ROWS``/``MAX_BYTES``). Every fragment then holds more rows than all later
  ones together, so a table holds O(log rows) fragments and a row is rewritten only
  when its fragment at least doubles: O(log rows) times at most. Merging keeps the row
  order, so a moment's id (its row position) is the same in the compacted version, and
  it writes a new version: versions commits pinned are never changed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import lance
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from treadle.errors import CommitConflict
from treadle.table.evolve import schema_with

MAX_ROWS = 1 << 20  # Lance's rows per data file: a merged run stays one fragment
MAX_BYTES = 256 << 20


def commit_exactly(
    uri: str,
    schema: pa.Schema,
    base: lance.LanceDataset | None,
    new: list[FragmentMetadata],
    options: dict | None,
    before_write: Callable[[], None] = lambda: None,
) -> lance.LanceDataset:
    """A new Lance version holding ``base``'s fragments + ``new`` (compacted), opened.

    ``before_write`` runs before compaction writes data files (a transaction's gc lease).
    """
    # Append keeps the base's schema: a write that changes it (metadata such as the
    # table's fps included) lists the fragments under the new schema instead
    same = base is not None and base.schema.equals(schema, check_metadata=True)
    ds = _append(base, new, options) if same else None
    if ds is None:
        listed = [f.metadata for f in base.get_fragments()] if base is not None else []
        ds = _overwrite(uri, _ids_of(base, schema), listed + new, options)
    return _compact_tail(uri, schema, ds, options, before_write)


def commit_edit(
    uri: str, schema: Any, fragments: list[FragmentMetadata], options: dict | None
) -> int:
    """A new version listing exactly ``fragments`` under the Lance ``schema`` (its field
    ids kept) of a changed table (:mod:`treadle.table.evolve`): no compaction."""
    return _overwrite(uri, schema, fragments, options).version


def _ids_of(base: lance.LanceDataset | None, schema: pa.Schema) -> Any:
    """The schema an explicit listing of ``base``'s fragments commits under: the base's
    own Lance schema (its field ids are the ones its data files name; after a column was
    dropped they are no longer 0..n-1, which an Arrow schema would assign)."""
    if base is None:
        return schema
    if base.schema.equals(schema, check_metadata=True):
        return base.lance_schema
    if dense_ids(base):
        return schema  # only the metadata changed (a first fps), ids as an Arrow schema's
    if base.schema.remove_metadata().equals(schema.remove_metadata(), check_metadata=True):
        # a null, an image size, a first fps or the episodes' records written on a table
        # whose columns were dropped: the base's ids, the new schema metadata (compact()
        # renumbers nothing, so a CommitConflict asking for it, as before, left no way
        # through); a field's own metadata changed is not this case
        return schema_with(base, _metadata_change(base.schema, schema))
    raise CommitConflict(
        f"{uri_name(base)}: a write that lists the fragments of a table whose columns were "
        f"dropped under other columns ({schema.names}, not {base.schema.names}); nothing "
        "was committed"
    )


def _metadata_change(old: pa.Schema, new: pa.Schema) -> dict[str, str | None]:
    """The schema metadata entries ``new`` sets (None: removes) against ``old``."""
    was, now = old.metadata or {}, new.metadata or {}
    out: dict[str, str | None] = {k.decode(): v.decode() for k, v in now.items() if was.get(k) != v}
    out.update({k.decode(): None for k in was if k not in now})
    return out


def dense_ids(ds: lance.LanceDataset) -> bool:
    """Whether ``ds``'s field ids are the ones an Arrow schema of it would be given."""
    from lance.schema import LanceSchema

    def ids(s: Any) -> list[int]:
        out: list[int] = []
        stack = list(reversed(s.fields()))
        while stack:
            f = stack.pop()
            out.append(f.id())
            stack.extend(reversed(f.children()))
        return out

    return ids(ds.lance_schema) == ids(LanceSchema.from_pyarrow(ds.schema))


def uri_name(ds: lance.LanceDataset) -> str:
    return f"table {str(ds.uri).rstrip('/').rsplit('/', 1)[-1].removesuffix('.lance')!r}"


def overwrite(
    uri: str, schema: pa.Schema, fragments: list[FragmentMetadata], options: dict | None
) -> int:
    """A new version listing exactly ``fragments`` (renumbered), whatever is latest."""
    return _overwrite(uri, schema, fragments, options).version


def _overwrite(
    uri: str, schema: Any, fragments: list[FragmentMetadata], options: dict | None
) -> lance.LanceDataset:
    last: Exception | None = None
    for _ in range(100):
        try:
            latest: int | None = lance.dataset(uri, storage_options=options).version
        except ValueError:
            latest = None
        try:
            ds = lance.LanceDataset.commit(
                uri,
                lance.LanceOperation.Overwrite(schema, fragments),
                read_version=latest,
                storage_options=options,
            )
            return ds
        except Exception as e:  # Lance raises CommitConflictError (and OSError on races)
            if "onflict" not in str(e) and "already exists" not in str(e):
                raise
            last = e
            time.sleep(random.uniform(0.0, 0.05))
    raise CommitConflict(f"Lance commit of {uri} kept conflicting: {last}")


def _append(
    base: lance.LanceDataset, new: list[FragmentMetadata], options: dict | None
) -> lance.LanceDataset | None:
    """``Append`` read at ``base``, if no other version came after it; None otherwise
    (then the caller lists the fragments explicitly).

    Committing through the opened ``base`` (not its uri) and without first asking for
    the latest version keeps Lance from listing ``_versions/`` before the commit. Lance
    itself finds any version written after ``base`` (a conflict raises; an ``Append``
    rebases on it): such a version's number is not ``base + 1``, so it is not ours.
    A fragment that already has an id (one of another version's, re-listed by a merge) is
    not appended: Lance keeps that id and orders fragments by id, which would put its rows
    before the base's.
    """
    if any(f.id != 0 for f in new):
        return None
    try:
        ds = lance.LanceDataset.commit(
            base,
            lance.LanceOperation.Append(new),
            read_version=base.version,
            storage_options=options,
        )
    except OSError:
        return None  # a transient I/O fault too: whatever landed, the explicit list is exact
    except Exception as e:
        if "onflict" in str(e) or "already exists" in str(e):
            return None
        raise
    return ds if ds.version == base.version + 1 else None


def merge_run(rows: list[int], sizes: list[int]) -> int:
    """Index where the tail run to merge starts (``len(rows)`` when nothing merges)."""
    n = len(rows)
    if n < 2:
        return n
    j, total, nbytes = n - 1, rows[-1], sizes[-1]
    while (
        j > 0
        and rows[j - 1] <= total
        and total + rows[j - 1] <= MAX_ROWS
        and nbytes + sizes[j - 1] <= MAX_BYTES
    ):
        j -= 1
        total += rows[j]
        nbytes += sizes[j]
    return j if j < n - 1 else n


def _compact_tail(
    uri: str,
    schema: pa.Schema,
    ds: lance.LanceDataset,
    options: dict | None,
    before_write: Callable,
) -> lance.LanceDataset:
    version = ds.version
    frags = ds.get_fragments()
    metas = [f.metadata for f in frags]
    rows = [m.physical_rows - m.num_deletions for m in metas]
    sizes = [sum(df.file_size_bytes or 0 for df in m.files) for m in metas]
    j = merge_run(rows, sizes)
    if j >= len(frags):
        return ds
    try:
        data = pa.concat_tables([f.to_table() for f in frags[j:]])
    except (OSError, pa.ArrowException):
        return ds  # a staged file gc took: the commit's own check names it
    before_write()
    merged = write_fragments(data, ds, schema=schema, storage_options=options)
    keep_ids = [m.id for m in metas[:j]]
    try:
        out = lance.LanceDataset.commit(
            ds,
            lance.LanceOperation.Rewrite(
                [lance.LanceOperation.RewriteGroup(metas[j:], merged)], []
            ),
            read_version=version,
            storage_options=options,
        )
        ids = [f.fragment_id for f in out.get_fragments()]
        if out.version == version + 1 and ids[:j] == keep_ids and len(ids) == j + len(merged):
            return out
    except Exception as e:
        if "onflict" not in str(e) and "already exists" not in str(e):
            raise
    # raced: list it explicitly, under the version's own field ids
    return _overwrite(uri, ds.lance_schema, metas[:j] + merged, options)

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
  branches that write to one table in turn make rare.
"""

from __future__ import annotations

import random
import time

import lance
import pyarrow as pa
from lance.fragment import FragmentMetadata

from treadle.errors import CommitConflict


def commit_exactly(
    uri: str,
    schema: pa.Schema,
    base: lance.LanceDataset | None,
    new: list[FragmentMetadata],
    options: dict | None,
) -> int:
    """A new Lance version holding ``base``'s fragments + ``new``; its number."""
    version = _append(uri, base, new, options) if base is not None else None
    if version is None:
        listed = [f.metadata for f in base.get_fragments()] if base is not None else []
        version = overwrite(uri, schema, listed + new, options)
    return version


def overwrite(
    uri: str, schema: pa.Schema, fragments: list[FragmentMetadata], options: dict | None
) -> int:
    """A new version listing exactly ``fragments`` (renumbered), whatever is latest."""
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
            return ds.version
        except Exception as e:  # Lance raises CommitConflictError (and OSError on races)
            if "onflict" not in str(e) and "already exists" not in str(e):
                raise
            last = e
            time.sleep(random.uniform(0.0, 0.05))
    raise CommitConflict(f"Lance commit of {uri} kept conflicting: {last}")


def _append(
    uri: str, base: lance.LanceDataset, new: list[FragmentMetadata], options: dict | None
) -> int | None:
    """``Append`` on top of ``base`` if it is the latest version and nothing else commits
    meanwhile; None otherwise (then the caller lists the fragments explicitly)."""
    if base.latest_version != base.version:
        return None
    try:
        ds = lance.LanceDataset.commit(
            uri,
            lance.LanceOperation.Append(new),
            read_version=base.version,
            storage_options=options,
        )
    except Exception as e:
        if "onflict" in str(e) or "already exists" in str(e):
            return None
        raise
    return ds.version if ds.version == base.version + 1 else None

"""Column and episode changes of a table on a branch, one commit each (``TableRef``).

Each method runs the same change as a transaction's table writer
(:class:`~treadle.catalog.edits.TableEdits`), alone in one transaction; several
changes, or several tables, in one commit: ``with branch.transaction(msg) as tx:
tx.table(name).add_column(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from treadle.table.defaults import NO_DEFAULT

if TYPE_CHECKING:
    from treadle.catalog.commit import Commit
    from treadle.catalog.transaction import Transaction


class _Branch(Protocol):
    def transaction(self, message: str = ...) -> Transaction: ...


class EditsInOneCommit:
    """The changes of :class:`~treadle.catalog.edits.TableEdits`, one commit each."""

    name: str
    branch: _Branch

    def _one(self, message: str | None, default: str, do: Callable[[Any], Any]) -> Commit | None:
        with self.branch.transaction(message or f"{default} ({self.name})") as tx:
            do(tx.table(self.name))
        return tx.commit

    def add_column(
        self,
        column: str,
        values: Any = None,
        *,
        fn: Callable[[dict[str, Any]], Any] | None = None,
        columns: Sequence[str] | None = None,
        default: Any = NO_DEFAULT,
        executor: Any = None,
        batch_rows: int = 4096,
        progress: bool | None = None,
        message: str | None = None,
    ) -> Commit | None:
        """Add a column: ``values`` per moment (an array in table order) or
        ``{episode: value}``, or computed by ``fn(batch)`` over ``columns``; added columns
        are nullable or carry ``default``. One commit; nothing written on an error."""
        return self._one(message, f"add column {column}", lambda w: w.add_column(
            column, values, fn=fn, columns=columns, default=default, executor=executor,
            batch_rows=batch_rows, progress=progress))  # fmt: skip

    def annotate(
        self,
        column: str,
        labels: Mapping[str, Sequence[tuple[Any, Any, Any]]],
        *,
        frames: bool = False,
        default: Any = NO_DEFAULT,
        message: str | None = None,
    ) -> Commit | None:
        """Add a column from spans ``{episode: [(start_s, end_s, value), ...]}`` (half-open,
        in seconds; ``frames=True``: in frames). One commit."""
        return self._one(message, f"annotate {column}", lambda w: w.annotate(
            column, labels, frames=frames, default=default))  # fmt: skip

    def update(
        self, values: Mapping[str, Any], where: str | None = None, message: str | None = None
    ) -> Commit | None:
        """Set ``{column: value}`` on the rows ``where`` keeps; rows stay where they are.
        A ``where`` that matches nothing warns and commits nothing (None)."""
        return self._one(message, "update", lambda w: w.update(values, where))

    def rename_columns(self, names: Mapping[str, str], message: str | None = None) -> Commit | None:
        """Rename columns ``{old: new}`` (no data written). One commit."""
        return self._one(message, "rename columns", lambda w: w.rename_columns(names))

    def drop_columns(self, names: Sequence[str], message: str | None = None) -> Commit | None:
        """Drop columns from the new version on. One commit."""
        return self._one(message, "drop columns", lambda w: w.drop_columns(names))

    def delete_episodes(self, episodes: Sequence[str], message: str | None = None) -> Commit | None:
        """Remove episodes from the new version on (media kept while a retained commit
        reaches them). One commit."""
        return self._one(message, "delete episodes", lambda w: w.delete_episodes(episodes))

    def compact(self, message: str | None = None) -> Commit | None:
        """Rewrite fragments spread over several data files by edits, values unchanged;
        None when there is nothing to do."""
        return self._one(message, "compact", lambda w: w.compact())

"""Where an import's work runs: in this process (the default) or through an executor.

Every importer splits its input into **sources** — WebDataset and Hugging Face files, MDS
shards, LeRobot episodes — and hands :func:`~treadle.importers.run.run_import` a
``write(table_writer, bar, only=None)`` that stages the rows of the sources whose indices
are in ``only`` (all of them when ``only`` is None), in source order.

Without an executor, ``run_import`` calls ``write`` once inside the import's
transaction. With one (``importers.webdataset(..., executor=td.RayExecutor())``), the
executor stages the sources elsewhere, each as uncommitted fragments, and adds them to
that same transaction in source order; the commit is the one ``run_import`` always
makes: one commit, the import id in its message, nothing visible before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from treadle.errors import MissingDependency

if TYPE_CHECKING:
    from treadle.catalog.transaction import TableWriter
    from treadle.importers.run import Progress

_T = TypeVar("_T")

#: ``write(table_writer, bar, only) -> (rows, episodes, bytes read)``
WriteFn = Callable[..., tuple[int, int, int]]

RAY_INSTALL = "pip install 'treadle[ray]'"


def pick(items: Sequence[_T], only: Sequence[int] | None) -> list[_T]:
    """``items`` at the indices ``only`` (every item when ``only`` is None), in that order."""
    return list(items) if only is None else [items[i] for i in only]


class Executor:
    """Runs an import's sources somewhere and stages their rows into one transaction."""

    def write(
        self, tw: TableWriter, write: WriteFn, sources: Sequence[str], bar: Progress
    ) -> tuple[int, int, int]:
        """Stage every source into ``tw`` (in source order); ``(rows, episodes, bytes)``.

        ``bar`` counts completed sources. On any exception nothing may have been added
        to ``tw``'s transaction that the caller would then commit: raise.
        """
        raise NotImplementedError

    def map(
        self, fn: Callable[[_T], Any], items: Sequence[_T], what: Callable[[_T], str]
    ) -> list[Any]:
        """``[fn(item) for item in items]``, run elsewhere (``table.stats(executor=...)``);
        ``what(item)`` names an item in errors. ``fn`` must be importable there."""
        raise NotImplementedError


def require_ray() -> Any:
    """``import ray``, or :class:`MissingDependency` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependency(
            f"td.RayExecutor (--ray on treadle import and treadle stats) needs the 'ray' "
            f"package, which is not installed ({e}); "
            f"install it with: {RAY_INSTALL}"
        ) from None
    return ray

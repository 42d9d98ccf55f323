"""Imports that outgrow one machine: every source is a Ray task; the driver commits once.

``importers.webdataset(srcs, project, table, executor=td.RayExecutor())`` (or ``treadle
import ... --ray [ADDRESS]``) runs one Ray task per source (a WebDataset or Hugging Face
file, an MDS shard, a LeRobot episode). Each task opens the project from its root URL,
stages its rows in a transaction it never commits — data files written straight into the
table's Lance dataset as uncommitted fragments, video streams written to the project's
``media/`` — and returns only :class:`~treadle.table.handoff.StagedFragments` (fragment
metadata, schema, row count, episode names, media keys). The driver adds them to the
import's own transaction in source order and commits there, as a one-process import does:
the same rows in the same order (so the same moment positions and episode names), the same
import id in the commit message, one branch move.

Schema: as in one process, the first source (in source order) with rows fixes the schema
of a new table; a source whose task inferred another schema is staged again, conformed to
it (exact casts only, never a struct field dropped or invented), or fails with
:class:`SchemaMismatch` naming the source. One process fixes inferred types (JSON members)
per chunk of samples, a task per source: a later source whose JSON has keys the first
lacks is refused here, and in one process only when it falls in a later chunk.

Failure and restart:

- a task whose worker dies is retried by Ray (``max_retries``); a task that raises (a
  corrupt shard) fails the import with the task's own error (same type and message);
- a failed, cancelled (Ctrl-C) or interrupted import commits nothing; what its tasks
  staged is referenced by no version and removed by ``treadle gc`` (after its grace period;
  while the import runs, the driver's gc lease, taken before the first task starts, keeps
  every task's files, however long the import takes). Tasks stage under that lease and
  take none of their own (:meth:`Transaction.stage_under`): a task killed mid-write (the
  cancel is forced) leaves no lease that would keep its files from gc, and a task still
  running (or rerun) after the driver has given up finds its lease gone at its next write
  and raises instead of writing;
- re-running the same import starts over cleanly: it stages everything again (nothing of
  the first attempt is reused) and, if the first attempt had in fact committed, it is
  skipped by its import id.

The store must be reachable by every worker under the same root: an object-store URL, or
for a local root, one machine (or a filesystem shared under the same path). The commit
checks that every staged file is there, as it always does. ``storage_options``
travel to the tasks as task arguments (never logged). treadle must be importable on every
node of the cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from treadle import layout
from treadle.catalog.client import ProjectAddress
from treadle.errors import SchemaMismatch, StorageError, TreadleError
from treadle.importers.executor import Executor, WriteFn, require_ray
from treadle.table.handoff import StagedFragments, add_staged, take_staged
from treadle.table.schema_records import without_records

if TYPE_CHECKING:
    import pyarrow as pa

    from treadle.catalog.transaction import TableWriter
    from treadle.importers.run import Progress

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Target:
    """Where a task stages: the project (opened from its root), branch and table, and the
    driver's gc lease it stages under."""

    project: ProjectAddress
    branch: str
    table: str
    lease: str


@dataclass(frozen=True)
class _TaskResult:
    staged: StagedFragments
    rows: int
    episodes: int
    nbytes: int


class RayExecutor(Executor):
    """Run an import's sources as Ray tasks; commit once, in source order, on the driver.

    Args:
        address: the Ray cluster (``"auto"``, ``"ray://head:10001"``, ``"10.0.0.1:6379"``).
            None: the cluster this process is already connected to, else what
            ``ray.init()`` finds (``$RAY_ADDRESS``) or a new local one.
        num_cpus: CPUs each task reserves (so the cluster's CPUs / ``num_cpus`` sources
            run at once).
        max_retries: how many times Ray reruns a task whose worker died.
        max_in_flight: tasks submitted at once (default: twice the tasks the cluster's
            CPUs can run); bounds the driver's bookkeeping, not the result sizes, which
            are a few fragment records per source.

    ``table.stats(..., executor=RayExecutor())`` (or ``treadle stats --ray``) runs its scan
    through :meth:`map` instead: a task per group of fragments, merged on the driver.

    Raises :class:`~treadle.errors.MissingDependency` (``pip install 'treadle[ray]'``)
    when Ray is not installed.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1,
        max_retries: int = 3,
        max_in_flight: int | None = None,
    ):
        require_ray()
        if num_cpus <= 0 or max_retries < 0 or (max_in_flight is not None and max_in_flight < 1):
            raise ValueError("num_cpus must be > 0, max_retries >= 0, max_in_flight >= 1")
        self.address = address
        self.num_cpus = num_cpus
        self.max_retries = max_retries
        self.max_in_flight = max_in_flight
        # test-only: (source index, marker folder, attempts) makes the first `attempts`
        # attempts of that source's task kill their worker after staging, its transaction
        # open; attempts -1: it marks "staged" and sleeps there instead (to be cancelled)
        self._crash: tuple[int, str, int] | None = None

    def __repr__(self) -> str:
        return f"RayExecutor(address={self.address!r}, num_cpus={self.num_cpus})"

    def _connect(self) -> Any:
        ray = require_ray()
        if not ray.is_initialized():
            local = self.address is None and not os.environ.get("RAY_ADDRESS")
            extra = {"include_dashboard": False} if local else {}
            ray.init(address=self.address, log_to_driver=False, **extra)
        return ray

    def write(
        self, tw: TableWriter, write: WriteFn, sources: Sequence[str], bar: Progress
    ) -> tuple[int, int, int]:
        """Stage every source on Ray, then add them to ``tw`` in source order."""
        ray = self._connect()
        project = ProjectAddress.of(tw.tx.branch.project)
        target = _Target(project, tw.tx.branch.name, tw.name, tw.tx.lease_key)
        task = ray.remote(_stage_source).options(
            num_cpus=self.num_cpus, max_retries=self.max_retries, retry_exceptions=False
        )
        write_ref = ray.put(write)
        tw.tx.hold()  # gc keeps whatever the tasks stage from now until the commit (or the end)
        out: list[_TaskResult | None] = [None] * len(sources)

        def run(indices: Sequence[int], schema: pa.Schema | None, count: bool) -> None:
            def done(i: int, ref: Any) -> None:
                out[i] = self._result(
                    ray, ref, f"import of {sources[i]}", "; nothing was committed"
                )
                if count:
                    bar.update(1)

            def submit(i: int) -> Any:
                return task.remote(target, write_ref, i, sources[i], schema, self._crash)

            self._run_tasks(ray, submit, indices, done, tw.tx.hold)

        run(range(len(sources)), tw.schema, True)
        done: list[_TaskResult] = [r for r in out if r is not None]
        schema = tw.schema or next((r.staged.schema for r in done if r.staged.rows), None)
        redo = [
            i
            for i, r in enumerate(out)
            if r is not None
            and r.staged.rows
            # what each task recorded of its own rows (episode names) differs by design
            and not without_records(r.staged.schema).equals(
                without_records(schema), check_metadata=True
            )
        ]
        if redo:  # as one process casts later sources to the first one's schema
            run(redo, schema, False)
        for name, r in zip(sources, out):
            assert r is not None
            if tw.tx.project.store.is_local:
                _check_landed(tw, r.staged, name)
            add_staged(tw, r.staged)
        return (
            sum(r.rows for r in out if r),
            sum(r.episodes for r in out if r),
            sum(r.nbytes for r in out if r),
        )

    def map(
        self, fn: Callable[[_T], Any], items: Sequence[_T], what: Callable[[_T], str]
    ) -> list[Any]:
        """``[fn(item) for item in items]``, one Ray task per item (``table.stats``)."""
        ray = self._connect()
        task = ray.remote(fn).options(
            num_cpus=self.num_cpus, max_retries=self.max_retries, retry_exceptions=False
        )
        out: list[Any] = [None] * len(items)

        def done(i: int, ref: Any) -> None:
            out[i] = self._result(ray, ref, what(items[i]), "")

        self._run_tasks(ray, lambda i: task.remote(items[i]), range(len(items)), done)
        return out

    def _run_tasks(
        self,
        ray: Any,
        submit: Callable[[int], Any],
        indices: Sequence[int],
        done: Callable[[int, Any], None],
        tick: Callable[[], None] | None = None,
    ) -> None:
        """``submit(i)`` for every index, a bounded number in flight; ``done(i, ref)`` as each
        ends, ``tick()`` at least every 10 s. On any exception the rest are cancelled."""
        todo = list(reversed(indices))
        limit = self.max_in_flight or max(
            2, int(2 * ray.cluster_resources().get("CPU", 1) / self.num_cpus)
        )
        pending: dict[Any, int] = {}
        try:
            while todo or pending:
                while todo and len(pending) < limit:
                    i = todo.pop()
                    pending[submit(i)] = i
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=10)
                if tick is not None:
                    tick()
                for ref in ready:
                    done(pending.pop(ref), ref)
        except BaseException:
            for ref in pending:  # failed or interrupted: stop the rest (commit nothing)
                with suppress(Exception):
                    ray.cancel(ref, force=True)
            with suppress(Exception):  # and let them end, so none writes after we return
                ray.wait(list(pending), num_returns=len(pending), timeout=30)
            # one still running (or rerun) then meets the driver's lease gone at its next
            # write and stops: tasks stage under that lease only (see _stage_source)
            raise

    def _result(self, ray: Any, ref: Any, what: str, after: str) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, TreadleError):
                raise e.cause from None  # the task's own error: same type and message
            raise
        except ray.exceptions.RayError as e:
            raise TreadleError(
                f"{what}: its Ray task failed {self.max_retries + 1} time(s) "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300]}){after}"
            ) from None


def _stage_source(
    target: _Target,
    write: WriteFn,
    index: int,
    source: str,
    schema: pa.Schema | None,
    crash: tuple[int, str, int] | None,
) -> _TaskResult:
    """One Ray task: stage source ``index`` in a transaction that is never committed."""
    from treadle.importers.run import Progress

    branch = target.project.open().branch(target.branch)
    tx = branch.transaction(f"stage source {index} of an import (never committed)")
    # no lease of its own: one a force-cancelled task (killed mid-write) left behind would
    # keep its orphans from gc for the lease TTL; and once the driver's lease is gone (the
    # import ended), every write raises instead
    tx.stage_under(target.lease)
    tw = tx.table(target.table)
    if schema is not None:
        tw.use_schema(schema)
    try:
        rows, episodes, nbytes = write(tw, Progress(None, "", "source", False), [index])
        staged = take_staged(tw)
        if crash is not None and crash[0] == index:  # its transaction open, as when cancelled
            _maybe_crash(crash[1], crash[2])
    except SchemaMismatch as e:
        if source in str(e):
            raise
        raise SchemaMismatch(f"{source}: {e}") from None  # rows conformed to another source's
    finally:
        tx.close()
    return _TaskResult(staged, rows, episodes, nbytes)


def _maybe_crash(folder: str, attempts: int) -> None:
    if attempts < 0:  # staged, its transaction open: wait there to be cancelled
        with open(os.path.join(folder, "staged"), "w"):
            pass
        time.sleep(60)
        return
    for k in range(attempts):
        try:
            fd = os.open(os.path.join(folder, f"attempt-{k}"), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            continue
        os.close(fd)
        os._exit(1)  # the worker dies after staging: its files are orphans, Ray retries


def _check_landed(tw: TableWriter, staged: StagedFragments, source: str) -> None:
    """Every file a task staged exists where the driver commits (a local root is per machine)."""
    project = tw.tx.project
    store = project.store
    data = f"{layout.table_key(project.prefix, tw.name)}/data"
    keys = [f"{data}/{df.path}" for f in staged.fragments for df in f.files] + staged.media
    gone = store.missing(keys)
    if gone:
        raise StorageError(
            f"import of {source}: {gone[0]}, which its task wrote, is not there for the "
            f"commit (written on another machine: a local root {store.url!r} on a "
            "multi-machine Ray cluster? use an object-store root; or deleted by a gc with a "
            "grace shorter than the import); nothing was committed"
        )

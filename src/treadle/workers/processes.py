"""``workers=N``: the delivery loop in N worker processes, batches through shared memory.

Worker ``k`` of ``n`` (:mod:`treadle.workers.worker`, no torch) rebuilds the plan from its
run record, reads steps ``start+k, start+k+n, ...`` and writes each batch into one of its
shared-memory slots (:mod:`treadle.workers.slots`); only ``(step, slot, layout)`` crosses its
pipe. The loader takes the steps back in order, round-robin over the workers, copies each
batch out of its slot and hands the slot back, so a worker never has more than its slots'
worth of batches ahead, and a batch the caller keeps is never overwritten. A loader without
a transform reads its first step in its own process while the workers start (they take the
steps after it), so its first batch does not wait for the server's imports.

Processes come from a *forkserver* that has imported treadle's read path once, without
torch: a worker forks from it in milliseconds instead of starting Python and importing
Lance and PyAV again, and it is never forked from the loader's own process (Lance's runtime
threads are not fork-safe; the server opens no table). The caller's main module is not
imported there (it is often ``import torch``), and a worker runs it only when its job needs
an object defined in it (:mod:`treadle.workers.serverinit`). An error in a worker is raised in
the loader at its step, with the worker's traceback as a note; a worker that dies is an
error naming it. Closing the loader early (``break``) terminates its workers.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from treadle import reaper
from treadle.errors import PlanError, TreadleError
from treadle.fork_locks import check_not_forked, renew_lock_in_child
from treadle.read.shared_window import SharedWindow
from treadle.workers import leftovers, messages
from treadle.workers.nopandas import SERVER_ENV
from treadle.workers.slots import Slot, SlotFd
from treadle.workers.worker import Job, work

__all__ = [
    "MAX_WORKER_PREFETCH",
    "Job",
    "check_workers",
    "context",
    "preload_workers",
    "read_in_processes",
]

# A worker is handed prefetch + 1 slot descriptors and two pipe ends, and the forkserver
# passes a new process's descriptors in one message of fewer than 256 - 4
# (multiprocessing.forkserver.MAXFDS_TO_SEND): prefetch 248 and up was "too many fds".
MAX_WORKER_PREFETCH = 240

_PRELOAD = ["treadle.workers.serverinit"]


_starting = threading.Lock()

log = logging.getLogger(__name__)

#: How long the loader waits for a worker's batch before it says so, again each time as long
#: (it keeps waiting: a slow batch is no error, but a hung worker was a silent hang)
STALL_WARN_S = 300.0

# The handles of each read_in_processes whose workers are not ended yet, reachable from here
# until _end: a dropped loader's cycle, collected, would otherwise finalize its pipes and
# processes (closing their descriptors) in the pass whose generator finalizer hands _end to
# the reaper, which then closed those numbers again (by then perhaps another file's).
_RUNNING: dict[int, list[_Handle]] = {}


renew_lock_in_child(sys.modules[__name__], "_starting")

# Set when interpreter exit begins (before multiprocessing's exit hook, which terminates
# the workers of loaders still running on other threads): see _Handle._gone
_EXITING = threading.Event()
_EXIT_HOOK: list[bool] = []


def _disown_in_child() -> None:
    """In a forked child: the running loaders' workers are the parent's. multiprocessing
    counts them among the child's own children, and a child that exits normally (its
    ``atexit``) terminated them, under the parent's live loader ("worker process 0 exited
    (code -15)"); the child's copies of their pipes kept a worker from seeing its loader's
    end. They are dropped from its children and their descriptors closed here."""
    mine = [h for handles in list(_RUNNING.values()) for h in list(handles)]
    for h in mine:
        multiprocessing.process._children.discard(h.proc)  # type: ignore[attr-defined]
    for h in mine:
        try:
            h.close()  # this process's copies only (not its owner: no signal, no join)
        except Exception:  # (a slot's mapping still exported by a parent's thread's frame)
            pass  # its descriptors close when this process exits


os.register_at_fork(after_in_child=_disown_in_child)


def context() -> Any:
    """The multiprocessing context workers start from (a preloaded forkserver where there is
    one, else spawn); starts the server now so it imports while the caller gets ready."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    server = forkserver._forkserver
    with _starting:
        if server._forkserver_pid is None:  # first use in this process: choose what it imports
            ctx.set_forkserver_preload(_PRELOAD)
        # the server inherits this environment when it starts (and only then): it imports
        # pyarrow without pandas (treadle.workers.nopandas); its workers restore the loader's
        os.environ[SERVER_ENV] = "1"
        # and the folder of its socket, which it removes if this process dies without
        os.environ[leftovers.FOLDER_ENV] = leftovers.handed_over()
        try:
            _start_shielded(server)
        finally:
            os.environ.pop(SERVER_ENV, None)
            os.environ.pop(leftovers.FOLDER_ENV, None)
    return ctx


def _start_shielded(server: Any) -> None:
    """``server.ensure_running()`` with SIGINT blocked while the server is spawned. It starts
    with that mask, so a Ctrl-C while it imports (a second or more) waits until its preload
    (:mod:`treadle.workers.serverinit`) drops it: the terminal's Ctrl-C, sent to the whole
    process group, killed the server mid-import with a KeyboardInterrupt traceback (as
    multiprocessing's resource tracker shields its own start). Blocked, not ignored: a
    Ctrl-C meant for this process in that moment is delivered once it is unblocked.
    SIGTERM is blocked too, and kept pending in the server until it can remove the folder of
    its socket (:mod:`treadle.workers.leftovers`): a process group's SIGTERM while it
    imported killed it before, leaving the folder."""
    if not hasattr(signal, "pthread_sigmask"):
        server.ensure_running()
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # first: its own start unblocks SIGINT after it
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        server.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def preload_workers(wait: bool = False) -> None:
    """Start the process server that ``workers=N`` loaders fork their workers from, now.

    The first ``workers=N`` loader of a process otherwise starts it when it is made, and its
    first batch from a worker waits for the server's imports (Lance, PyAV, treadle's read
    path: ~0.4-0.5 s of CPU in a process of its own; a loader without a transform reads its
    first step itself meanwhile). A script that calls this before it loads its model pays
    that while the model loads. Returns at once; ``wait=True`` returns once the server has
    imported and forked a first (empty) process. Harmless to call again, and where there is
    no forkserver (not Linux or macOS) it does nothing."""
    ctx = context()
    if wait and ctx.get_start_method() == "forkserver":
        p = ctx.Process(target=os.getpid, name="treadle-preload", daemon=True)
        p.start()
        p.join()


def check_workers(workers: int, prefetch: int) -> None:
    """:class:`PlanError`, when the loader is made, for worker settings that cannot start."""
    if not workers:
        return
    if prefetch > MAX_WORKER_PREFETCH:
        raise PlanError(
            f"prefetch={prefetch} with workers={workers}: each worker process holds prefetch + 1 "
            f"shared-memory slots, handed over as file descriptors, at most "
            f"{MAX_WORKER_PREFETCH} (use prefetch <= {MAX_WORKER_PREFETCH}; more workers read "
            "further ahead)"
        )
    if multiprocessing.current_process().daemon:
        raise PlanError(
            f"workers={workers} inside a daemon process ({multiprocessing.current_process().name}"
            "): multiprocessing does not let a daemon process start worker processes; use "
            "workers=0 here, or start this process with daemon=False"
        )


class _Handle:
    """The loader's side of one worker: its process, pipes and slots."""

    def __init__(self, ctx: Any, job: Job, k: int, n: int, window: int | None = None):
        self.k = k
        self.home = os.getpid()  # the loader's process: a forked child's copy is not its owner
        made = ExitStack()  # closes each descriptor made here if the handle is not (EMFILE)
        try:
            fds: list[int] = []
            for i in range(job.depth + 1):
                fds.append(os.memfd_create(f"treadle-worker{k}-slot{i}"))
                made.callback(os.close, fds[-1])
            self.inbox, out = ctx.Pipe(duplex=False)
            made.callback(self.inbox.close)
            made.callback(out.close)
            back, self.outbox = ctx.Pipe(duplex=False)
            made.callback(back.close)
            made.callback(self.outbox.close)
            shared = None if window is None else SlotFd(window)  # a lookahead's SharedWindow
            self.proc = ctx.Process(target=work, args=(job, k, n, out, back,
                                                       [SlotFd(f) for f in fds], shared),
                                    name=f"treadle-worker-{k}", daemon=True)  # fmt: skip
        except BaseException:
            made.close()
            raise
        made.pop_all()  # the slots and self.close() own them now
        self.slots = [Slot(fd) for fd in fds]
        try:
            self.proc.start()
        except BaseException:
            self.close()
            raise
        finally:
            out.close()
            back.close()

    def take(self, step: int) -> dict[str, Any]:
        """The batch of ``step``, copied out of its slot; the slot goes back to the worker."""
        check_not_forked(self.home, f"a workers= loader's iterator (worker process {self.k})")
        try:
            self._wait(step)
            msg: messages.Message = self.inbox.recv()
        except (EOFError, OSError):
            self._gone()
            raise TreadleError(
                f"treadle worker process {self.k} exited (code {self.proc.exitcode}) before "
                f"it delivered step {step}"
            ) from None
        if msg.kind == messages.ERROR:
            raise msg.payload
        if msg.kind != messages.BATCH or msg.step != step:
            raise TreadleError(
                f"treadle worker process {self.k} sent {msg.kind} {msg.step}, not step {step}"
            )
        batch = self.slots[msg.slot].unpack(msg.payload)
        try:
            self.outbox.send(msg.slot)
        except OSError:  # a worker done with its steps has gone: nothing to hand back
            pass
        return batch

    def _gone(self) -> None:
        """The worker has gone: wait for its exit code. At interpreter exit, on a thread
        other than the main one (a daemon thread: exit waited for the others), it was
        ended by the exit (multiprocessing terminates the workers of a loader iterated
        there): that thread waits for the exit to end it instead of printing a traceback
        that says the worker died."""
        self.proc.join(5)
        if _EXITING.is_set() and threading.current_thread() is not threading.main_thread():
            threading.Event().wait()

    def _wait(self, step: int) -> None:
        """Until the worker has sent something (or ended: EOF), saying so every
        :data:`STALL_WARN_S` while it is alive; ``EOFError`` if it is gone without a word."""
        waited = 0.0
        while not self.inbox.poll(STALL_WARN_S):
            if not self.proc.is_alive():
                raise EOFError
            waited += STALL_WARN_S
            log.warning("treadle: worker process %d (pid %s) has not delivered step %d in "
                        "%.1f s; still waiting", self.k, self.proc.pid, step, waited)  # fmt: skip

    def close(self) -> None:
        for conn in (self.inbox, self.outbox):
            conn.close()
        if self.proc.pid is not None and os.getpid() == self.home:  # started, by this process
            if self.proc.is_alive():
                self.proc.terminate()
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        for slot in self.slots:
            slot.close()


def read_in_processes(
    job: Job, workers: int, first: Callable[[int], dict[str, Any]] | None = None,
    window: SharedWindow | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The batches of steps ``job.start ..`` (to ``job.stop``) from ``workers`` processes,
    in step order. ``window``: a lookahead's shared window (each worker maps it; its
    descriptor is closed here when the workers end).

    ``first``: reads step ``job.start`` in this process (``first(step) -> batch``); the
    workers then take the steps after it and are started on a thread while ``first`` runs,
    so the first batch does not wait for the server's imports (issue 33: the cold start)."""
    ctx = context()
    if not _EXIT_HOOK:  # after multiprocessing's (context() imported it): runs before it
        atexit.register(_EXITING.set)
        _EXIT_HOOK.append(True)
    if first is not None:
        job = replace(job, start=job.start + 1)
        if job.stop is not None:
            workers = min(workers, job.stop - job.start)
    handles: list[_Handle] = []
    failed: list[BaseException] = []
    fd = None if window is None else window.fd
    starter = threading.Thread(target=_start, args=(ctx, job, workers, handles, failed, fd),
                               name="treadle-worker-start", daemon=True)  # fmt: skip
    # stopped early (maybe by a finalizer, on any thread) the reaper ends the workers
    with reaper.closing(_end, starter, handles, window):
        _RUNNING[id(handles)] = handles
        starter.start()
        if first is not None:
            yield first(job.start - 1)
        starter.join()
        if failed:
            raise failed[0]
        steps = itertools.count(job.start) if job.stop is None else range(job.start, job.stop)
        for step in steps:
            yield handles[(step - job.start) % workers].take(step)


def _end(starter: threading.Thread, handles: list[_Handle], window: SharedWindow | None) -> None:
    """Wait for the starter thread, then end every worker and free its slots."""
    try:
        if starter.ident is not None:
            starter.join()
        for h in handles:
            h.close()
        if window is not None:
            window.close()
    finally:
        _RUNNING.pop(id(handles), None)


def _start(ctx: Any, job: Job, workers: int, handles: list[_Handle],
           failed: list[BaseException], window: int | None = None) -> None:  # fmt: skip
    """Start ``workers`` processes into ``handles`` (on a thread: each start waits for the
    server's imports); the first error goes into ``failed``."""
    try:
        for k in range(workers):
            handles.append(_Handle(ctx, job, k, workers, window))
    except BaseException as e:
        failed.append(e)

"""Locks that a forked child gets afresh, and what it may not go on using.

A child forked while another thread of its parent holds a lock inherits the lock held, but
not the thread that would release it: the child's first use of it waits forever (its first
object-store call, say). Every module- or class-level lock a child may use is renewed in
each forked child by :func:`renew_lock_in_child`. An iterator that runs threads or worker
processes checks :func:`check_not_forked` before it waits for them.
"""

from __future__ import annotations

import os
import threading

from treadle.errors import ForkError


def renew_lock_in_child(owner: object, name: str) -> None:
    """Make ``owner.name`` (a module's or a class's lock) a new ``threading.Lock`` in every
    child forked from now on."""
    os.register_at_fork(after_in_child=lambda: setattr(owner, name, threading.Lock()))


def check_not_forked(home: int, what: str) -> None:
    """:class:`~treadle.errors.ForkError` when this is not process ``home``: ``what`` (an
    iterator, its threads or worker processes) was started there, and a forked child has
    none of its threads, while its worker processes and pipes are the parent's (a read in
    the child would wait forever, or take the parent's batches)."""
    pid = os.getpid()
    if pid == home:
        return
    raise ForkError(
        f"{what} was started in process {home}, and this process ({pid}) was forked from it "
        "(os.fork()): its threads are not here and its worker processes are the parent's, "
        "so it cannot go on in this process (it would wait forever or take the parent's "
        "batches). Make a new loader in the child after a 'spawn' or 'forkserver' start "
        "(multiprocessing.get_context('spawn')), or iterate it in the parent only."
    )

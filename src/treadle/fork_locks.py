"""Locks that a forked child gets afresh.

A child forked while another thread of its parent holds a lock inherits the lock held, but
not the thread that would release it: the child's first use of it waits forever (its first
object-store call, say). Every module- or class-level lock a child may use is renewed in
each forked child by :func:`renew_lock_in_child`.
"""

from __future__ import annotations

import os
import threading


def renew_lock_in_child(owner: object, name: str) -> None:
    """Make ``owner.name`` (a module's or a class's lock) a new ``threading.Lock`` in every
    child forked from now on."""
    os.register_at_fork(after_in_child=lambda: setattr(owner, name, threading.Lock()))

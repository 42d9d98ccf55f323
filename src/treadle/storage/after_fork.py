"""Object-store use after ``os.fork()``: a named error at once, never a hang.

obstore runs every request on a Rust (tokio) runtime whose threads live in the process
that first used it. ``os.fork()`` copies the runtime's state but not its threads, so in a
forked child any request, on any store object, old or new, sync or async, waits forever
for a thread that is not there (measured with obstore 0.12: a child's ``obstore.get``
after the parent's first request never returns). Lance reads of a dataset opened in the
parent were measured to return in the child, but every treadle read starts with a store
request (a branch ref, a manifest, a media range), so this guard covers them all.

So the first request of a process claims the runtime for that process, and a request in
any other process that inherited the claim (a fork after the first request) raises
:class:`~treadle.errors.ForkError` before touching obstore. A child forked before the
parent's first request (a forkserver that opened nothing, as treadle's worker server is)
has no claim and works.
"""

from __future__ import annotations

import os

from treadle.errors import ForkError

_OWNER: int | None = None  # the pid whose obstore runtime is running (None: none yet)


def claim(what: str) -> None:
    """Call before every obstore request: ``what`` names it in the error."""
    global _OWNER
    pid = os.getpid()
    if _OWNER == pid:
        return
    if _OWNER is None:
        _OWNER = pid
        return
    raise ForkError(
        f"{what}: this process ({pid}) was forked (os.fork()) from process {_OWNER} after "
        "that process had read from the store; the object-store and Lance runtimes do not "
        "survive a fork (every read would hang). Start it with 'spawn' or 'forkserver' "
        "(multiprocessing.get_context('spawn'); DataLoader(..., "
        "multiprocessing_context='spawn')), or fork before the first read and make the "
        "td.Client in the child."
    )

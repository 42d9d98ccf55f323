"""Imported only by the forkserver that worker processes fork from (its preload).

The server imports what every worker needs (Lance, PyAV, treadle's read path; no torch) once,
opens no table and starts no Lance runtime, and then forks: that is the use Lance's
"not fork-safe" warning (raised before every fork of a process that imported Lance) asks
for, so it is silenced here, in this process only. It imports no pandas
(:mod:`treadle.workers.nopandas`).

A process started by multiprocessing first re-runs the parent's main module (so that
objects defined there unpickle). For a training script that is ``import torch`` and more,
about a second per worker, every time a loader starts its workers, although a worker
rarely needs anything from it: the loader's job names treadle's functions, and the main
module only when the caller's transform (or sampler) is defined there. So a worker forked
from this server gets a *lazy* main module instead, which runs the script exactly as
multiprocessing would have (same ``sys.path``, ``argv``, directory, run as
``__mp_main__``) the first time anything is looked up in it, such as a transform that
is unpickled.
"""

import signal
import sys
import threading
import types
import warnings
from multiprocessing import process, spawn
from typing import Any

import numpy.ma  # noqa: F401  (np.unique imports it on first use: in every worker, at its first batch)

import treadle.workers.worker  # noqa: F401  (what the workers run)
from treadle.workers import leftovers
from treadle.workers.nopandas import in_worker_server

warnings.filterwarnings("ignore", message="lance is not fork-safe")

_prepare = spawn.prepare
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


class _LazyMain(types.ModuleType):
    """Stands in for the parent's main module until something is looked up in it."""

    def __init__(self, data: dict[str, Any], server_main: types.ModuleType):
        super().__init__("__mp_main__")
        self.__dict__.update(_treadle_main=(data, server_main), _treadle_lock=threading.Lock())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # module protocol probes
            raise AttributeError(name)
        return getattr(self._treadle_load(), name)

    def _treadle_load(self) -> types.ModuleType:
        with self.__dict__["_treadle_lock"]:
            real = self.__dict__.get("_treadle_real")
            if real is None:
                real = _run_main(*self.__dict__["_treadle_main"], self)
                self.__dict__["_treadle_real"] = real
        return real


def _run_main(
    data: dict[str, Any], server_main: types.ModuleType, lazy: _LazyMain
) -> types.ModuleType:
    """Run the parent's main module as :func:`multiprocessing.spawn.prepare` would have."""
    sys.modules["__main__"] = server_main  # the module prepare would have replaced
    me = process.current_process()
    inheriting = getattr(me, "_inheriting", False)
    me._inheriting = True  # a main module that starts processes unguarded fails as with spawn
    try:
        if "init_main_from_name" in data:
            spawn._fixup_main_from_name(data["init_main_from_name"])
        else:
            spawn._fixup_main_from_path(data["init_main_from_path"])
    except BaseException:
        sys.modules["__main__"] = sys.modules["__mp_main__"] = lazy
        raise
    finally:
        if not inheriting:
            del me._inheriting
    return sys.modules["__main__"]


def _prepare_lazily(data: dict[str, Any]) -> None:
    """:func:`multiprocessing.spawn.prepare` with the main module made lazy (and SIGTERM's
    default action: the server's handler is its own)."""
    leftovers.default_sigterm()
    main = {k: data[k] for k in _MAIN_KEYS if k in data}
    _prepare({k: v for k, v in data.items() if k not in _MAIN_KEYS})
    if main:
        lazy = _LazyMain(main, sys.modules["__main__"])
        sys.modules["__main__"] = sys.modules["__mp_main__"] = lazy


spawn.prepare = _prepare_lazily  # this server's children only: it runs no other code


def _drop_early_interrupts() -> None:
    """The server started with SIGINT blocked (``processes._start_shielded``): a Ctrl-C that
    came while it imported is dropped (setting SIG_IGN discards a pending signal), then
    SIGINT is unblocked with its handler as before; multiprocessing's server then ignores
    it itself and gives its children that handler."""
    if not in_worker_server() or not hasattr(signal, "pthread_sigmask"):
        return
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, before)


_drop_early_interrupts()
if in_worker_server():
    leftovers.remove_when_orphaned()

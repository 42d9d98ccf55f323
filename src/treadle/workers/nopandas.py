"""The worker processes' server imports pyarrow's dataset module without pandas.

``import pyarrow.dataset`` (Lance imports it) builds a scalar at import time, and pyarrow's
check of whether that value is a pandas object imports pandas: 0.15-0.4 s of the ~0.6-1 s
the server takes to start, which a ``workers=N`` loader's first batch waits for (issue 33),
for a library no worker uses. The server (started with :data:`SERVER_ENV` set, see
:func:`treadle.workers.processes.context`) therefore imports it with pandas hidden, before
``treadle`` imports Lance; pyarrow then records "no pandas". So that a worker's transform that
does use pandas still has pyarrow recognise pandas objects, pyarrow is told again as soon as
anything in the process imports pandas (its pandas shim re-checks on a strict use, which
:func:`_tell_pyarrow` makes). Any other process imports pyarrow as usual.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Set (to "1") in the environment the worker processes' server starts with; workers
#: restore the loader's environment, so it never reaches a worker's code.
SERVER_ENV = "TREADLE_WORKER_SERVER"


class _Hide:
    """``import pandas`` fails while installed (a meta path finder: ``find_spec`` is all
    the import system asks of one; ``importlib.abc`` costs ~15 ms to import)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is hidden while pyarrow.dataset imports", name=name)
        return None


class _Tell:
    """The first ``import pandas`` runs as usual, then tells pyarrow (and this finder goes).
    A spec that is only looked at (Lance's ``find_spec("pandas")``) imports nothing."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pandas":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", None)
            spec = spec and spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            run(module)
            _tell_pyarrow()

        loader.exec_module = exec_module  # this spec's own loader: pandas, found just now
        return spec


def _tell_pyarrow() -> None:
    try:
        import pyarrow.lib

        pyarrow.lib._pandas_api.pd  # noqa: B018  (a strict use: pyarrow imports pandas again)
    except Exception:  # pyarrow re-checks on its next strict use anyway
        pass


def in_worker_server() -> bool:
    """Whether this process is the worker processes' server (at its start)."""
    return os.environ.get(SERVER_ENV) == "1"


def import_arrow_without_pandas() -> None:
    """Import ``pyarrow.dataset`` with pandas hidden, unless pandas or it is imported
    already; the first later ``import pandas`` tells pyarrow that pandas is there."""
    if "pandas" in sys.modules or "pyarrow._dataset" in sys.modules:
        return
    hide = _Hide()
    sys.meta_path.insert(0, hide)
    try:
        import pyarrow.dataset  # noqa: F401
    finally:
        sys.meta_path.remove(hide)
    sys.meta_path.insert(0, _Tell())

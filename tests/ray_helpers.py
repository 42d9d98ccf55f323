"""A local Ray cluster for a test, in a temporary folder of its own: Ray's default,
``/tmp/ray``, kept a session folder (logs, sockets, spilled objects) per start after the
run."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def local_ray() -> Iterator[Any]:
    """``ray.init()`` of a 2-CPU local cluster (no dashboard), ``ray.shutdown()`` after,
    then its folder removed. The folder is short (``/tmp/rayXXXXXXXX``): Ray's unix
    sockets live under it, and a socket's path may hold at most 107 bytes."""
    import ray

    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=folder)
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

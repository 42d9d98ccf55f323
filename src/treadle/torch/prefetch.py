"""One background thread that reads steps ahead into a bounded queue (``workers=0``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any


def prefetch_steps(
    read: Callable[[int], Any],
    start: int,
    stop: int | None,
    depth: int,
    close: Callable[[], None],
) -> Iterator[Any]:
    """``read(start), read(start + 1), ...`` up to ``stop`` (None: forever), read up to
    ``depth`` steps ahead on a thread; a failure is raised here, in order; ``close()`` runs
    when the consumer stops (at the end, on error, or when the generator is closed)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop_flag = threading.Event()

    def produce() -> None:
        step = start
        try:
            while not stop_flag.is_set() and (stop is None or step < stop):
                item = ("ok", read(step))
                while not stop_flag.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1
            q.put(("end", None))
        except BaseException as e:  # hand every failure to the consumer
            q.put(("error", e))

    t = threading.Thread(target=produce, name="treadle-prefetch", daemon=True)
    t.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop_flag.set()
        t.join(timeout=30)
        close()

"""An import's progress: a tqdm bar on a terminal, else lines a log file can keep.

With stderr a terminal, the bar (tqdm, carriage returns). Otherwise (a log file, a CI
job, a pipe) one line per phase on stderr: when the import starts, at most every
:attr:`Progress.LINE_EVERY_S` seconds while it runs, and when it ends (done or stopped).
``progress=False`` (``--quiet``, ``--no-progress``) silences both; ``progress=True``
forces the bar.
"""

from __future__ import annotations

import sys
import threading
import time


def _amount(n: int, unit: str) -> str:
    if unit != "B":
        return f"{n} {unit}" + ("" if n == 1 else "s")
    size = float(n)
    for prefix in ("", "k", "M", "G", "T"):
        if size < 1000 or prefix == "T":
            return f"{size:.0f} B" if not prefix else f"{size:.1f} {prefix}B"
        size /= 1000
    raise AssertionError("unreachable")


class Progress:
    """A tqdm bar on a terminal; else progress lines on stderr (the module's docstring)."""

    LINE_EVERY_S = 10.0

    def __init__(self, total: int | None, desc: str, unit: str, enabled: bool | None):
        from tqdm import tqdm

        self._bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=unit == "B",  # bytes as kB/MB/GB
            disable=(enabled is False) or None,
            leave=False,
        )
        self._lock = threading.Lock()
        self._lines = enabled is None and self._bar.disable  # stderr is not a terminal
        self._desc, self._unit, self._total, self._done = desc, unit, total, 0
        self._t0 = self._last = time.monotonic()
        if self._lines:
            of = f" ({_amount(total, unit)} to read)" if total is not None else ""
            self._line(f"started{of}")

    def _line(self, what: str) -> None:
        print(f"{self._desc}: {what}", file=sys.stderr, flush=True)

    def _so_far(self, total: bool = True) -> str:
        took = f"in {time.monotonic() - self._t0:.1f} s"
        if not total or self._total is None:
            return f"{_amount(self._done, self._unit)} {took}"
        if self._unit == "B":
            return f"{_amount(self._done, 'B')}/{_amount(self._total, 'B')} {took}"
        return f"{self._done}/{_amount(self._total, self._unit)} {took}"

    def update(self, n: int) -> None:
        with self._lock:
            self._bar.update(n)
            self._done += n
            now = time.monotonic()
            if self._lines and now - self._last >= self.LINE_EVERY_S:
                self._last = now
                self._line(self._so_far())

    def close(self, ok: bool = True) -> None:
        """End the bar; the last line says whether the import finished or stopped."""
        self._bar.close()
        if self._lines:
            # done: what was read, no total (for bytes a file-size estimate, which it may not
            # match exactly)
            done = "done: " + self._so_far(total=False)
            self._line(done if ok else "stopped (nothing committed) after " + self._so_far())

"""Run a test's script in a fresh Python process (what an exit, a fork or an import does
is only seen from outside the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_script(
    folder: Path,
    text: str,
    *args: str,
    name: str = "script.py",
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write ``text`` (dedented) to ``folder/name`` and run it with this Python and
    ``args``; stdout and stderr captured as text. Fails the test, with the tail of its
    stderr, unless it exits 0."""
    script = Path(folder) / name
    script.write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc

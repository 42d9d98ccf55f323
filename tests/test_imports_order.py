"""Every module of the package imports first, on its own (an import cycle fails here)."""

from __future__ import annotations

import subprocess
import sys

_CHECK = r"""
import importlib, pkgutil, sys
import treadle
names = sorted(m.name for m in pkgutil.walk_packages(treadle.__path__, "treadle."))
names = [n for n in names if not n.endswith(".__main__")]  # running them is their job
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "treadle" or m.startswith("treadle.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - reported below
        failed.append(f"{name}: {type(e).__name__}: {e}")
print(len(names))
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_first():
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[0]) > 40  # the walk found the package's modules

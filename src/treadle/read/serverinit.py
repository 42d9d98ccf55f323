"""Imported only by the forkserver that worker processes fork from (its preload).

The server imports what every worker needs (Lance, PyAV, treadle's read path; no torch) once,
opens no table and starts no Lance runtime, and then forks: that is the use Lance's
"not fork-safe" warning (raised before every fork of a process that imported Lance) asks
for, so it is silenced here, in this process only.
"""

import warnings

import treadle.read.worker  # noqa: F401  (what the workers run)

warnings.filterwarnings("ignore", message="lance is not fork-safe")

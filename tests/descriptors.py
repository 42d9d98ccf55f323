"""Whether a file descriptor number is open: the tests that check nothing closes a number it
no longer owns open fresh pipes after the first close, then ask this of each."""

from __future__ import annotations

import os


def is_open(fd: int) -> bool:
    """Whether ``fd`` names an open file of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True

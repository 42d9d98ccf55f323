"""The HTTP requests obstore sends for byte ranges of one object (``Store.get_ranges``).

obstore (object_store) merges the ranges of one ``get_ranges`` call whose gap is at most
:data:`OBSTORE_COALESCE` bytes into one request, which then carries the gap's bytes too. The
chunk cache counts what it fetched this way, and ``treadle simulate`` models it, so both
count the requests and bytes the object store sees.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["OBSTORE_COALESCE", "coalesced"]

OBSTORE_COALESCE = 1 << 20
"""object_store's ``OBJECT_STORE_COALESCE_DEFAULT``: ranges this close are one request."""


def coalesced(ranges: Sequence[tuple[int, int]], gap: int = OBSTORE_COALESCE
              ) -> list[tuple[int, int]]:  # fmt: skip
    """The requests obstore sends for byte ranges ``[start, end)`` of one object fetched in
    one ``get_ranges`` call: sorted, and merged where the gap to the previous one is at most
    ``gap`` bytes (the merged request spans the gap too)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out

"""Tables: pinned snapshots (reads by moment id) and the staging of new rows.

A table knows no branches: ``TableRef`` (a table by name on a branch) and
``Transaction`` (the commit) are the catalog's, :mod:`treadle.catalog`.
"""

from treadle.table.table import EpisodeIndex, ScanRequest, Table

__all__ = ["EpisodeIndex", "ScanRequest", "Table"]

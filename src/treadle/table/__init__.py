"""Tables: references, pinned snapshots, writes."""

from treadle.table.table import EpisodeIndex, ScanRequest, Table, TableRef
from treadle.table.write import Transaction

__all__ = ["EpisodeIndex", "ScanRequest", "Table", "TableRef", "Transaction"]

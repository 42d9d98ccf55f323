"""Tables: references, pinned snapshots, writes.

``Transaction`` (``treadle.table.write``) is not re-exported here: it commits through the
catalog, and importing it from this package's ``__init__`` would make every import of a
table module (``tensors``, ``episodes``, which the plan reads) pull in the catalog.
"""

from treadle.table.table import EpisodeIndex, ScanRequest, Table, TableRef

__all__ = ["EpisodeIndex", "ScanRequest", "Table", "TableRef"]

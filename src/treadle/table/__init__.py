"""treadle.table."""

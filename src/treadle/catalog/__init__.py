"""treadle.catalog."""

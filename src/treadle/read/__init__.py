"""treadle.read."""

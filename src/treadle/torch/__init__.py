"""treadle.torch."""

"""treadle.video."""

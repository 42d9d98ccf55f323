"""treadle.gpu."""

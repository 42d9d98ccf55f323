"""treadle.importers."""

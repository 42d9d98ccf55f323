"""Statistics: of a table version (``table_stats.py``), of a run (``plan_stats.py``),
their moments, sketches and pooling (``moments.py``, ``pooled.py``), ``ColumnStats``
(``column_stats.py``) and the stored run statistics (``run_cache.py``)."""

"""Planning: recipes, run records, weighted draws. Pure: no I/O."""

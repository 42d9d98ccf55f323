"""Delivery: reading planned batches (fetch -> decode -> assemble)."""

"""The source object of the chunk store's crash and disk tests (local store, 8 chunks)."""

from __future__ import annotations

import numpy as np

from treadle.storage import Store

CHUNK = 4096


def make_source(tmp_path_factory) -> tuple[str, bytes]:
    """(root, bytes) of ``data/o.lance``: 8 chunks of random non-zero bytes."""
    root = tmp_path_factory.mktemp("src")
    store = Store.open(str(root), create=True)
    blob = np.random.default_rng(0).integers(1, 256, 8 * CHUNK, dtype=np.uint8).tobytes()
    store.put("data/o.lance", blob)
    return str(root), blob

"""Per-sample seeds for augmentations: a pure function of (run seed, global position).

``sample_seeds(seed, positions)[i] = mix64(derive_key("augm", seed) + positions[i] * GOLDEN)``
(``uint64``). A sample keeps its seed at any rank count and after any restart, because
its global position does; a transform that draws only from its seed replays exactly.
"""

from __future__ import annotations

import numpy as np

from treadle.plan.permute import derive_key, epoch_keys

AUGMENT_DOMAIN = 0x6175676D  # "augm"


def sample_seeds(seed: int, positions: np.ndarray) -> np.ndarray:
    """``uint64 [n]`` seeds of the samples at global ``positions`` of a run with ``seed``."""
    base = np.uint64(derive_key(AUGMENT_DOMAIN, int(seed)))
    return epoch_keys(np.full(len(positions), base, np.uint64), np.asarray(positions, np.int64))

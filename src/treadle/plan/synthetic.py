"""Stand-in tables for ``treadle simulate --synthetic oxe``: a mix the size of Open
X-Embodiment without its bytes.

``oxe_tables()`` is 26 tables whose moments follow a log-uniform spread of sizes (seeded, so
every run of the simulator sees the same mix): 60 million moments and about 9 TB in all
(150 KB a moment: two compressed camera frames and the low-dimensional state, as OXE's RLDS
holds them), episodes of 50 to 500 moments, objects (Lance data files) of
``rows_per_object`` rows. Component weights are proportional to the moments (``weigh_by`` the
size of each table). These are stand-ins the planner accepts as pinned tables: nothing is read.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa

OXE_TABLES = 26
OXE_MOMENTS = 60_000_000
OXE_BYTES = 9 * 10**12


class StandInTable:
    """The attributes of a pinned table that planning and the simulator read."""

    def __init__(self, name: str, lengths: np.ndarray, bytes_per_row: int, rows_per_object: int):
        self.name = name
        self.version = 1
        self.commit_id = "0" * 64
        self.project = SimpleNamespace(name="synthetic")
        self._lengths = np.asarray(lengths, np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self.num_moments = int(self._lengths.sum())
        self.schema = pa.schema([("action", pa.float32())])
        self.video_columns: list[str] = []
        self.bytes_per_row = int(bytes_per_row)
        self.rows_per_object = int(rows_per_object)

    def purged(self, fresh: bool = False) -> dict[str, Exception]:
        return {}  # a stand-in was never purged

    def episodes(self) -> SimpleNamespace:
        return SimpleNamespace(
            names=[f"episode_{i:06d}" for i in range(len(self._lengths))],
            starts=self._starts,
            lengths=self._lengths,
        )


def oxe_tables(scale: float = 1.0, seed: int = 0) -> list[StandInTable]:
    """The 26 stand-in tables (``scale`` multiplies every table's moments)."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(1.0), np.log(200.0), OXE_TABLES))
    moments = np.maximum((sizes / sizes.sum() * OXE_MOMENTS * scale).astype(np.int64), 500)
    per_row = OXE_BYTES // OXE_MOMENTS
    rows_per_object = (512 << 20) // per_row  # 512 MiB data files
    out = []
    for i, n in enumerate(moments.tolist()):
        lengths = rng.integers(50, 501, n // 50 + 1)
        lengths = lengths[np.cumsum(lengths) <= n]
        lengths = np.append(lengths, n - lengths.sum()) if n > lengths.sum() else lengths
        out.append(StandInTable(f"oxe_{i:02d}", lengths, per_row, rows_per_object))
    return out

"""The suite writes no cache of the user's: Hugging Face's caches are a session folder's
(tests/conftest.py), removed when the session ends."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def test_hugging_face_caches_are_the_sessions(tmp_path):
    """LeRobotDataset reads its parquet files through ``datasets``, whose builder cache was
    ``~/.cache/huggingface/datasets`` (a run of the LeRobot tests left it there)."""
    import datasets
    from lerobot.utils.constants import HF_LEROBOT_HOME

    home = Path(os.environ["HF_HOME"])
    assert home.name.startswith("treadle-tests-hf-") and home.parent == Path(tempfile.gettempdir())
    assert Path(datasets.config.HF_DATASETS_CACHE) == home / "datasets"
    assert HF_LEROBOT_HOME == home / "lerobot"
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "t.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert ds["x"] == [1, 2, 3]
    assert any((home / "datasets").rglob("*.arrow"))  # the builder's cache: here

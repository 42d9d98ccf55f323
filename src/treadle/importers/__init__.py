"""Importers: WebDataset, MosaicML Streaming (MDS), LeRobot and Hugging Face datasets -> tables.

Each importer is a thin mapping of a foreign format onto ``TableRef.append`` /
``append_episode`` inside one ``branch.transaction(...)``: one commit, the branch moves
once. ``td.importers.webdataset(...)``, ``.mds(...)``, ``.lerobot(...)``, ``.hf(...)``.
"""

from treadle.importers._common import ImportResult, UnsafeInput, UnsupportedFormat
from treadle.importers.webdataset import import_webdataset as webdataset

__all__ = ["ImportResult", "UnsafeInput", "UnsupportedFormat", "webdataset"]
